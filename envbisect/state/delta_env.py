"""Env-file deltas: one per variable of a service's env file whose shell meaning changed, and the
drift of its running process from the file on disk.

An env delta is a change of *shell meaning* (`envfile.EnvAssignment.meaning`): ``X=512`` ->
``X="512"`` is none, ``X='$HOME/t'`` -> ``X="$HOME/t"`` is one. Where per-key deltas cannot
rebuild the baseline (the file does not parse, its source lines changed, bash evaluates an
unchanged line differently), the file is one whole-file delta, with a note. Pure: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from envbisect.inputs.envfile import EnvFile, meaning_refs
from envbisect.state.delta import Delta, DeltaKind, Drift, Found, HostSides, iso_time, parse_env_bytes, sha256_hex
from envbisect.state.delta_files import OldFile, file_delta, old_file_state
from envbisect.state.snapshot import FileState, ProcessState
from envbisect.state.sourced import source_lines_changed


def env_file_deltas(h: HostSides) -> Found:
    """Each service's env file against its baseline (a snapshot, a backup, git, or the environment
    of a process started before TIME), and each running process against its file."""
    deltas: list[Delta] = []
    notes: list[str] = []
    drift: list[Drift] = []
    unknown: list[str] = []
    for service, path in h.cur.env_files.items():
        f = h.cur.files.get(path) or FileState(path, exists=None)
        if f.error or f.exists is None:
            notes.append(f"{h.name}:{path}: cannot read ({f.error or 'unknown'}); its deltas are unknown")
            continue
        new_env = parse_env_bytes(f.content) if f.exists else EnvFile("", ())
        old = old_file_state(path, h.base, h.base_id, h.cur, h.since)
        if new_env is None:
            notes.append(f"{h.name}:{path}: not parseable as a serve-env file; compared as a whole file")
            deltas.extend(file_delta(h.name, path, f, old, h.since, h.contents))
            continue
        for key, lines in new_env.duplicates().items():
            notes.append(f"{service}: {key} is assigned {len(lines)} times in {path} (lines "
                         f"{', '.join(map(str, lines))}); the last one wins")
        proc = h.cur.processes.get(service)
        deltas.extend(_service_deltas(h, service, f, new_env, old, notes))
        if proc is not None:  # drift: the process's environment against the file on disk
            if proc.status == "ok" and proc.environ is not None:
                old_env = parse_env_bytes(old.content) if old is not None and not old.absent else None
                old_keys = set(old_env.values()) if old_env else set()
                new_eval = proc.evaluated(f.sha256) if f.exists else None
                drift.extend(_drift(h.name, service, proc, new_env, old_keys, new_eval))
                base_proc = h.base.processes.get(service) if h.base is not None else None
                drift.extend(_hand_started(h.name, service, path, proc, base_proc, set(new_env.values()) | old_keys))
            elif proc.status == "unknown":
                unknown.append(service)
    return Found(tuple(deltas), tuple(notes), tuple(drift), tuple(unknown))


def _service_deltas(h: HostSides, service: str, f: FileState, new_env: EnvFile, old: OldFile | None,
                    notes: list[str]) -> list[Delta]:
    """One service's env deltas: per key where that rebuilds the baseline, else its whole file."""
    hname, path = h.name, f.path
    proc = h.cur.processes.get(service)
    base_proc = h.base.processes.get(service) if h.base is not None else None
    # what bash made of the current file on the host (None: not evaluated there)
    new_eval = proc.evaluated(f.sha256) if proc is not None and f.exists else None
    old_env = None
    if old is not None:
        old_env = EnvFile("", ()) if old.absent else parse_env_bytes(old.content)
    keys = set(new_env.values()) | set(old_env.values() if old_env else ())
    start_env = _start_env(keys, proc, base_proc)
    if old is None:
        if proc is not None and proc.status == "ok" and h.since is not None and proc.started_at is not None \
                and proc.started_at <= h.since:
            # The process started before TIME still carries the old environment.
            return _env_deltas_from_process(hname, service, path, proc, new_env, new_eval, start_env)
        if f.mtime is not None and h.since is not None and f.mtime > h.since:
            return [Delta(f"{service}:*", DeltaKind.ENV, hname, service, path, None, "changed", None, None, "mtime",
                          (f"modified at {iso_time(f.mtime)}, after {iso_time(h.since)}; its old content is "
                           "unknown (no snapshot, backup, git history or older process)",))]
        return []
    if old_env is None:
        # its deltas are not dropped (the baseline trial would keep the current file and fail: a
        # false not-config); the file is one delta, as a current file that does not parse is
        notes.append(f"{hname}:{path}: the baseline ({old.source}) is not parseable as a serve-env file "
                     "(per key); compared as a whole file")
        return file_delta(hname, path, f, old, h.since, h.contents)
    old_eval = None
    if base_proc is not None and old.source == f"snapshot:{h.base_id}" and not old.absent:
        old_eval = base_proc.evaluated(old.sha or (sha256_hex(old.content) if old.content is not None else None))
    file_deltas = _env_deltas(hname, service, path, _file_sides(old_env, old_eval),
                              _file_sides(new_env, new_eval), old.source, start_env)
    unexplained = unexplained_evaluations(old_env, new_env, old_eval, new_eval, {d.key for d in file_deltas})
    changed, noted = source_lines_changed(path, h.cur, h.base, old.content, f.content if f.exists else None)
    if changed:
        # a `. FILE` line added, removed or changed is no assignment: per-key deltas would keep
        # today's source lines in the baseline trial
        if not noted:  # else sourced_notes says it, with what was added or removed
            notes.append(f"{hname}:{path}: its source lines changed since the baseline; compared as a whole file")
        return file_delta(hname, path, f, old, h.since, h.contents)
    if unexplained:
        notes.append(f"{hname}:{path}: what bash makes of {', '.join(unexplained)} changed, though no "
                     "assignment it reads did (a line moved, or an earlier copy of a key was edited): "
                     "compared as a whole file")
        return file_delta(hname, path, f, old, h.since, h.contents)
    return _with_files(file_deltas, None if old.absent else old.content, f.content if f.exists else None,
                       old_eval, new_eval, h.contents)


