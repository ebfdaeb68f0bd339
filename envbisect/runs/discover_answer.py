"""The discovery answer as the controller accepts it: every field checked by type where the answer
is read (runs.playbook_draft.scan), before anything interprets it or writes it into the `init` draft.

The answer comes from a host, and a compromised host sends whatever it likes. A field of the wrong
type (a pid holding a string with a line break, a port of 1e300, a table where a name belongs) is
left out, as if the host had not reported it; a process whose pid or matcher is not valid is left
out whole, with a note saying so (a note names the field, never the value). What passes holds only
the types below: strings are strings, numbers are finite and in range, pids and ports positive ints.
"""
from __future__ import annotations

import math
from typing import Any, Callable

_MAX_EPOCH = 2.0 ** 37  # seconds: far beyond any clock, far below datetime's limits


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 31


def _pid(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2 ** 31


def _port(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v < 65536


def _epoch(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and 0 <= v < _MAX_EPOCH)


Spec = Any  # a check function, [Spec] (a list of), (Spec, Spec) (a pair), or {key: Spec} (a table)
REQUIRED = "!"  # a key of a table spec starting with it: the table is dropped when it is not valid
ANY_KEY = "*"  # a table of host-named keys, each value of the one spec

_ADDR = (_str, _port)
_MATCH = {"!path": _str, "args": {ANY_KEY: _str}}
_SOURCE = {"!line": _count, "!text": _str, "word": _str, "matches": [_MATCH]}
_SCRIPT = {"path": _str, "how": _str, "argv": [_str], "sources": [_SOURCE], "uses_positional": _bool,
           "detaches": _bool, "cases": [_str], "siblings": [_str], "markers": [_str], "mentions_ports": [_port],
           "mentions_metrics_ports": [_port], "running_pid": _pid}
_ENV_FILE = {"!path": _str, "readable": _bool, "keys": _count, "equal": _count, "differ": _count,
             "missing": _count, "backups": [_str]}
_UNIT = {"!name": _str, "user": _bool, "file": {"path": _str, "environment_files": [_str], "exec_start": _str,
                                                 "working_directory": _str}}
_REPO = {"!path": _str, "found_from": _str, "head": _str, "branch": _str, "remote": _str}
_PROCESS = {"!pid": _pid, "ppid": _count, "!matcher": _str, "!kind": _str, "argv": [_str], "title_only": _bool,
            "user": _str, "cwd": _str, "exe": _str, "started_at": _epoch, "listen": [_ADDR],
            "environ_readable": _bool, "notes": [_str], "stdout": _str, "stderr": _str, "log_addresses": [_ADDR],
            "ancestors": [{"pid": _pid, "argv0": _str}], "child_of": _pid, "scripts": [_SCRIPT], "unit": _UNIT,
            "env_files": [_ENV_FILE], "pid_files": [_str], "repos": [_REPO]}
_ANSWER = {"hostname": _str, "user": _str, "home": _str, "uid": _count, "python": _str, "python_version": _str,
           "now": _epoch, "systemd": _bool}

_BAD = object()


def _checked(v: Any, spec: Spec) -> Any:
    """`v` as `spec` allows it, or _BAD."""
    if isinstance(spec, dict):
        if not isinstance(v, dict):
            return _BAD
        if ANY_KEY in spec:
            return {k: x for k, x in v.items() if isinstance(k, str) and _checked(x, spec[ANY_KEY]) is not _BAD}
        out = {}
        for key, sub in spec.items():
            name = key.lstrip(REQUIRED)
            x = _BAD if v.get(name) is None else _checked(v[name], sub)
            if x is not _BAD:
                out[name] = x
            elif key.startswith(REQUIRED):
                return _BAD
        return out
    if isinstance(spec, list):
        if not isinstance(v, list):
            return _BAD
        return [y for y in (_checked(x, spec[0]) for x in v) if y is not _BAD]
    if isinstance(spec, tuple):
        if not isinstance(v, (list, tuple)) or len(v) != len(spec):
            return _BAD
        items = [_checked(x, s) for x, s in zip(v, spec)]
        return _BAD if any(x is _BAD for x in items) else items
    check: Callable[[Any], bool] = spec
    return v if check(v) else _BAD


def checked(doc: Any) -> dict[str, Any]:
    """The answer with every field of the wrong type left out, a process without a valid pid or
    matcher left out whole (said in `answer_notes`). Idempotent."""
    if not isinstance(doc, dict):
        return {"processes": [], "answer_notes": ["the discovery answer is not a table: nothing read from it"]}
    out = _checked(doc, _ANSWER)
    notes = _checked(doc.get("answer_notes") or [], [_str])  # from an earlier check; strings, shown as comments
    notes = [] if notes is _BAD else notes
    procs = doc.get("processes") if isinstance(doc.get("processes"), list) else []
    out["processes"] = []
    for i, p in enumerate(procs):
        q = _checked(p, _PROCESS)
        if q is _BAD:
            what = ", ".join(k.lstrip(REQUIRED) for k in _PROCESS if k.startswith(REQUIRED)
                             if not isinstance(p, dict) or _checked(p.get(k.lstrip(REQUIRED)), _PROCESS[k]) is _BAD)
            notes.append(f"process {i + 1} of the host's answer was left out: its {what or 'entry'} is not valid")
            continue
        out["processes"].append(q)
    out["answer_notes"] = notes
    return out
