"""A bisection over a fleet of identical replicas: up to R trials at once, one per replica.

Each replica is a deployment of its own (its own playbook: hosts, services, files), with the same
changes since the baseline: the same delta ids. Every replica is locked and journaled on its own
(its own HostEditor, journal and lock), so an interrupted fleet run is undone replica by replica
with `envbisect restore`. One search decides for the fleet; each round asks it for as many
configurations as there are healthy replicas (search/rounds.py) and runs them side by side.

What a replica may and may not do to the verdict:

- **Premises on every replica.** The first round starts the baseline on every replica. A replica
  whose baseline fails while another's passes is excluded from the run, with its evidence (a
  broken replica is not a broken config). When every baseline fails, that is the fleet's
  observation, and the search goes on with it (towards not-config).
- **Unhealthy before its trial: left out of the round, never blamed.** Before each round every
  replica's services must answer their health URL; one that does not sits the round out.
- A replica whose trial was unresolved (SSH lost, a start command that could not run) is left
  out of the following rounds; its trial is evidence of nothing.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from envbisect.errors import ProbeBroken, UsageError
from envbisect.hosts.journal import HostEditor, describe_conflict
from envbisect.hosts.restart import co_restart
from envbisect.hosts.urls import health_ok
from envbisect.outcome import Cause, Leave, Outcome, VerdictKind
from envbisect.runs.plan import (BisectOptions, judge_apart, linked_to_refine, make_units, observation, parse_policy,
                                 select_deltas)
from envbisect.runs.result import BisectResult
from envbisect.state.configuration import check_applicable
from envbisect.runs.symptom import SymptomWatch
from envbisect.runs.signals import install_signal_handlers, shield_signals
from envbisect.runs.baseline_proof import baseline_trial, build_proof, not_reproduced, restart_facts, unresolved_causes
from envbisect.runs.deployment import Deployment
from envbisect.search import TrialKind, Verdict
from envbisect.search.hints import Hints
from envbisect.search.rounds import observe_round, plan_round
from envbisect.state import rundir
from envbisect.state.configuration import touched
from envbisect.state.rundir import RunDir, Runs
from envbisect.state.sourced import verdict_notes
from envbisect.state.store import Store
from envbisect.trials.probe_check import broken_line, refuse_broken_probe
from envbisect.trials.runner import Trial, TrialRunner


@dataclass
class Replica:
    name: str
    dep: Deployment
    editor: HostEditor | None = None
    runner: TrialRunner | None = None
    excluded: str | None = None  # why it takes no more part in the run


@dataclass(frozen=True)
class FleetResult:
    result: BisectResult
    rounds: int
    replicas: tuple[str, ...]
    excluded: Mapping[str, str]  # replica -> why
    trial_replica: Mapping[int, str]  # trial n -> the replica it ran on
    wall_s: float

    def to_json(self) -> dict[str, Any]:
        doc = self.result.to_json()
        for t in doc["trials"]:
            t["replica"] = self.trial_replica.get(t["n"])
        doc["fleet"] = {"replicas": list(self.replicas), "rounds": self.rounds, "excluded": dict(self.excluded),
                        "wall_s": round(self.wall_s, 1)}
        return doc


class FleetRun:
    def __init__(self, replicas: Sequence[tuple[str, Deployment]], store: Store, opts: BisectOptions, *,
                 on_event: Callable[[str, dict], None] | None = None, break_lock: bool = False):
        if len(replicas) < 1:
            raise UsageError("a fleet needs at least one replica")
        names = [n for n, _ in replicas]
        if len(set(names)) != len(names):
            raise UsageError(f"replica names must differ: {', '.join(names)}")
        deployments = {d.playbook.name for _, d in replicas}
        if len(deployments) != len(replicas):
            raise UsageError("each replica's playbook needs its own [deployment] name (its lock and journal are "
                             "its own)")
        self.replicas = [Replica(n, d) for n, d in replicas]
        self.store, self.opts = store, opts
        self.break_lock = break_lock
        self._listener = on_event or (lambda _k, _d: None)
        self.trials: list[Trial] = []
        self.trial_replica: dict[int, str] = {}
        # how the current configuration fails; every later failure is judged against it (runs/symptom.py)
        self.watch: SymptomWatch | None = None
        self.run_id = ""
        self.run_dir = Path()

    def on_event(self, kind: str, data: dict) -> None:
        self._listener(kind, data)

    def _probe(self, r: Replica):  # noqa: ANN202 - a Probe
        probes = r.dep.playbook.probes
        name = self.opts.probe or next(iter(probes), None)
        if name is None or name not in probes:
            raise UsageError(f"replica {r.name}: no probe {name!r} in {r.dep.playbook.path}")
        return probes[name]

    @property
    def declared_links(self) -> tuple[str, ...]:
        """--link and the first replica's [bisect] link (replicas are identical deployments)."""
        return tuple(dict.fromkeys([*self.opts.link, *self.replicas[0].dep.playbook.link_keys]))

    # --- the run -------------------------------------------------------------------------------
    def start(self, *, since: str | None = None, against: str | None = None) -> FleetResult:
        t0 = time.monotonic()
        probes = {r.name: self._probe(r) for r in self.replicas}
        for r in self.replicas:  # as BisectRun.refuse_unrestored: a half-applied replica is not diffed
            HostEditor(r.dep.playbook, r.dep.transports, self.store.runs_dir / "-", "", heartbeat_s=0,
                       runs_root=self.store.runs_dir).lock(break_lock=self.break_lock, dry=True)
        diffs = {r.name: r.dep.diff(since=since, against=against) for r in self.replicas}
        chosen = {n: select_deltas(d, self.opts.only, self.opts.exclude) for n, d in diffs.items()}
        ids = {n: sorted(d.id for d in ds) for n, ds in chosen.items()}
        first = self.replicas[0].name
        for n, got in ids.items():
            if got != ids[first]:
                only_here = sorted(set(got) - set(ids[first]))
                only_there = sorted(set(ids[first]) - set(got))
                raise UsageError(f"replicas {first} and {n} did not change the same way (only in {n}: "
                                 f"{', '.join(only_here) or '-'}; only in {first}: {', '.join(only_there) or '-'}): "
                                 "bisect them one by one")
        for ds in chosen.values():
            check_applicable(ds)
        for r in self.replicas:  # before any edit or restart (trials/probe_check.py)
            refuse_broken_probe(probes[r.name], r.dep.playbook, r.dep.transports)
        units, notes = make_units(chosen[first], self.declared_links, self.opts.auto_link)
        self.hints = Hints.of(units, self.declared_links)  # as BisectRun's, without asking the engines
        self.run_id = time.strftime("%Y%m%dT%H%M%S") + "-fleet-" + uuid.uuid4().hex[:6]
        rd = Runs(self.store.runs_dir).new(self.run_id)
        self.run_dir = rd.path
        rd.write(rundir.RUN, json.dumps({
            "format": 1, "kind": "fleet", "run_id": self.run_id, "created_at": time.time(),
            "deployment": "fleet:" + "+".join(r.dep.playbook.name for r in self.replicas),
            "replicas": {r.name: r.dep.playbook.name for r in self.replicas},
            "probe": probes[first].name, "units": {u: list(v) for u, v in units.items()},
            "search": {"hints": self.hints.to_json()},
            "diff": diffs[first].to_json(self.replicas[0].dep.masker)}).encode())
        stop = install_signal_handlers()  # SIGTERM ends the run as Ctrl-C does: through the restore below
        try:
            for r in self.replicas:
                r.editor = HostEditor(r.dep.playbook, r.dep.transports, self.run_dir / r.name, self.run_id,
                                      runs_root=self.store.runs_dir)
                for note in r.editor.lock(break_lock=self.break_lock):
                    self.on_event("warning", {"message": f"{r.name}: {note}"})
                files, repos = touched(chosen[r.name])
                original = r.editor.begin(files, repos)
                r.runner = TrialRunner(r.dep.playbook, r.dep.transports, r.editor, original, chosen[r.name],
                                       dict(diffs[r.name].contents), probes[r.name], units,
                                       on_step=lambda m, n=r.name: self.on_event("step", {"message": f"[{n}] {m}"}),
                                       evidence_dir=self.run_dir / r.name / rundir.EVIDENCE)
            verdict, rounds, refined = self._loop(units, notes)
        except BaseException as exc:
            self.on_event("interrupted", {"error": str(exc) or type(exc).__name__, "run": self.run_id})
            with shield_signals(lambda m: self.on_event("warning", {"message": m})):
                self._restore_all(notes=None)
            raise
        finally:
            stop()
        with shield_signals(lambda m: self.on_event("warning", {"message": m})):
            self._restore_all(notes)
        proof = None
        if verdict.kind == VerdictKind.NOT_CONFIG:  # only with proof that the baseline trial was the baseline
            r0 = self.replicas[0]
            mine = [t for t in self.trials if self.trial_replica.get(t.n) == first]
            proof = build_proof(seen=[d.id for d in diffs[first].deltas], deltas=chosen[first],
                                original=r0.runner.original, contents=diffs[first].contents,  # type: ignore
                                trials=mine, playbook=r0.dep.playbook, probe=probes[first],
                                diff_notes=diffs[first].notes,
                                conflicts=[c for r in self.replicas if r.editor for c in r.editor.conflicts],
                                restart_facts=restart_facts(baseline_trial(mine)))
            if not proof.reproduced:
                verdict = not_reproduced(verdict, proof)
        verdict = unresolved_causes(verdict, self.trials)
        if verdict.kind == VerdictKind.NOT_CONFIG:  # what it could not see, as a single deployment's verdict says
            notes.extend(n for n in verdict_notes(diffs[first].notes) if n not in notes)
        excluded = {r.name: r.excluded for r in self.replicas if r.excluded}
        result = BisectResult(self.run_id, verdict, tuple(self.trials), Leave.ORIGINAL, units, notes=tuple(notes),
                              symptom=self.watch.to_json() if self.watch else None,
                              refined=refined, baseline_proof=proof)
        fleet = FleetResult(result, rounds, tuple(r.name for r in self.replicas), excluded, dict(self.trial_replica),
                            time.monotonic() - t0)
        RunDir(self.run_dir).write(rundir.VERDICT, self.replicas[0].dep.masker.redact_json(fleet.to_json()))
        return fleet

    def _loop(self, units: Mapping[str, tuple[str, ...]], notes: list[str]) -> tuple[Verdict, int, dict]:
        unit_ids = list(units)
        make_search = parse_policy(self.opts.policy).search
        probe = self.replicas[0].runner.probe  # type: ignore[union-attr]
        search = make_search(unit_ids, confidence=self.opts.confidence, max_trials=self.opts.max_trials,
                             base_probes=probe.repeat, **self.hints.search_options())
        for r in self.replicas:  # a twin's sides, tested apart by the search
            if r.runner is not None:
                r.runner.units = {**r.runner.units, **self.hints.member_units()}
        self.watch = SymptomWatch(unit_ids, enabled=not probe.is_perf)
        # round 1: the baseline on every replica (premise), side by side
        base = self._round([(r, [], "premise: baseline must pass (every replica)", TrialKind.PREMISE_BASELINE,
                             search.pass_runs(), 1) for r in self._healthy(notes)])
        passed = [(r, t) for r, t in base if t.outcome is Outcome.PASS]
        for r, t in base:
            if t.outcome is Outcome.UNRESOLVED:
                r.excluded = f"its baseline trial {t.n} was unresolved: {t.reason}"
            elif passed and t.outcome is not Outcome.PASS:
                r.excluded = (f"its baseline failed (trial {t.n}: {t.reason}) while {passed[0][0].name}'s passed: "
                              "a broken replica, not a broken config")
        for r in self.replicas:
            if r.excluded:
                notes.append(f"replica {r.name} excluded: {r.excluded}")
        observe_round(search, [observation(t) for r, t in base if not r.excluded])
        rounds = 1
        while True:
            active = self._healthy(notes)
            if not active:
                raise UsageError("no replica is healthy enough to run a trial: see the notes; the hosts were restored")
            plan = plan_round(search, len(active))
            if isinstance(plan, Verdict):
                break
            got = self._round([(r, sorted(req.config), req.purpose, req.kind, req.probes, req.stop_after)
                               for r, req in zip(active, plan)])
            rounds += 1
            for r, t in got:
                if t.cause is Cause.SSH_LOST or t.cause is Cause.RESTART_FAILED:
                    r.excluded = f"trial {t.n} was unresolved ({t.reason})"
                    notes.append(f"replica {r.name} left out from now on: {r.excluded}")
            observe_round(search, [observation(t) for _r, t in got])
        plan, split, split_notes = self.hints.conclude(plan, search.evidence)
        notes.extend(split_notes)
        plan, refined, more = self._refine_links(plan, {u: m for u, m in units.items() if u not in split}, search,
                                                 notes)
        refined.update(split)
        rounds += more
        notes.append(f"{rounds} rounds on {len(self.replicas)} replicas ({len(self.trials)} trials, side by side)")
        return plan, rounds, refined

    def _refine_links(self, verdict: Verdict, units: Mapping[str, tuple[str, ...]], search,  # noqa: ANN001
                      notes: list[str]) -> tuple[Verdict, dict[str, tuple[str, ...]], int]:
        """As BisectRun's: a guilty auto-linked unit is tested member by member -- here the members'
        trials run side by side, one per healthy replica. Returns (verdict, refined, rounds)."""
        refined: dict[str, tuple[str, ...]] = {}
        apart: list[str] = []
        rounds = 0
        for test in linked_to_refine(verdict, units, self.declared_links):
            tested: list[tuple[str, Trial]] | None = []
            todo = list(test.keys)
            while todo and tested is not None:
                active = self._healthy(notes)
                if not active:
                    tested = None
                    break
                batch, todo = todo[:len(active)], todo[len(active):]
                for r in active:
                    r.runner.units = {**r.runner.units, **test.member_units}  # type: ignore[union-attr]
                got = self._round([(r, test.config(m), test.purpose(m), TrialKind.REFINE, search.pass_runs(), 1)
                                   for r, m in zip(active, batch)])
                rounds += 1
                for m, (_r, t) in zip(batch, got):
                    if t.outcome is Outcome.UNRESOLVED:
                        tested = None
                        break
                    tested.append((m, t))
            judge_apart(test, tested, refined, apart, notes)
        if apart:
            verdict = dataclasses.replace(verdict, explanation=verdict.explanation
                                          + " Observed, testing auto-linked members apart: " + "; ".join(apart) + ".")
        return verdict, refined, rounds

    def _healthy(self, notes: list[str]) -> list[Replica]:
        """The replicas that take part in the next round: not excluded, and every service answering
        its health URL now (one that does not sits the round out, and is never blamed)."""
        out = []
        for r in self.replicas:
            if r.excluded:
                continue
            bad = []
            for name, s in r.dep.playbook.services.items():
                t = r.dep.transports.get(s.host)
                ok, why = (health_ok(t, s.health, timeout=5.0, insecure=s.insecure) if t is not None
                           else (False, "no connection"))
                if not ok:
                    bad.append(f"{name}: {why}")
            last = next((t for t in reversed(self.trials) if self.trial_replica.get(t.n) == r.name), None)
            # before its first trial, or after a configuration that did not start, a replica may be
            # down because of a configuration: its next trial starts it from scratch anyway
            if bad and last is not None and last.outcome is not Outcome.START_FAILURE:
                notes.append(f"replica {r.name} sat out a round, unhealthy before its trial: {'; '.join(bad)}")
                self.on_event("warning", {"message": f"{r.name} is unhealthy ({'; '.join(bad)}): left out of "
                                                     "this round"})
                continue
            out.append(r)
        return out

    def _round(self, jobs: list[tuple[Replica, list[str], str, TrialKind, int, int]]) -> list[tuple[Replica, Trial]]:
        """Run one trial per replica, side by side (each on its own connections, editor and runner)."""
        numbered = []
        for i, (r, config, purpose, kind, probes, stop_after) in enumerate(jobs):
            n = len(self.trials) + 1 + i
            numbered.append((n, r, config, f"{purpose} [{r.name}]", kind, probes, stop_after))
            self.on_event("trial-start", {"n": n, "purpose": f"{purpose} [{r.name}]", "eta_s": None,
                                          "config": r.runner.delta_ids(config), "units": 0})  # type: ignore[union-attr]

        def run(job):  # noqa: ANN001, ANN202
            n, r, config, purpose, kind, probes, stop_after = job
            return r, r.runner.run(n, config, probes, purpose, stop_after, kind)

        with ThreadPoolExecutor(max_workers=max(1, len(numbered))) as pool:
            got = list(pool.map(run, numbered))
        if self.watch is not None:  # in trial order: the premise teaches the symptom the later ones are judged by
            got = [(r, self.watch.see(t)) for r, t in got]
        for r, t in got:
            self.trials.append(t)
            self.trial_replica[t.n] = r.name
            line = r.dep.masker.redact_json({**t.to_json(), "replica": r.name}, indent=None)
            RunDir(self.run_dir).append_line(rundir.TRIALS, line)
            self.on_event("trial-end", {"trial": t})
        for r, t in got:
            if t.cause is Cause.PROBE_BROKEN:  # no evidence from any replica: stop (start() restores)
                raise ProbeBroken(broken_line(r.runner.probe, f"trial {t.n} [{r.name}]: {t.reason}",  # type: ignore
                                              restored=True))
        return got

    def _restore_all(self, notes: list[str] | None) -> None:
        def restore(r: Replica) -> None:
            if r.editor is None or r.editor.journal is None:
                if r.editor is not None:
                    r.editor.unlock()
                return
            for c in r.editor.restore():
                msg = f"{r.name}: {describe_conflict(c)}"
                self.on_event("warning", {"message": msg})
                if notes is not None:
                    notes.append(msg)
            rs = co_restart(r.dep.playbook, r.dep.transports, guard=r.editor.guard)
            r.editor.finish()
            r.editor.unlock()
            if not rs.ok:
                self.on_event("warning", {"message": f"{r.name}: restored files, but the co-restart failed: "
                                                     f"{rs.message}"})

        self.on_event("step", {"message": "restoring every replica and co-restarting"})
        with ThreadPoolExecutor(max_workers=max(1, len(self.replicas))) as pool:
            errors = [f.exception() for f in [pool.submit(restore, r) for r in self.replicas]]
        for e in errors:
            if e is not None:
                self.on_event("restore-failed", {"error": f"{e}; run `envbisect restore` on that replica's playbook"})


