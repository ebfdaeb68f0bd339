"""An engine upgrade as a change: the versions of the distributions each service's own python sees
(`ProcessState.packages`, snapshotted by the collector) compared between the baseline and now, and,
for the engine itself where both releases' knob registries are known (the store keeps one per
version, hosts/engine.py), what the upgrade changed under the deployment's own settings:

- defaults that changed for knobs the deployment does not set (the value it runs with changed
  although no file did);
- variables it sets that the new release no longer reads (silently ignored now), or reads under a
  new name;
- flags it passes that the new release renamed or removed.

No trial can switch a version back unless the playbook says how, so without that an upgrade is not a
delta: the diff lists it, the bisection runs over the deltas, and its note (`UNTESTED_UPGRADE`) keeps a
not-config verdict from standing while it does (runs/baseline_proof.py). Where the playbook names the
env-file variable the start command picks the engine's environment by and the value of each release
installed side by side (``[engine] switch``, ``[engine.versions]``), the upgrade is a delta of that
variable (`upgrade_deltas`: ``SERVICE:pkg:sglang``, its old side the old release's value), and each
default it changed under the service a delta too (``SERVICE:pkg:sglang[SGLANG_X]``: the old default
pinned by its variable, the new side unset), so the search can name the upgrade and the default inside
it. Pure: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from envbisect.inputs.argstring import ArgStringError, is_arg_key, parse_args, split_words
from envbisect.inputs.envfile import EnvFileError, parse_env
from envbisect.state.delta import Delta, DeltaKind
from envbisect.state.knobs import Knob, SglangRegistry
from envbisect.state.snapshot import Snapshot

# the note's words that mark an upgrade as a change the baseline trial could not put back
UNTESTED_UPGRADE = "an upgrade no trial switched back"


@dataclass(frozen=True)
class Upgrade:
    host: str
    service: str
    package: str  # normalised distribution name: "sglang", "sgl-kernel"
    old: str | None  # version at the baseline (None: not installed then)
    new: str | None
    effects: tuple[str, ...] = ()  # what it changed under the deployment's settings (engine only)

    @property
    def id(self) -> str:
        return f"{self.service}:pkg:{self.package}"

    def line(self) -> str:
        return f"{self.id} {self.old or '(not installed)'} → {self.new or '(not installed)'}"

    def note(self) -> str:
        return (f"{self.host}: {self.line()}: {UNTESTED_UPGRADE} (the playbook gives no [engine.versions] "
                "to switch it), so the configuration without it was never tried")

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "host": self.host, "service": self.service, "package": self.package,
                "old": self.old, "new": self.new, "effects": list(self.effects)}


def find_upgrades(baseline: Snapshot | None, current: Snapshot) -> tuple[Upgrade, ...]:
    """Each service whose python sees another version of a snapshotted distribution than at the
    baseline (both sides read: a side not read is no evidence of a change)."""
    if baseline is None:
        return ()
    out = []
    for host, hs in sorted(current.hosts.items()):
        old_hs = baseline.hosts.get(host)
        for svc, p in sorted(hs.processes.items()):
            q = old_hs.processes.get(svc) if old_hs is not None else None
            if p.packages is None or q is None or q.packages is None:
                continue
            for name in sorted(set(p.packages) | set(q.packages)):
                if p.packages.get(name) != q.packages.get(name):
                    out.append(Upgrade(host, svc, name, q.packages.get(name), p.packages.get(name)))
    return tuple(out)


def settings_of(env_text: str | None, cmdline: str | None, arg_keys: Iterable[str] = ()) -> tuple[set[str], set[str]]:
    """The variables an env file sets, and the flags it and the process's command line pass."""
    envs: set[str] = set()
    flags: set[str] = set()
    extra = frozenset(arg_keys)
    try:
        values = parse_env(env_text).values() if env_text else {}
    except EnvFileError:
        values = {}
    for k, v in values.items():
        envs.add(k)
        if is_arg_key(k, extra):
            try:
                flags |= {f.name for f in parse_args(v).flags}
            except ArgStringError:
                pass
    try:
        flags |= {w.value.split("=", 1)[0] for w in split_words(cmdline or "") if w.value.startswith("--")}
    except ArgStringError:
        pass
    return envs, flags


def _flag_name(reg: SglangRegistry, field: str) -> str:
    return next((s for s, f in reg.flags.items() if f == field), "--" + field.replace("_", "-"))


def _shown(v: str | None) -> str:
    return "(no default)" if v is None else v


