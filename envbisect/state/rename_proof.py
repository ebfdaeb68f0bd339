"""Whether a knob renamed in place (its old spelling removed, another added, the same value) is provably
no change in meaning, so that no trial need be spent on it. Pure: reads the diff's snapshots.

SGLang reads the new name of an aliased variable first and the old one only when the new one is
unset, so the line alone proves nothing: ``OLD=64`` → ``NEW=64`` changes the value the engine runs
with from 16 to 64 when a sourced file sets ``NEW=16`` (noon ignored the line, now it wins). And the
pair is one knob only for a release that reads both spellings as one: switched back to a release
that does not know the new name, the setting is lost. A rename is no change only when:

- each side's release reads both spellings as the same knob (the baseline's release judged by its
  own registry when the service ran another version then: ``releases``, version -> registry);
- no other spelling of the knob is set anywhere else in the service's environment on either side:
  the process's start environment (which holds what sourced files set), the env file's text and
  the text of every file it sources, as the side's snapshot records them. A name written there at
  all counts as set (a comment too): doubt costs a trial, never a verdict.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Mapping

from envbisect.state.delta import Delta, Diff
from envbisect.state.snapshot import HostState, ProcessState

if TYPE_CHECKING:
    from envbisect.state.knobs import KnobRegistry


def why_not_same(diff: Diff, gone: Delta, added: Delta, registry: "KnobRegistry",
                 releases: Mapping[str, "KnobRegistry | None"]) -> str | None:
    """None when `gone` (the old spelling removed) and `added` (the new one) are provably the same
    setting on both sides; else why not, for the diff's note."""
    old, new = gone.flag or gone.key or "", added.flag or added.key or ""
    base_host = diff.baseline.hosts.get(gone.host) if diff.baseline is not None else None
    cur_host = diff.current.hosts.get(added.host)
    then, now = _version(base_host, gone.service), _version(cur_host, added.service)
    registries = [registry]
    if then is not None and now is not None and then != now:
        base_reg = releases.get(then)
        if base_reg is None:
            return f"the knobs of sglang {then}, which runs at the baseline, are not known"
        read = base_reg.flag if gone.flag is not None else base_reg.knob
        k_old, k_new = read(old), read(new)
        if k_new is None or k_old is None or k_old.name != k_new.name:
            return f"sglang {then} at the baseline does not read {new} as {old}"
        registries.append(base_reg)
    if gone.flag is not None or gone.kind != "env":
        return None
    spellings = {a for r in registries for k in [r.knob(new)] if k is not None for a in r.aliases(k)
                 if not a.startswith("--")}
    for side, host, delta, own in (("at the baseline", base_host or cur_host, gone, old),
                                   ("now", cur_host, added, new)):
        for name in sorted(spellings - {own}):
            if _set_in(diff, host, delta, name, side == "now", {old, new}):
                return f"{name} is set elsewhere {side}"
    return None


def _version(host: HostState | None, service: str | None) -> str | None:
    proc = host.processes.get(service or "") if host is not None else None
    return (proc.packages or {}).get("sglang") if proc is not None else None


def _set_in(diff: Diff, host: HostState | None, d: Delta, name: str, now: bool, pair: set[str]) -> bool:
    """Does anything the side's snapshot records set `name` for the service, besides the line itself?"""
    if host is None:
        return False
    proc: ProcessState | None = host.processes.get(d.service or "")
    start = proc.start_environ(pair if proc is not None and _stale(proc) else ()) if proc is not None else None
    if start is not None and name in start:
        return True
    assigned = re.compile(rf"(?<![\w$]){re.escape(name)}=")
    texts = [diff.contents.get(sha) for sha in [d.new_file if now else d.old_file] if sha]
    env_path = host.env_files.get(d.service or "", d.path)
    for entry in host.sourced.get(env_path, ()):
        f = host.files.get(entry.path or "")
        texts.append(f.content if f is not None else None)
    return any(t is not None and assigned.search(t.decode("utf-8", "surrogateescape")) for t in texts)


def _stale(proc: ProcessState) -> bool:
    """Was the process started from other bytes of its env file than those evaluated (its environment
    disagrees with the evaluation)? Then the pair's own spellings in its environment came from the
    file as it was, not from elsewhere; the sourced files' text still says what else sets them."""
    env = proc.environ or {}
    return proc.file_eval is None or any(env.get(k) != v for k, v in proc.file_eval.items())
