"""The library entry point: a playbook bound to live connections and a local store.

    from envbisect.runs.deployment import Deployment
    with Deployment.open("envbisect.toml") as dep:
        diff = dep.diff(since="noon")
        for d in diff.deltas: print(d.id, d.old, "->", d.new)

The CLI is a thin layer over this object.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from envbisect.state.deltas import Diff, compute_diff, fallback_note, engine_names, split_flags, with_knobs
from envbisect.hosts.engine import load_registry, read_sglang
from envbisect.inputs.envfile import EnvFileError, parse_env
from envbisect.state.delta import Delta
from envbisect.state.upgrades import Upgrade, find_upgrades, settings_of, upgrade_deltas, with_effects
from envbisect.state.sourced import keep_sourced, sourced_notes
from envbisect.state.structured import file_pairs, key_secrets
from envbisect.errors import RemoteError, UsageError
from envbisect.hosts.inventory import bind_inventory
from envbisect.inputs.masking import SecretMasker
from envbisect.inputs.playbook import Playbook, load_playbook
from envbisect.hosts.collector import collect_host, for_each_host, take_snapshot
from envbisect.state.snapshot import HostState, Snapshot, without_fallback
from envbisect.state.store import Store
from envbisect.inputs.playbook import Probe
from envbisect.inputs.timespec import TimeSpecError, host_now, is_last_good, parse_time
from envbisect.hosts.transport import Transport, connect


@dataclass(frozen=True)
class ConnectOptions:
    ssh_config: str | None = None
    accept_new_host_key: bool = False
    attempts: int = 3
    backoff_s: float = 1.0
    inventory: str | None = None  # an Ansible inventory (--inventory); beats the playbook's [inventory] file


class Deployment:
    def __init__(self, playbook: Playbook, store: Store, options: ConnectOptions = ConnectOptions()):
        self.playbook = bind_inventory(playbook, options.inventory)  # [hosts.NAME] inventory = ... -> ssh
        self.store = store
        self.options = options
        self.masker = SecretMasker(playbook.secret_names, playbook.secret_values, key=store.mask_key())
        self._taught: set[bytes] = set()  # env file bytes the masker has learned from
        self._transports: dict[str, Transport] | None = None

    @classmethod
    def open(cls, playbook: str | Path = "envbisect.toml", store: str | Path = "snapshots",
             options: ConnectOptions = ConnectOptions()) -> "Deployment":
        return cls(load_playbook(playbook), Store(store), options)

    # connections ------------------------------------------------------------------------------
    def _connect_all(self) -> dict[str, Transport]:
        o = self.options
        return for_each_host(
            self.playbook, dict.fromkeys(self.playbook.hosts),  # type: ignore[arg-type]
            lambda h, _: connect(self.playbook.hosts[h], ssh_config=o.ssh_config,
                                 accept_new_host_key=o.accept_new_host_key, attempts=o.attempts, backoff_s=o.backoff_s),
        )

    @property
    def transports(self) -> Mapping[str, Transport]:
        if self._transports is None:
            self._transports = self._connect_all()
        return self._transports

    def round_trips(self) -> dict[str, int]:
        return {h: t.round_trips for h, t in (self._transports or {}).items()}

    def reconnect(self) -> None:
        """Replace every connection *in place* (holders of `transports` see the new ones): after a
        lost connection, the run goes on, or at least the hosts can still be restored."""
        if self._transports is None:
            return
        for h, t in self._connect_all().items():
            with contextlib.suppress(Exception):
                self._transports[h].close()
            self._transports[h] = t

    def close(self) -> None:
        for t in (self._transports or {}).values():
            with contextlib.suppress(Exception):
                t.close()
        self._transports = None

    def __enter__(self) -> "Deployment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # stage 1: snapshot ------------------------------------------------------------------------
    def learn_secrets(self, *snaps: Snapshot | None) -> None:
        """Teach `masker` the raw values of the secret-named variables in these snapshots (env
        files and process environments): from then on they are masked wherever they turn up,
        shaped or not (a log line, a probe's answer, an error message)."""
        from envbisect.inputs.envfile import parse_env

        for snap in snaps:
            for h in (snap.hosts.values() if snap else ()):
                # a file an env file sources (common.env) holds assignments as an env file does, secrets too
                sourced = sorted({e.path for es in h.sourced.values() for e in es if e.path})
                for path in [*h.env_files.values(), *sourced]:
                    f = h.files.get(path)
                    # bytes learned from already teach nothing new (an env file unchanged since the last snapshot)
                    if f is not None and f.content and f.content not in self._taught:
                        if len(self._taught) > 4096:
                            self._taught.clear()
                        self._taught.add(f.content)
                        try:
                            self.masker.learn_env(parse_env(f.content.decode("utf-8", "surrogateescape"))
                                                  .values().items())
                        except ValueError:  # EnvFileError too: an unparsable file teaches nothing
                            pass
                self._learn_watched(h)
                for p in h.processes.values():
                    self.masker.learn_env((p.environ or {}).items())
                    self.masker.learn_env((p.file_eval or {}).items())

    def _learn_watched(self, h: HostState) -> None:
        """Every file the snapshot holds the content of (watched files, configs): the values masked
        by their key or shape in its text, and in a structured file every string under a secret key."""
        for path, f in h.files.items():
            if not f.content or f.content in self._taught:
                continue
            if len(self._taught) > 4096:
                self._taught.clear()
            self._taught.add(f.content)
            text = f.content.decode("utf-8", "surrogateescape")
            self.masker.learn_text(text)
            self.masker.learn_env(file_pairs(path, f.content))

    def snapshot(self, label: str | None = None, *, save: bool = True, probe: Probe | None = None) -> Snapshot:
        """Record every host; with `probe`, also probe the stack as it runs (no edit, no restart) and
        keep the result in the snapshot (runs/observe.py): an observed known-good, or not."""
        snap = take_snapshot(self.playbook, self.transports, label=label)
        self.learn_secrets(snap)
        self.keep_registries(snap)  # an engine version seen for the first time: its knobs, for a later upgrade
        if probe is not None:
            from envbisect.runs.observe import observe_running

            snap = dataclasses.replace(snap, probe=observe_running(self.playbook, self.transports, snap, probe))
        if save:
            snap = self.store.save(snap)
        return snap

    def resolve_since(self, spec: str) -> dict[str, float]:
        """TIME per host, interpreted in each host's own timezone."""
        # One cheap round trip per host: only the clock and timezone.
        states = for_each_host(self.playbook, self.transports,
                               lambda h, t: collect_host(self.playbook, h, t, clock_only=True))
        out = {}
        for h, s in states.items():
            try:
                out[h] = parse_time(spec, host_now(s.clock_epoch, s.tz, s.utc_offset_s)).timestamp()
            except TimeSpecError as e:
                raise UsageError(str(e)) from None
        return out

    # stage 2: deltas --------------------------------------------------------------------------
    def diff(self, since: str | None = None, against: str | None = None, *, save: bool = True) -> Diff:
        if bool(since) == bool(against):
            raise UsageError("give exactly one of --since TIME or --against LABEL|SNAPSHOT")
        last_good = None
        if since is not None and is_last_good(since):
            choice = self.store.last_good(self.playbook.name)
            if choice.snapshot is None:
                raise UsageError(choice.describe())
            last_good = choice.to_json()
            since, against = None, choice.snapshot.id
        if against:
            baseline = self.store.find(against, deployment=self.playbook.name)
            if baseline.playbook != self.playbook.name:
                raise UsageError(f"snapshot {baseline.id} belongs to deployment {baseline.playbook!r}, "
                                 f"not {self.playbook.name!r}")
            since_by_host = {h: baseline.taken_at for h in self.playbook.hosts}
        else:
            since_by_host = self.resolve_since(since or "")
            # The baseline must predate TIME on every host (hosts may sit in different timezones).
            baseline = self.store.newest_at_or_before(self.playbook.name, min(since_by_host.values()))
        log_from, keep_dirty = {}, {}
        if baseline:
            for h, hs in baseline.hosts.items():
                log_from[h] = {p: r.head for p, r in hs.repos.items() if r.head}
                keep_dirty[h] = {p: list(r.dirty_files) for p, r in hs.repos.items() if r.dirty_files}
        current = take_snapshot(self.playbook, self.transports, label="diff", since_by_host=since_by_host,
                                log_from=log_from, keep_sourced=keep_sourced(baseline), keep_dirty=keep_dirty)
        self.learn_secrets(baseline, current)
        if save:  # first, so the diff names the id it was stored under (unique in the store)
            current = dataclasses.replace(current, id=self.store.save(without_fallback(current)).id)
        result = compute_diff(current, baseline, since=min(since_by_host.values()))
        if last_good is not None:
            result = dataclasses.replace(result, last_good=last_good)
        result = split_flags(result, self.playbook.arg_keys)  # an argument string: one delta per flag
        result = self.tie_to_knobs(result, current)  # what the installed engine says about each name
        result = self.with_upgrades(result, current, baseline)  # a package another version than then
        # what the env files source and envbisect could not see (or the baseline did not look at)
        result = dataclasses.replace(result, notes=result.notes + tuple(sourced_notes(current, baseline)))
        if baseline is None:  # say which sources stood in, and how to have a snapshot next time
            mine = [s for s in self.store.list() if s.playbook == self.playbook.name and s.id != current.id]
            oldest = (mine[0].id, mine[0].taken_at) if mine else None
            result = dataclasses.replace(result, notes=result.notes + (fallback_note(result, oldest),))
        self.masker.learn_env((d.key, v) for d in result.deltas if d.kind == "env" and d.key
                              for v in (d.old, d.new))
        self.masker.learn_env(key_secrets(result.deltas))
        return result

    def keep_registries(self, snap: Snapshot) -> None:
        """Read the knob registry of each sglang version a service's python sees that the store does not
        hold yet (one round trip per such host, once per version): an upgrade later is compared with it."""
        for h, hs in snap.hosts.items():
            versions = {p.packages.get("sglang") for p in hs.processes.values() if p.packages}
            if h not in self.transports or not any(v and load_registry(self.store.root, v) is None for v in versions):
                continue
            paths = [x for p in hs.processes.values()
                     for x in ((p.environ or {}).get("PYTHONPATH") or "").split(":") if x]
            read_sglang(self.transports[h], h, dict.fromkeys(paths), self.store.root)

    def with_upgrades(self, result: Diff, current: Snapshot, baseline: Snapshot | None) -> Diff:
        """The services whose python sees another version of a distribution than at the baseline, with
        what an engine upgrade changed under their settings, and a note that no trial switches it back."""
        ups = find_upgrades(baseline, current)
        if not ups:
            return result
        self.keep_registries(current)
        regs = {v: load_registry(self.store.root, v) for u in ups if u.package == "sglang" for v in (u.old, u.new) if v}
        settings = {}
        for u in ups:
            hs = current.hosts[u.host]
            f = hs.files.get(hs.env_files.get(u.service, ""))
            text = f.content.decode("utf-8", "surrogateescape") if f is not None and f.content else None
            proc = hs.processes.get(u.service)
            settings[(u.host, u.service)] = settings_of(text, proc.cmdline if proc else None, self.playbook.arg_keys)
        ups = with_effects(ups, regs, settings)
        added, untested = self.switchable(result, current, ups, regs)
        return dataclasses.replace(result, deltas=result.deltas + added, upgrades=ups,
                                   notes=result.notes + tuple(u.note() for u in untested))

    def switchable(self, result: Diff, current: Snapshot, ups: Sequence[Upgrade],
                   regs: Mapping[str, Any]) -> tuple[tuple[Delta, ...], list[Upgrade]]:
        """The deltas that switch each upgrade back where the playbook says how ([engine] switch and
        versions), and the upgrades that stay untested."""
        switch, versions = self.playbook.engine_switch, self.playbook.engine_versions
        added: list[Delta] = []
        untested = []
        for u in ups:
            hs = current.hosts[u.host]
            path = hs.env_files.get(u.service, "")
            f = hs.files.get(path)
            try:
                values = parse_env(f.content.decode("utf-8", "surrogateescape")).values() if f and f.content else {}
            except EnvFileError:
                values = {}
            ds = upgrade_deltas(u, path, values, switch, versions, regs.get(u.old or ""), regs.get(u.new or ""),
                                set_elsewhere(hs, u.service, path)) if switch else ()
            switched = any(d.key == switch and d.service == u.service for d in result.deltas)
            added += [d for d in ds if not (switched and d.key == switch)]
            if not ds and not switched:
                untested.append(u)
        return tuple(added), untested

    def tie_to_knobs(self, result: Diff, current: Snapshot) -> Diff:
        """Each env delta and flag tied to the knob the host's installed SGLang reads (hosts/engine.py):
        one round trip per host that has a delta of an ``SGL*_`` variable or a flag (a separate step: the
        registry is parsed once per version and kept in the store); where it cannot be read, today's
        behaviour and a note."""
        hosts = sorted(engine_names(result))
        registries: dict[str, Any] = {}
        notes = []
        for h in hosts:
            procs = current.hosts[h].processes.values() if h in current.hosts else ()
            paths = [p for pr in procs for p in ((pr.environ or {}).get("PYTHONPATH") or "").split(":") if p]
            reg, note = read_sglang(self.transports[h], h, dict.fromkeys(paths), self.store.root)
            registries[h] = reg
            if note:
                notes.append(note)
        # a rename is judged by the release each side runs: the baseline's as the store keeps it
        versions = {p.packages.get("sglang") for snap in (result.baseline, current) if snap is not None
                    for hs in snap.hosts.values() for p in hs.processes.values() if p.packages}
        releases = {v: load_registry(self.store.root, v) for v in versions if v}
        return with_knobs(result, registries, notes, self.playbook.arg_keys, releases)


def set_elsewhere(hs: Any, service: str, env_path: str) -> set[str]:
    """The names a service's environment gets besides its env file's own lines: its process's start
    environment and every assignment written in a file the env file sources (any `NAME=` in its text:
    a name too many only keeps a default from being pinned)."""
    proc = hs.processes.get(service)
    names = set((proc.start_environ() if proc is not None else None) or ())
    for entry in hs.sourced.get(env_path, ()):
        f = hs.files.get(entry.path or "")
        if f is not None and f.content:
            names |= set(re.findall(r"(?<![\w$])([A-Za-z_]\w*)=", f.content.decode("utf-8", "surrogateescape")))
    return names


def capture_environment(playbook, transports) -> dict[str, Any]:  # noqa: ANN001
    """Versions for the postmortem: envbisect, and each host's kernel and Python."""
    import platform

    from envbisect import __version__

    hosts = {}
    for h, t in transports.items():
        try:
            r = t.run_python("import platform,sys;print(platform.release());print(platform.python_version());"
                             "print(platform.node())", timeout=30)
            kernel, py, node = (r.stdout.decode().splitlines() + ["?", "?", "?"])[:3]
            hosts[h] = {"kernel": kernel, "python": py, "hostname": node}
        except RemoteError as e:
            hosts[h] = {"error": str(e)}
    return {"envbisect": __version__, "controller": {"python": platform.python_version(), "kernel": platform.release(),
                                                     "hostname": platform.node()}, "hosts": hosts}


__all__: Iterable[str] = ["Deployment", "ConnectOptions", "capture_environment"]
