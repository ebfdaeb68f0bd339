"""The exact posterior over hypotheses (no fault, not the config, one culprit, a pair that fails
only together) and the per-run pass probability q of a bad config, from the observations."""
from __future__ import annotations

import math
from typing import Iterable, NamedTuple, Sequence

from envbisect.search.types import Prior



NONE, NOTHING, SINGLE, PAIR = range(4)  # not the config, no fault, one culprit, a pair that fails only together


class HypClass(NamedTuple):
    """Hypotheses that differ only by swapping units within atoms: one likelihood, `mult` members."""

    kind: int  # NONE | NOTHING | SINGLE | PAIR
    a: int  # atom of the (first) culprit, -1 when none
    b: int  # atom of the pair's second unit, -1 when none
    mult: float  # unit-level hypotheses in the class
    q_mass: list[float]  # posterior mass per q of the prior's grid
    mass: float  # sum of q_mass


def bits(mask: int) -> Iterable[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class Belief:
    """Exact posterior over (hypothesis, q) for one frame, computed from scratch.

    A frame has accepted terms ``terms`` (culprits found earlier, part of every
    hypothesis) and looks for at most one more term among ``frame_units``: none,
    one unit, or a pair that fails only together.  Frame 0 (no accepted terms)
    also has "not the config" (every config bad) and "no fault".

    Units that were in exactly the same observed configs form an *atom*;
    hypotheses that differ only by swapping units within atoms have the same
    likelihood and are handled as one class with a multiplicity.  That keeps the
    cost at O(atoms^2 x observations) while staying exact.
    """

    def __init__(
        self,
        *,
        frame_units: Sequence[int],
        terms: Sequence[int],
        obs: Sequence[tuple[int, int, int]],  # (config, passes, failures)
        prior: Prior,
        same: Sequence[tuple[int, int]] = (),  # (e, p): e never runs without p, so {e, p} is {e}
    ) -> None:
        qw = [w for _, w in prior.q]
        tot = sum(qw)
        self.qs = [q for q, _ in prior.q]
        self.pq = [w / tot for w in qw]
        self.terms = list(terms)
        self.atoms = _atoms(frame_units, obs)  # (signature, mask, size, members)
        atom_of = {u: i for i, (_s, _m, _z, members) in enumerate(self.atoms) for u in members}
        self.same = {frozenset(pq) for pq in same if pq[0] in atom_of and pq[1] in atom_of}
        dropped: dict[tuple[int, int], int] = {}
        for pq in self.same:
            ia, ib = sorted(atom_of[u] for u in pq)
            dropped[(ia, ib)] = dropped.get((ia, ib), 0) + 1
        self.classes: list[HypClass] = []
        self._add_classes(_Likelihood(obs, self.terms, self.qs, self.pq), prior, len(frame_units), dropped)
        self.z = sum(c.mass for c in self.classes)

    def _add_classes(self, lik: "_Likelihood", prior: Prior, v: int, dropped: dict[tuple[int, int], int]) -> None:
        """One class per (kind, atom, atom), weighted by the prior and the likelihood of the observations."""

        def add(kind: int, a: int, b: int, mult: float, each: float, ext_bad: int) -> None:
            if mult <= 0 or each <= 0:
                return
            w = lik.weights(lik.ebad | ext_bad)
            if w is None:
                return
            scale = mult * each
            qv = [scale * x for x in w]
            mass = sum(qv)
            if mass > 0:
                self.classes.append(HypClass(kind, a, b, mult, qv, mass))

        if not self.terms:
            p_nothing, p_single, p_pair = prior.no_fault, prior.single, prior.interaction
            add(NONE, -1, -1, 1, prior.not_config, (1 << lik.nobs) - 1)
        else:  # one more culprit, or none
            p_nothing, p_single = prior.single, prior.multiple
            inter = prior.interaction if prior.later_interaction is None else prior.later_interaction
            p_pair = prior.multiple * inter / prior.single
        add(NOTHING, -1, -1, 1, p_nothing, 0)
        if v:
            for ai, (sig, _, size, _) in enumerate(self.atoms):
                add(SINGLE, ai, -1, size, p_single / v, sig)
        pairs = v * (v - 1) // 2
        if pairs:
            each = p_pair / pairs
            na = len(self.atoms)
            for ai in range(na):
                sa, _, za, _ = self.atoms[ai]
                add(PAIR, ai, ai, za * (za - 1) / 2 - dropped.get((ai, ai), 0), each, sa)
                for bi in range(ai + 1, na):
                    sb, _, zb, _ = self.atoms[bi]
                    add(PAIR, ai, bi, za * zb - dropped.get((ai, bi), 0), each, sa & sb)

    # -- predictions ------------------------------------------------------------

    def _frac(self, cls: tuple, mask: int) -> float:
        """Fraction of the class's unit-level hypotheses under which ``mask`` is bad."""
        kind, a, b = cls.kind, cls.a, cls.b
        if kind == NONE or any(t & mask == t for t in self.terms):
            return 1.0
        if kind == NOTHING:
            return 0.0
        _, am, za, _ = self.atoms[a]
        ca = (mask & am).bit_count()
        if kind == SINGLE:
            return ca / za
        if a == b:
            return ca * (ca - 1) / (za * (za - 1))
        _, bm, zb, _ = self.atoms[b]
        return (ca / za) * ((mask & bm).bit_count() / zb)

    def p_bad(self, mask: int) -> float:
        if self.z <= 0:
            return 0.5
        return sum(c.mass * self._frac(c, mask) for c in self.classes) / self.z

    def q_given_bad(self, mask: int) -> list[float]:
        acc = [0.0] * len(self.qs)
        for c in self.classes:
            f = self._frac(c, mask)
            if f:
                for j, x in enumerate(c.q_mass):
                    acc[j] += f * x
        s = sum(acc)
        return [x / s for x in acc] if s > 0 else list(self.pq)

    def q_belief(self) -> list[float]:
        acc = [0.0] * len(self.qs)
        for c in self.classes:
            for j, x in enumerate(c.q_mass):
                acc[j] += x
        s = sum(acc)
        return [x / s for x in acc] if s > 0 else list(self.pq)

    def eig(self, mask: int, runs: int) -> float:
        """Expected information gain (nats) about the unit-level hypothesis from one
        trial of ``mask`` with at most ``runs`` probe runs (outcome: a failure, or all pass)."""
        if self.z <= 0:
            return 0.0
        parts0: list[tuple[float, float]] = []
        fail: list[tuple[float, float]] = []
        pas: list[tuple[float, float]] = []
        for c in self.classes:
            mult, qv, mass = c.mult, c.q_mass, c.mass
            parts0.append((mass, mult))
            f = self._frac(c, mask)
            if f > 0:
                phi = sum(x * (1.0 - q**runs) for q, x in zip(self.qs, qv)) / mass
                fail.append((mass * f * phi, mult * f))
                pas.append((mass * f * (1.0 - phi), mult * f))
            if f < 1:
                pas.append((mass * (1.0 - f), mult * (1.0 - f)))

        def ent(parts: list[tuple[float, float]]) -> tuple[float, float]:
            tot = sum(m for m, _ in parts)
            h = 0.0
            if tot > 0:
                for m, k in parts:
                    if m > 0 and k > 0:
                        p = m / tot
                        h -= p * math.log(p / k)
            return h, tot

        h0, _ = ent(parts0)
        hf, tf = ent(fail)
        hp, tp = ent(pas)
        return max(0.0, h0 - (tf / self.z) * hf - (tp / self.z) * hp)

    # -- hypotheses -------------------------------------------------------------

    def ranked(self) -> list[tuple[float, tuple]]:
        """Classes ranked by the probability of one of their unit-level hypotheses."""
        if self.z <= 0:
            return []
        out = [(c.mass / self.z / c.mult, c) for c in self.classes]
        out.sort(key=lambda t: -t[0])
        return out

    def p_nothing(self) -> float:
        if self.z <= 0:
            return 0.0
        return sum(c.mass for c in self.classes if c.kind == NOTHING) / self.z

    def term(self, cls: tuple) -> int:
        """The new term (mask) of the first unit-level hypothesis of a class (0 if none)."""
        kind, a, b = cls.kind, cls.a, cls.b
        if kind in (NONE, NOTHING):
            return 0
        ma = self.atoms[a][3]
        if kind == SINGLE:
            return 1 << ma[0]
        if self.same:
            return self.expand(cls, 1)[0]
        y = ma[1] if a == b else self.atoms[b][3][0]
        return (1 << ma[0]) | (1 << y)

    def expand(self, cls: tuple, limit: int) -> list[int]:
        """Up to ``limit`` new terms of the unit-level hypotheses of a class."""
        kind, a, b = cls.kind, cls.a, cls.b
        if kind in (NONE, NOTHING):
            return [0]
        ma = self.atoms[a][3]
        if kind == SINGLE:
            return [1 << u for u in ma[:limit]]
        out: list[int] = []
        mb = self.atoms[b][3]
        for i, x in enumerate(ma):
            for y in ma[i + 1 :] if a == b else mb:
                if len(out) >= limit:
                    return out
                if self.same and frozenset((x, y)) in self.same:
                    continue
                out.append((1 << x) | (1 << y))
        return out

    def marginals(self) -> dict[int, float]:
        out: dict[int, float] = {}
        if self.z <= 0:
            return out
        for kind, a, b, _, _, mass in self.classes:
            if kind in (NONE, NOTHING):
                continue
            p = mass / self.z
            za = self.atoms[a][2]
            if kind == SINGLE:
                share = {a: p / za}
            elif a == b:
                share = {a: 2 * p / za}
            else:
                share = {a: p / za, b: p / self.atoms[b][2]}
            for ai, x in share.items():
                for u in self.atoms[ai][3]:
                    out[u] = out.get(u, 0.0) + x
        return out

    def p_has_term(self, term: int) -> float:
        """Posterior probability that ``term`` is the frame's new term."""
        if self.z <= 0:
            return 0.0
        tot = 0.0
        units = list(bits(term))
        for kind, a, b, _, _, mass in self.classes:
            if kind not in (SINGLE, PAIR):
                continue
            ma, za = self.atoms[a][1], self.atoms[a][2]
            if kind == SINGLE and len(units) == 1 and term & ma:
                tot += mass / za
            elif kind == PAIR and len(units) == 2:
                x, y = (1 << units[0]), (1 << units[1])
                if a == b:
                    if x & ma and y & ma:
                        tot += mass / (za * (za - 1) / 2)
                else:
                    mb, zb = self.atoms[b][1], self.atoms[b][2]
                    if (x & ma and y & mb) or (y & ma and x & mb):
                        tot += mass / (za * zb)
        return tot / self.z


def _atoms(frame_units: Sequence[int], obs: Sequence[tuple[int, int, int]]) -> list[tuple[int, int, int, list[int]]]:
    """Units grouped by the observations that held them: (signature, mask, size, members) per atom."""
    groups: dict[int, list[int]] = {}
    for u in frame_units:
        bit = 1 << u
        sig = 0
        for i, (c, _, _) in enumerate(obs):
            if c & bit:
                sig |= 1 << i
        groups.setdefault(sig, []).append(u)
    out = []
    for sig, members in groups.items():
        m = 0
        for u in members:
            m |= 1 << u
        out.append((sig, m, len(members), members))
    return out


class _Likelihood:
    """P(observations | the configs in ``bad`` are bad, q) for each q of the grid, cached per ``bad``
    (a bit vector over the observations). ``ebad``: the observations bad under the accepted terms."""

    def __init__(self, obs: Sequence[tuple[int, int, int]], terms: Sequence[int], qs: list[float],
                 pq: list[float]) -> None:
        self.nobs = len(obs)
        self.ks = [k for _, k, _ in obs]
        self.fs = [f for _, _, f in obs]
        self.qs, self.pq = qs, pq
        self.failed_vec = 0
        self.ebad = 0
        for i, (c, _, f) in enumerate(obs):
            if f:
                self.failed_vec |= 1 << i
            if any(t & c == t for t in terms):
                self.ebad |= 1 << i
        self.cache: dict[int, list[float] | None] = {}

    def weights(self, bad: int) -> list[float] | None:
        if bad in self.cache:
            return self.cache[bad]
        if self.failed_vec & ~bad:  # a good config never fails
            self.cache[bad] = None
            return None
        s = f = 0
        for i in bits(bad):
            s += self.ks[i]
            f += self.fs[i]
        w = [p * (q**s) * ((1.0 - q) ** f) for q, p in zip(self.qs, self.pq)]
        self.cache[bad] = w
        return w
