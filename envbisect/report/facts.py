"""What a run record says, read out for the story: times and durations, the question, premise
checks and what they meant, the timeline, each trial's probe requests and evidence, the
environment, and the meaning of a verdict and of an end state. No format, no redaction."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from envbisect.outcome import VerdictKind
from envbisect.report.blocks import Badge, Text, text
from envbisect.report.common import LOG_LINES
from envbisect.report.record import RunRecord


def s(x: Any) -> str:
    """A value as text, None as nothing."""
    return "" if x is None else str(x)


def ts(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "?" if t is None else str(t)
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def clock(stamps: Sequence[Any]) -> list[str]:
    """HH:MM:SS per timeline row, with the date where it changes (and on the first row)."""
    out, day = [], None
    for t in stamps:
        if not isinstance(t, (int, float)):
            out.append("?")
            continue
        d = datetime.fromtimestamp(t, timezone.utc)
        stamp = d.strftime("%H:%M:%S")
        if d.date() != day:
            day = d.date()
            stamp = d.strftime("%Y-%m-%d ") + stamp
        out.append(stamp)
    return out


def rel(t: Any, t0: float | None) -> str:
    if not isinstance(t, (int, float)) or t0 is None:
        return ""
    sec = max(0, int(round(t - t0)))
    return f"+{sec // 60}:{sec % 60:02d}"


def secs(x: Any, digits: int = 2) -> str:
    return f"{x:.{digits}f} s" if isinstance(x, (int, float)) else "—"


def short(v: Any, kind: str | None = None) -> str:
    if v is None:
        return "(unset)" if kind == "env" else "—"
    out = str(v)
    if kind in ("git", "file") and len(out) >= 40 and all(c in "0123456789abcdef" for c in out):
        return out[:12]
    return out


def tail(body: str, n: int = LOG_LINES) -> str:
    return "\n".join(body.rstrip("\n").splitlines()[-n:])


def max_latency(trial: Mapping[str, Any]) -> float | None:
    lats = [q.get("latency_s") for r in (trial.get("probe") or {}).get("runs") or []
            for q in r.get("requests") or [] if isinstance(q.get("latency_s"), (int, float))]
    return max(lats) if lats else None


def requests(trial: Mapping[str, Any]) -> list[tuple[int, Mapping[str, Any], Mapping[str, Any]]]:
    """(probe run number, the run, one of its requests or {} for a run without any)."""
    out = []
    for i, r in enumerate((trial.get("probe") or {}).get("runs") or [], 1):
        reqs = r.get("requests") or []
        if not reqs:
            out.append((i, r, {}))
        for q in reqs:
            out.append((i, r, q))
    return out


def evidence_for(rec: RunRecord, n: Any) -> tuple[str, Mapping[str, str]]:
    key = f"trial-{int(n):03d}" if isinstance(n, int) else str(n)
    return key, rec.evidence.get(key) or {}


_PREMISE_MEANING = {
    ("current", "fail"): "Reproduced: the current configuration, co-restarted cleanly, fails the probe. "
                         "The failure is real and survives a proper co-restart.",
    ("current", "pass"): "Not reproduced: after a clean co-restart the current configuration passes. The deltas "
                         "themselves do not break the stack; look at how things were restarted (drift hints below).",
    ("baseline", "pass"): "The baseline (no deltas) passes under the same probe: the failure comes from one or more "
                          "of the deltas, so bisecting them is meaningful.",
    ("baseline", "fail"): "The baseline fails too: the failure is NOT caused by these deltas, so none is blamed "
                          "(verdict not-config); the layered path check says where the request breaks.",
    ("empty", "fail"): "There are no deltas and the baseline fails: not a configuration change.",
    ("empty", "pass"): "There are no deltas and the baseline passes: the failure was not reproduced.",
}

VERDICT_MEANING = {  # keyed by VerdictKind, a str: the recorded text finds its entry
    VerdictKind.CULPRIT: "Each listed delta breaks the stack on its own: all of them must go.",
    VerdictKind.INTERACTION: "The listed deltas break the stack only together; each alone passes.",
    VerdictKind.NOT_CONFIG: "The baseline fails too: no configuration delta is to blame. See the request path check.",
    VerdictKind.NOT_REPRODUCED: "The current configuration passes after a clean co-restart: the failure came "
                                "from how things were (re)started, not from the deltas. See the drift hints.",
    VerdictKind.INCONCLUSIVE: "The search stopped before reaching the required confidence; the remaining suspects "
                              "and their probabilities are listed.",
}

STATE_MEANING = {
    "original": "The hosts were put back exactly as they were before the run (bytes, mode, owner, mtime, HEAD, "
                "branch) and co-restarted: the failure is live again until the culprit is removed.",
    "fixed": "The hosts were left at current minus the culprits: every exonerated delta stays applied, and a final "
             "probe proved that this configuration passes.",
    "unknown": "Unknown: the run did not finish cleanly. Run `envbisect restore` to undo it from its journal.",
}


def is_premise(trial: Mapping[str, Any]) -> bool:
    kind = trial.get("kind")
    if kind:
        return kind in ("premise-current", "premise-baseline")
    return str(trial.get("purpose", "")).startswith("premise")  # a record of an older version


def premise(trial: Mapping[str, Any]) -> tuple[str, str]:
    """Which premise a premise trial checked (current, baseline, empty) and what its outcome meant."""
    kind = trial.get("kind")
    if kind:
        which = "baseline" if kind == "premise-baseline" else ("empty" if not trial.get("units") else "current")
    else:  # a record of an older version: only its purpose says
        p = str(trial.get("purpose") or "")
        which = "empty" if "no deltas" in p and "current" in p else ("current" if "current" in p else "baseline")
    o = trial.get("outcome")
    oc = "fail" if o in ("fail", "start-failure") else o
    meaning = _PREMISE_MEANING.get((which, oc)) or (
        "Could not tell: infrastructure trouble (SSH, a start command that could not run) makes a trial "
        "unresolved, never a failure; it was retried or the run stopped.")
    return which, meaning


def symptom(rec: RunRecord) -> str | None:
    """How the current configuration fails (the fingerprint the premise gave; runs/symptom.py):
    one sentence, or None when the run has none (a perf probe, a premise that did not fail)."""
    sym = rec.run.get("symptom") or (rec.verdict or {}).get("symptom")
    if not isinstance(sym, Mapping) or not sym.get("text"):
        return None
    other = [str(t.get("n")) for t in rec.trials if t.get("symptom") == "other"]
    said = f"{sym['text']} (seen in trial {sym.get('trial')})"
    if other:
        said += (f"; trial{'s' if len(other) > 1 else ''} {', '.join(other)} failed another way, which is no "
                 "evidence about it")
    return said


def timeline(rec: RunRecord) -> list[tuple[Any, str, Text]]:
    """(ts, kind, what happened) rows from events.jsonl, plus the conclusion."""
    rows = []
    for e in rec.events:
        k = e.get("kind")
        if k == "trial-start":
            cfg = e.get("config") or []
            shown = ", ".join(cfg) if len(cfg) <= 6 else ", ".join(cfg[:6]) + f", +{len(cfg) - 6} more"
            what = text(f"trial {e.get('n')} started — {e.get('purpose')} — applying {len(cfg)} of "
                        f"{e.get('total_deltas', '?')} deltas" + (f" ({shown})" if cfg else " (the baseline)"))
        elif k == "trial-end":
            t = e.get("trial") or {}
            o = t.get("outcome", "?")
            what = text(f"trial {t.get('n')} ended — ", Badge(s(t.get("outcome")), text(str(o).upper())),
                        f" — {t.get('reason', '')} (restart {secs(t.get('restart_s'), 1)}, "
                        f"probe {secs(t.get('probe_s'), 1)})")
        elif k == "step":
            what = text(str(e.get("message", "")))
        elif k == "interrupted":
            what = text(f"INTERRUPTED: {e.get('error', '')} — the hosts were restored")
        elif k == "resumed":
            what = text(f"resumed after {e.get('trials_done', '?')} finished trial(s)")
        elif k == "retracted":
            trials = ", ".join(str(n) for n in e.get("trials") or [])
            kept = f"; the verdict before it kept as {e['superseded']}" if e.get("superseded") else ""
            what = text(f"the operator retracted trial(s) {trials} from the evidence (bisect --retract){kept}")
        else:
            rest = {a: b for a, b in e.items() if a not in ("ts", "kind")}
            what = text(str(rest.get("message") or rest.get("error") or json.dumps(rest, ensure_ascii=False)))
        rows.append((e.get("ts"), str(k or "?"), what))
    v = rec.verdict
    if v:
        culprits = ", ".join(v.get("culprits") or []) or "none"
        rows.append((rec.finished_at, "verdict",
                     text(f"concluded: {str(v.get('verdict', '?')).upper()} (confidence {v.get('confidence')}), "
                          f"culprits: {culprits}; hosts left {v.get('state_left')}")))
    return rows


def _probe_target(rec: RunRecord) -> str | None:
    for t in rec.trials:
        for r in (t.get("probe") or {}).get("runs") or []:
            if r.get("target"):
                return f"{r.get('kind', '?')} → {r['target']}"
    return None


def question(rec: RunRecord) -> list[tuple[str, str]]:
    """What was asked: the deployment, the playbook, the run, the two ends, the probe, the options."""
    r, d = rec.run, rec.diff
    b = d.get("baseline") or {}
    c = d.get("current") or {}
    if r.get("baseline"):
        base = f"snapshot {r.get('baseline')}" + (f" (label '{b['label']}')" if b.get("label") else "")
        base += f", taken {b.get('taken_at') or ts((rec.snapshots.get('baseline') or {}).get('taken_at'))}"
    else:
        base = "no baseline snapshot: old values from " + (", ".join(b.get("sources") or []) or "fallback sources")
    o = r.get("options") or {}
    opts = [f"confidence ≥ {o.get('confidence')}", f"leave {o.get('leave')}"]
    if o.get("max_trials"):
        opts.append(f"max {o['max_trials']} trials")
    for k in ("only", "exclude", "link"):
        if o.get(k):
            opts.append(f"{k} {', '.join(o[k])}")
    return [("deployment", str(r.get("deployment", "?"))), ("playbook", str(r.get("playbook", "?"))),
            ("run", f"{rec.run_id}, started {ts(r.get('created_at'))}"),
            ("known-good since", str(d.get("since") or ts(r.get("since")))),
            ("baseline", base),
            ("current", f"snapshot {r.get('current')}, taken {c.get('taken_at', '?')}"),
            ("probe", str(r.get("probe")) + (f" ({t})" if (t := _probe_target(rec)) else "")),
            ("options", "; ".join(opts))]


def _machine_line(m: Mapping[str, Any]) -> str:
    return f"{m.get('hostname', '?')}: kernel {m.get('kernel', '?')}, Python {m.get('python', '?')}"


def env_rows(rec: RunRecord) -> list[tuple[str, str]]:
    """envbisect's version, the controller's and each host's kernel and Python, each repo's describe."""
    env = rec.environment or {}
    rows = [("envbisect", str(env.get("envbisect", "?")))]
    c = env.get("controller") or {}
    if c:
        rows.append(("controller", _machine_line(c)))
    for h, hd in sorted((env.get("hosts") or {}).items()):
        if hd.get("error"):
            rows.append((f"host {h}", f"could not be read: {hd['error']}"))
        else:
            rows.append((f"host {h}", _machine_line(hd)))
    for role in ("baseline", "current"):
        snap = rec.snapshots.get(role) or {}
        for h, hd in sorted((snap.get("hosts") or {}).items()):
            for p, r in sorted((hd.get("repos") or {}).items()):
                desc = r.get("describe") or (r.get("head") or "?")[:12]
                extra = (f" on {r['branch']}" if r.get("branch") else "") + (" (dirty)" if r.get("dirty") else "")
                rows.append((f"repo {h}:{p} ({role})", f"{desc}{extra}"))
    return rows