def load_fleet(path: Path, store: Store, options=None) -> list[tuple[str, Deployment]]:  # noqa: ANN001
    """`[fleet] replicas = ["pd-a.toml", "pd-b.toml"]` (paths relative to the fleet file; the name is
    the file's stem) or `[fleet.replicas] pd-a = "a/envbisect.toml"`: one playbook per replica."""
    import tomllib

    from envbisect.inputs.playbook import load_playbook
    from envbisect.runs.deployment import ConnectOptions

    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"{path}: {e}") from None
    fleet = doc.get("fleet") or {}
    if not isinstance(fleet, dict):
        raise UsageError(f"{path}: [fleet] must be a table")
    if "playbook" in fleet:
        return _replicas_from_groups(path, fleet, store, options)
    spec = fleet.get("replicas")
    if isinstance(spec, list) and all(isinstance(x, str) for x in spec):
        named = [(Path(x).stem, x) for x in spec]
    elif isinstance(spec, dict) and all(isinstance(v, str) for v in spec.values()):
        named = list(spec.items())
    else:
        raise UsageError(f"{path}: [fleet] replicas must be a list of playbook paths or a table name = path")
    out = []
    for name, p in named:
        pb = Path(p) if Path(p).is_absolute() else path.parent / p
        out.append((name, Deployment(load_playbook(pb), store, options or ConnectOptions())))
    return out