def unexplained_evaluations(old_env: EnvFile, new_env: EnvFile, old_eval: Mapping[str, str] | None,
                             new_eval: Mapping[str, str] | None, delta_keys: set[str | None]) -> list[str]:
    """Keys whose assignment means the same on both sides, whose value reads only keys the file
    itself assigns, none of which has a delta or evaluates differently, and which bash nonetheless
    evaluated differently on the host. Per-key deltas cannot express that (the order of the lines
    or an earlier, shadowed copy changed), and a trial built from them would not be the baseline.
    Conservative: a value that reads the process environment, runs a command or expands ``~`` may
    legitimately evaluate differently, so it never counts."""
    if old_eval is None or new_eval is None:
        return []
    assigned = {a.key for a in old_env.assignments} | {a.key for a in new_env.assignments}
    old_m, new_m = old_env.meanings(), new_env.meanings()
    out = []
    for key in sorted(set(old_m) & set(new_m)):
        if key in delta_keys or old_m[key] != new_m[key]:
            continue
        if old_eval.get(key) is None or new_eval.get(key) is None or old_eval[key] == new_eval[key]:
            continue
        if any(kind not in ("lit", "ref") or (kind == "ref" and any(c in text for c in ("$(", "`", "~")))
               for kind, text in new_m[key]):
            continue  # a command or ~ (also inside a default: ${A:-$(date)}) may differ
        refs = meaning_refs(new_m[key])
        if not refs or not refs <= assigned:
            continue
        if any(r in delta_keys or old_eval.get(r) != new_eval.get(r) for r in refs):
            continue
        out.append(key)
    return out


@dataclass(frozen=True)
class _Side:
    """One side of an env delta: the value, its shell text, what bash made of it, and what equality
    is decided on (the shell meaning between two files; the evaluated value against a process)."""

    value: str
    word: str | None
    eval: str | None
    same: Any


def _file_sides(env: EnvFile, evaluated: Mapping[str, str] | None) -> dict[str, _Side]:
    out = {}
    for key in env.values():
        a = env.get(key)
        assert a is not None
        out[key] = _Side(a.value, a.word, evaluated.get(key) if evaluated is not None else None, a.meaning)
    return out


def _start_env(keys: Iterable[str], proc: ProcessState | None, base_proc: ProcessState | None) -> dict[str, str] | None:
    """The environment the env file is sourced in: the current process's, else the baseline's."""
    for p in (proc, base_proc):
        env = p.start_environ(keys) if p is not None else None
        if env is not None:
            return env
    return None