def upgrade_effects(old: SglangRegistry, new: SglangRegistry, envs: Iterable[str],
                    flags: Iterable[str]) -> tuple[str, ...]:
    """What moving from `old` to `new` changes for a service that sets `envs` and passes `flags`."""
    out: list[str] = []
    set_knobs: set[str] = set()
    for k in sorted(envs):
        ka = old.knob(k) if old.owns(k) else None
        if ka is None:
            continue
        set_knobs.add(ka.name)
        kb = new.knob(k)
        if kb is None:
            why = " (deprecated without a replacement)" if k in new.retired_envs else ""
            out.append(f"{k} is set here and sglang {new.version} no longer reads it{why}: ignored now")
        elif kb.name != ka.name:
            out.append(f"{k} is read as {kb.name} by sglang {new.version} (was {ka.name})")
    for f in sorted(flags):
        fa = old.flag(f)
        if fa is None:
            continue
        set_knobs.add(fa.name)
        fb = new.flag(f)
        if fb is None:
            how = "refused with an error" if f in new.retired_flags else "not a flag any more"
            out.append(f"{f} is passed here and sglang {new.version} removed it ({how})")
        elif fb.name != fa.name:
            out.append(f"{f} is passed here and sglang {new.version} renamed it: "
                       f"it sets {_flag_name(new, fb.name[5:])}")
    for name in sorted(set(old.envs) & set(new.envs)):
        if name not in set_knobs and old.envs[name] != new.envs[name]:
            out.append(f"default of {name}: {_shown(old.envs[name])} → {_shown(new.envs[name])} (not set here)")
    flagged = set(new.flags.values())
    for field in sorted(set(old.fields) & set(new.fields) & flagged):
        if f"flag:{field}" not in set_knobs and old.fields[field] != new.fields[field]:
            out.append(f"default of {_flag_name(new, field)}: {_shown(old.fields[field])} → "
                       f"{_shown(new.fields[field])} (not passed here)")
    return tuple(out)


def with_effects(upgrades: Iterable[Upgrade], registries: Mapping[str, SglangRegistry | None],
                 settings: Mapping[tuple[str, str], tuple[set[str], set[str]]]) -> tuple[Upgrade, ...]:
    """The engine upgrades with their effects where both versions' registries are known
    (`registries`: version -> registry; `settings`: (host, service) -> its variables and flags)."""
    out = []
    for u in upgrades:
        a, b = registries.get(u.old or ""), registries.get(u.new or "")
        if u.package != "sglang":
            out.append(u)
        elif a is None or b is None:
            missing = ", ".join(v for v, r in ((u.old, a), (u.new, b)) if r is None and v)
            out.append(Upgrade(u.host, u.service, u.package, u.old, u.new,
                               (f"what it changed under this deployment's settings is unknown: the store holds "
                                f"no knob registry of sglang {missing} (one is kept when a snapshot or diff "
                                "reads a release)",)))
        else:
            envs, flags = settings.get((u.host, u.service), (set(), set()))
            out.append(Upgrade(u.host, u.service, u.package, u.old, u.new, upgrade_effects(a, b, envs, flags)))
    return tuple(out)


def upgrade_deltas(u: Upgrade, path: str, file_values: Mapping[str, str], switch: str,
                   versions: Mapping[str, str], old: SglangRegistry | None,
                   new: SglangRegistry | None, set_elsewhere: Iterable[str] = ()) -> tuple[Delta, ...]:
    """The deltas a trial can switch an sglang upgrade of one service by (see the module's head): the
    switch variable of its env file (`path`, whose assignments now are `file_values`) back at the old
    release's value, and each env default the upgrade changed that nothing sets by any spelling (the
    file, or `set_elsewhere`: names a sourced file or the start environment sets), pinned at the old
    value: pinned over a value set elsewhere, the trial would not run the baseline. Empty when the
    playbook names no value for either release."""
    if u.package != "sglang" or u.old not in versions or u.new not in versions:
        return ()
    source = f"upgrade:{u.old}"
    out = []
    cur, was = file_values.get(switch), versions[u.old or ""]
    if cur != was:
        out.append(Delta(u.id, DeltaKind.ENV, u.host, u.service, path, switch, "changed" if cur is not None else
                         "removed", was, cur, source,
                         detail=(f"sglang {u.old} → {u.new}: the old release runs with {switch}={was} "
                                 "([engine.versions])",)))
    if old is not None and new is not None:
        for k in sorted(set(old.envs) & set(new.envs)):
            a, b = old.envs[k], new.envs[k]
            spellings = {k, *old.aliases(Knob(k, a)), *new.aliases(Knob(k, b))}
            if a is None or a == b or spellings & (set(file_values) | set(set_elsewhere)):
                continue
            out.append(Delta(f"{u.id}[{k}]", DeltaKind.ENV, u.host, u.service, path, k, "removed", a, None, source,
                             detail=(f"a default sglang {u.new} changed ({a} → {_shown(b)}): the old one pinned "
                                     f"on the new release",)))
    return tuple(out)