def _replicas_from_groups(path: Path, fleet: Mapping[str, Any], store: Store,
                          options=None) -> list[tuple[str, Deployment]]:  # noqa: ANN001
    """`[fleet] playbook = "replica.toml"`, `replicas = ["pd_a", "pd_b"]`: one playbook describes a
    replica; each replica is an inventory group (see inventory.replica_playbook)."""
    import tomllib

    from envbisect.hosts.inventory import load_inventory, replica_playbook
    from envbisect.runs.deployment import ConnectOptions

    options = options or ConnectOptions()
    unknown = sorted(set(fleet) - {"playbook", "replicas", "inventory"})
    if unknown:
        raise UsageError(f"{path}: [fleet] {unknown[0]}: unknown key (playbook, replicas, inventory)")
    groups = fleet.get("replicas")
    if not (isinstance(groups, list) and groups and all(isinstance(g, str) and g for g in groups)):
        raise UsageError(f"{path}: [fleet] replicas must be a list of inventory group names (with playbook = ...)")
    if not isinstance(fleet["playbook"], str):
        raise UsageError(f"{path}: [fleet] playbook must be a path")
    template = Path(fleet["playbook"]) if Path(fleet["playbook"]).is_absolute() else path.parent / fleet["playbook"]
    try:
        doc = tomllib.loads(template.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: [fleet] playbook {template}: no such file") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"{template}: {e}") from None
    own = (doc.get("inventory") or {}).get("file") if isinstance(doc.get("inventory"), dict) else None
    given = fleet.get("inventory")
    if given is not None and not isinstance(given, str):
        raise UsageError(f"{path}: [fleet] inventory must be a path")
    if given and not Path(given).is_absolute():
        given = str(path.parent / given)
    if isinstance(own, str) and own:
        own = os.path.expanduser(own)
        own = own if Path(own).is_absolute() else str(template.parent / own)
    src = options.inventory or given or own or None  # --inventory beats the files
    if not src:
        raise UsageError(f"{path}: a fleet of inventory groups needs an inventory: [fleet] inventory = FILE, the "
                         "replica playbook's [inventory] file, or --inventory FILE")
    inv = load_inventory(src)
    out, owner = [], {}
    for g in groups:
        rp = replica_playbook(doc, template, inv, g)
        # Replicas may share a machine (two stacks on one 8-GPU host) but never a file or checkout:
        # their trials would edit and restart each other's configuration.
        for host, p in _edited_paths(rp):
            if (host, p) in owner:
                raise UsageError(f"{path}: replicas {owner[host, p]} and {g} both use {p} on {host[0]}: each replica "
                                 "needs its own files, checkouts and ports (give them per group, as {{ variables }})")
            owner[host, p] = g
        out.append((g, Deployment(rp, store, options)))
    return out


def _edited_paths(pb) -> list[tuple[tuple, str]]:  # noqa: ANN001
    def where(h: str) -> tuple:
        return (pb.hosts[h].ssh, pb.hosts[h].ssh_options)
    paths = [(where(s.host), s.env_file) for s in pb.services.values()]
    paths += [(where(r.host), r.path) for r in pb.repos]
    paths += [(where(h), p) for h, ps in pb.watch_paths.items() for p in ps]
    return paths


def is_fleet(path: Path) -> bool:
    import tomllib

    try:
        return "fleet" in tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False


__all__ = ["FleetRun", "FleetResult", "load_fleet", "is_fleet"]