def _env_deltas(host: str, service: str, path: str, old: Mapping[str, _Side], new: Mapping[str, _Side],
                source: str, start_env: Mapping[str, str] | None = None) -> list[Delta]:
    out = []
    for key in sorted(set(old) | set(new)):
        o, n = old.get(key), new.get(key)
        if o is not None and n is not None and o.same == n.same:
            continue
        change = "added" if o is None else "removed" if n is None else "changed"
        out.append(Delta(f"{service}:{key}", DeltaKind.ENV, host, service, path, key, change,
                         o.value if o else None, n.value if n else None, source,
                         old_word=o.word if o else None, new_word=n.word if n else None,
                         old_eval=o.eval if o else None, new_eval=n.eval if n else None, start_env=start_env))
    return out


def _with_files(file_deltas: list[Delta], old: bytes | None, new: bytes | None, old_eval: Mapping[str, str] | None,
                new_eval: Mapping[str, str] | None, contents: dict[str, bytes]) -> list[Delta]:
    """The file's deltas, each naming the whole file on both sides (kept in `contents`)."""
    if not file_deltas:  # nothing to apply: no need to keep the file
        return []
    shas = {}
    for side, data in (("old", old), ("new", new)):
        if data is not None:
            shas[side] = sha256_hex(data)
            contents[shas[side]] = data
    return [replace(d, old_file=shas.get("old"), new_file=shas.get("new"), old_file_eval=old_eval,
                    new_file_eval=new_eval) for d in file_deltas]


def _env_deltas_from_process(host: str, service: str, path: str, proc: ProcessState, new_env: EnvFile,
                             new_eval: Mapping[str, str] | None = None,
                             start_env: Mapping[str, str] | None = None) -> list[Delta]:
    """Old values from the environment of a process started before TIME.

    A process environment also holds everything inherited (PATH, HOME...), so only keys the file
    sets, or that share a prefix family with them (SGLANG_, NCCL_...), can be told apart as removed.
    The process holds values, not shell text: they are compared with what bash makes of the file
    (evaluated on the host when it could be, else `EnvFile.resolved`), and written back as literals.
    """
    env = dict(proc.environ or {})
    resolved = new_env.resolved({k: v for k, v in env.items() if k not in new_env.values()})
    if new_eval is not None:
        resolved = {k: new_eval.get(k) for k in resolved}
    families = {k.split("_", 1)[0] + "_" for k in resolved if "_" in k}
    keys = set(resolved) | {k for k in env if any(k.startswith(f) for f in families)}
    old = {k: _Side(env[k], None, env[k], env[k]) for k in keys if k in env}
    new = {}
    for k in keys:
        a = new_env.get(k)
        if a is not None:
            new[k] = _Side(a.value, a.word, resolved[k] if new_eval is not None else None, resolved[k])
    return _env_deltas(host, service, path, old, new, f"process:{service}", start_env)


def _hand_started(host: str, service: str, path: str, proc: ProcessState, base_proc: ProcessState | None,
                  file_keys: set[str]) -> list[Drift]:
    """Keys of the process's start environment that no file sets, neither its env file today nor at
    the baseline, and that the baseline's process did not have either: exported in the shell that
    started it by hand. What every start of the service inherits (PATH, what its start command sets)
    is in the baseline's process too, so it is left out; without a baseline process nothing is said."""
    base_env = base_proc.environ if base_proc is not None and base_proc.status == "ok" else None
    if base_env is None or proc.environ is None:
        return []
    return [Drift(host, service, key, None, value, proc.pid, proc.started_at, where=path)
            for key, value in sorted(proc.environ.items()) if key not in file_keys and key not in base_env]


def _drift(host: str, service: str, proc: ProcessState, file_env: EnvFile, old_keys: set[str],
           evaluated: Mapping[str, str] | None = None) -> list[Drift]:
    """Keys whose value in the process differs from what bash makes of the file: evaluated on the
    host when it could be (`evaluated`), else envbisect's own reading (`EnvFile.resolved`)."""
    env = dict(proc.environ or {})
    values = file_env.values()
    if evaluated is not None:
        got: dict[str, str | None] = {k: evaluated.get(k) for k in values}
    else:
        got = dict(file_env.resolved({k: v for k, v in env.items() if k not in values}))
    out = []
    for key in sorted(got):
        if env.get(key) != got[key]:
            a = file_env.get(key)
            out.append(Drift(host, service, key, got[key], env.get(key), proc.pid, proc.started_at,
                             a.word if a is not None else None, evaluated is not None))
    for key in sorted(old_keys - set(got)):
        if key in env:  # removed from the file, still set in the running process
            out.append(Drift(host, service, key, None, env[key], proc.pid, proc.started_at))
    return out

