"""`envbisect watch`: the automated run. It observes the running stack on an interval (runs/observe.py
through `Deployment.snapshot(probe=...)`: no edit, no restart; each observation is a snapshot, so a
pass is the next `--since last-good`), and when the probe turns from pass to fail twice in a row,
or a firing Alertmanager alert named in the playbook's `[watch] alerts` arrives, it runs diff and
bisect against the last good snapshot, writes the bundle and hands the verdict to `--notify`.

Two halves:
- `decide(state, event, journal_open)` is the pure decision: a small state machine fed observations
  and alerts that returns the new state and one `Decision` (act, wait for a journal, or nothing).
  No I/O, no clock: tests/test_watch.py drives it directly.
- `Watcher` is the I/O loop around it: the store lock (one watch per deployment), the remembered
  state (``STORE/watch/NAME.json``, so an incident is never acted on twice across restarts), the
  probing, the bisection, the bundle, the notify command and the Alertmanager webhook listener.

The rules `decide` follows:
- *Armed* means a pass was observed since the last bisection; only an armed watch acts.
- Two consecutive observations whose outcome is "fail" are the trigger; an "unresolved" one (the
  probe could not tell: exit 125, a lost connection) breaks the streak, it is no symptom.
- An incident is the pass->fail transition (named by the last passing snapshot) or an alert's
  fingerprint + startsAt; one that was acted on is remembered and never acted on again.
- An alert is a reason to probe, not evidence: a firing alert asks for one observation now
  (`Act.CONFIRM`), and only a `fail` of the watch's own probe makes it a trigger.
- At most one bisection per `[watch] cooldown` (default 1 h): an alert in the cooldown is said and
  dropped, a failing probe streak acts when the cooldown is over.
- An un-restored journal (or another run holding the deployment lock) means: say so once, keep the
  trigger pending, act on the next cycle after it is cleared.
"""
from __future__ import annotations

import dataclasses
import json
import os
import queue
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from envbisect.errors import LockHeld, UsageError
from envbisect.runs.schedule import (Schedule, absolute_path, cron_expression, cron_word, envbisect_command,
                                     one_line_word, slug, systemd_present, systemd_word, unit_dir)
from envbisect.runs.webhook import Alert, AlertListener, load_secret, parse_listen, parse_webhook, take_secret_env

MAX_INCIDENTS = 200  # remembered incident ids (the oldest are forgotten first)


# --- the pure decision ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Observation:
    """What one probe of the running stack said: outcome pass | fail | unresolved."""

    outcome: str
    snapshot: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class WatchState:
    armed: bool = False  # a pass was observed since the last bisection
    fails: int = 0  # consecutive "fail" observations
    last_pass: str | None = None  # the snapshot id of the newest passing observation
    incidents: tuple[str, ...] = ()  # acted on (never again)
    blocked: str | None = None  # the incident waiting for a journal to be restored (said once)
    bisected_at: float | None = None  # epoch seconds of the last bisection started: the cooldown runs from it

    def to_json(self) -> dict[str, Any]:
        return {"armed": self.armed, "fails": self.fails, "last_pass": self.last_pass,
                "incidents": list(self.incidents), "blocked": self.blocked, "bisected_at": self.bisected_at}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "WatchState":
        at = doc.get("bisected_at")
        return cls(armed=bool(doc.get("armed")), fails=int(doc.get("fails") or 0), last_pass=doc.get("last_pass"),
                   incidents=tuple(str(i) for i in doc.get("incidents") or ()), blocked=doc.get("blocked"),
                   bisected_at=None if at is None else float(at))

    def cooling(self, now: float, cooldown_s: float) -> float | None:
        """When the cooldown after the last bisection ends, while it runs; else None."""
        if self.bisected_at is None or now >= self.bisected_at + cooldown_s:
            return None
        return self.bisected_at + cooldown_s


class Act(Enum):
    NOTHING = "nothing"
    BISECT = "bisect"
    WAIT = "wait"  # a trigger, but a journal is un-restored (or another run holds the lock)
    CONFIRM = "confirm"  # an alert: probe now; only the watch's own failing probe makes it a trigger


@dataclass(frozen=True)
class Decision:
    act: Act
    reason: str
    incident: str | None = None
    trigger: str | None = None  # probe | alert
    say: bool = True  # WAIT: the first time for this incident (said and notified once)


FAILS_TO_ACT = 2


def decide(state: WatchState, event: Observation | Alert, *, journal_open: bool = False,
           alerts: Sequence[str] = (), now: float = 0.0, cooldown_s: float = 0.0,
           confirmed: Observation | None = None) -> tuple[WatchState, Decision]:
    """The new state and what to do about `event`. `journal_open`: a bisection could not start now
    (an un-restored journal, or another run's lock). `alerts`: the alertnames that may trigger.
    `now`, `cooldown_s`: the time (epoch seconds) and the least time between two bisections.
    `confirmed`: for an alert, the watch's own observation made because of it (Act.CONFIRM)."""
    if isinstance(event, Observation):
        return _observed(state, event, journal_open, now, cooldown_s)
    return _alerted(state, event, journal_open, alerts, now, cooldown_s, confirmed)


def _observed(state: WatchState, o: Observation, journal_open: bool, now: float,
              cooldown_s: float) -> tuple[WatchState, Decision]:
    if o.outcome == "pass":
        return (dataclasses.replace(state, armed=True, fails=0, last_pass=o.snapshot or state.last_pass),
                Decision(Act.NOTHING, "the probe passed" + ("" if state.armed else "; armed again")))
    if o.outcome != "fail":  # unresolved: the probe could not tell; no symptom, and the streak is broken
        return (dataclasses.replace(state, fails=0),
                Decision(Act.NOTHING, f"the probe could not tell ({o.outcome}); not counted as a failure"))
    fails = state.fails + 1
    new = dataclasses.replace(state, fails=fails)
    if not state.armed:
        return new, Decision(Act.NOTHING, "the probe failed; no pass observed since the last bisection (or "
                                          "since the watch started): nothing to compare with")
    if fails < FAILS_TO_ACT:
        return new, Decision(Act.NOTHING, f"the probe failed ({fails} of {FAILS_TO_ACT} in a row)")
    incident = f"probe:{state.last_pass or '?'}"
    why = f"the probe failed {fails} times in a row after a pass"
    ends = state.cooling(now, cooldown_s)
    if ends is not None and incident not in state.incidents:
        return new, Decision(Act.NOTHING, f"{why}; {_cooling(state, ends)}: acting after it", incident=incident)
    return _trigger(new, incident, "probe", why, journal_open)


def _cooling(state: WatchState, ends: float) -> str:
    def at(t: float) -> str:
        return time.strftime("%H:%M:%S", time.localtime(t))

    return f"in the cooldown after the bisection at {at(state.bisected_at or 0)} (until {at(ends)}, [watch] cooldown)"


def _alerted(state: WatchState, a: Alert, journal_open: bool, alerts: Sequence[str], now: float, cooldown_s: float,
             confirmed: Observation | None) -> tuple[WatchState, Decision]:
    if a.status != "firing":
        return state, Decision(Act.NOTHING, f"alert {a.alertname} is {a.status}")
    if a.alertname not in alerts:
        return state, Decision(Act.NOTHING, f"alert {a.alertname} is not in the playbook's [watch] alerts")
    if a.incident in state.incidents:
        return state, Decision(Act.NOTHING, f"alert {a.alertname} ({a.incident}) was acted on already",
                               incident=a.incident)
    ends = state.cooling(now, cooldown_s)
    if ends is not None:
        return state, Decision(Act.NOTHING, f"alert {a.alertname}: {_cooling(state, ends)}: logged, not acted on",
                               incident=a.incident)
    if not state.armed:
        return state, Decision(Act.NOTHING, f"alert {a.alertname}: no pass observed since the last bisection",
                               incident=a.incident)
    if confirmed is None:
        return state, Decision(Act.CONFIRM, f"alert {a.alertname} is firing: probing to confirm it",
                               incident=a.incident, trigger="alert")
    if confirmed.outcome != "fail":
        return state, Decision(Act.NOTHING, f"alert {a.alertname} is firing, but the watch's probe says "
                                            f"{confirmed.outcome} ({confirmed.reason}): not acted on",
                               incident=a.incident)
    return _trigger(state, a.incident, "alert", f"alert {a.alertname} is firing and the probe confirms it "
                                                f"({confirmed.reason})", journal_open)


def _trigger(state: WatchState, incident: str, trigger: str, why: str,
             journal_open: bool) -> tuple[WatchState, Decision]:
    if incident in state.incidents:
        return state, Decision(Act.NOTHING, f"{why}; incident {incident} was acted on already", incident=incident)
    if journal_open:
        first = state.blocked != incident
        return (dataclasses.replace(state, blocked=incident),
                Decision(Act.WAIT, why, incident=incident, trigger=trigger, say=first))
    return state, Decision(Act.BISECT, why, incident=incident, trigger=trigger)


def acted(state: WatchState, incident: str, now: float | None = None) -> WatchState:
    """After a bisection of `incident` started at `now`: remembered, disarmed until a pass is
    observed again, and the cooldown runs from `now`."""
    kept = tuple(i for i in state.incidents if i != incident)[-(MAX_INCIDENTS - 1):] + (incident,)
    return dataclasses.replace(state, armed=False, fails=0, incidents=kept, blocked=None,
                               bisected_at=state.bisected_at if now is None else now)


def watch_cooldown(pb: Any) -> float:
    """`[watch] cooldown` in seconds: the least time between two bisections of the watch."""
    from envbisect.state.prune import parse_duration

    return parse_duration(pb.watch_cooldown, f"{pb.path}: [watch] cooldown")


# --- the store side: lock and remembered state ---------------------------------------------------

def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale_watch(other: dict, me: dict) -> bool:
    """A watch lock is stale when this host wrote it in an earlier boot (its pid may be anyone's now),
    or in this boot and this pid namespace and its pid is gone. A pid of another namespace (a
    container with this host's name and boot id, pids of its own) cannot be looked up here."""
    if other.get("host") != me["host"]:
        return False
    if me["boot_id"] and other.get("boot_id") and other["boot_id"] != me["boot_id"]:
        return True
    if not (me["boot_id"] and me["pid_ns"]) or other.get("boot_id") != me["boot_id"] \
            or other.get("pid_ns") != me["pid_ns"]:
        return False
    try:
        return not _pid_alive(int(other.get("pid", -1)))
    except (TypeError, ValueError):
        return False


class WatchLock:
    """One watch per deployment: ``STORE/watch/NAME.lock`` holds pid, host name, boot id, pid
    namespace and start time. A lock of this host that an earlier boot wrote, or whose pid is gone in
    this pid namespace, is stale and taken over; any other is refused (LockHeld)."""

    def __init__(self, store_root: Path, deployment: str):
        self.path = Path(store_root) / "watch" / f"{slug(deployment)}.lock"
        self.deployment = deployment
        self.held = False

    def acquire(self) -> str | None:
        """Take it; a note when a stale lock was taken over."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        from envbisect.hosts.journal import boot_id, pid_namespace

        me = {"pid": os.getpid(), "host": socket.gethostname(), "boot_id": boot_id(), "pid_ns": pid_namespace(),
              "started_at": time.time()}
        note = None
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                other = self._read()
                if other is None or _stale_watch(other, me):
                    note = ("took over a stale watch lock" + (f" (pid {other.get('pid')} on {other.get('host')} is "
                                                             "gone)" if other else " (unreadable)"))
                    self.path.unlink(missing_ok=True)
                    continue
                since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(other.get("started_at") or 0)))
                where = "this host" if other.get("host") == me["host"] else f"host {other.get('host')}"
                raise LockHeld(f"another watch is watching {self.deployment!r} (pid {other.get('pid')} on {where}, "
                               f"since {since}; lock {self.path}): one watch per deployment (remove the lock "
                               "only if that watch is gone)")
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return note
        raise LockHeld(f"{self.path}: could not take the watch lock")

    def _read(self) -> dict | None:
        try:
            doc = json.loads(self.path.read_text())
            return doc if isinstance(doc, dict) and "pid" in doc else None
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        if self.held:
            other = self._read()
            if other and other.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
            self.held = False


def state_path(store_root: Path, deployment: str) -> Path:
    return Path(store_root) / "watch" / f"{slug(deployment)}.json"


def load_state(store_root: Path, deployment: str, store: Any) -> WatchState:
    """The remembered state; without one, armed when the deployment's newest probed snapshot passed."""
    p = state_path(store_root, deployment)
    if p.is_file():
        try:
            return WatchState.from_json(json.loads(p.read_text()))
        except (OSError, ValueError, TypeError, AttributeError) as e:
            raise UsageError(f"{p}: damaged watch state ({e}); move it away to start afresh") from None
    probed = [s for s in store.list() if s.playbook == deployment and s.probe is not None]
    if probed and probed[-1].probe.passed:
        return WatchState(armed=True, last_pass=probed[-1].id)
    return WatchState()


def save_state(store_root: Path, deployment: str, state: WatchState) -> None:
    from envbisect.state.store import write_private

    write_private(state_path(store_root, deployment), (json.dumps(state.to_json(), indent=1) + "\n").encode())


# --- notify ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Notified:
    ok: bool
    detail: str


def notify(command: str, doc: Mapping[str, Any], timeout_s: float) -> Notified:
    """Run `bash -c COMMAND` with the JSON document on stdin. Its failure is reported, never raised."""
    data = json.dumps(doc, indent=1, sort_keys=False) + "\n"
    try:
        r = subprocess.run(["bash", "-c", command], input=data, capture_output=True, text=True, timeout=timeout_s,
                           start_new_session=True)
    except subprocess.TimeoutExpired:
        return Notified(False, f"--notify did not finish within {timeout_s:g} s (killed)")
    except OSError as e:
        return Notified(False, f"--notify could not run: {e.strerror or e}")
    if r.returncode != 0:
        last = (r.stderr or "").strip().splitlines()
        return Notified(False, f"--notify exited with status {r.returncode}" + (f": {last[-1][:200]}" if last else ""))
    return Notified(True, "--notify ran")


# --- the loop --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WatchOptions:
    probe: str
    every_s: float
    bisect: Any  # runs.bisect.BisectOptions
    notify: str | None = None
    notify_timeout_s: float = 60.0
    max_cycles: int | None = None  # None: until stopped
    bundle_dir: Path | None = None  # default STORE/watch/bundles
    listen: tuple[str, int] | None = None


@dataclass
class WatchSummary:
    cycles: int = 0
    bisections: list[dict[str, Any]] = field(default_factory=list)
    state: WatchState = field(default_factory=WatchState)


class Watcher:
    """The I/O around `decide`. `open_deployment()` returns a fresh Deployment for each cycle (an
    SSH connection per cycle: a watch runs for weeks and connections do not). `on_event(kind, data)`
    receives every event (watch-* and the bisection's own); `say(line)` the human lines."""

    def __init__(self, open_deployment: Callable[[], Any], store_root: Path, opts: WatchOptions, *,
                 on_event: Callable[[str, dict], None], say: Callable[[str], None]):
        self.open_deployment, self.store_root, self.opts = open_deployment, Path(store_root), opts
        self.on_event, self.say = on_event, say
        self.listener: AlertListener | None = None
        self.pending: Alert | None = None  # an alert that came while a journal was un-restored: tried each cycle
        self.environ = take_secret_env()  # read each cycle from here; no child of the watch sees it

    # one cycle: observe, decide, act
    def run(self) -> WatchSummary:
        with self.open_deployment() as dep:
            pb = dep.playbook
            if self.opts.probe not in pb.probes:
                raise UsageError(f"no probe {self.opts.probe!r} in {pb.path} (known: {', '.join(pb.probes) or 'none'})")
            if self.opts.listen and not pb.watch_alerts:
                raise UsageError(f"--listen: {pb.path} names no alerts: add [watch] alerts = [\"AlertName\", ...] "
                                 "(only those trigger a bisection)")
        self.deployment, self.alerts = pb.name, pb.watch_alerts
        self.cooldown_s = watch_cooldown(pb)
        secret = load_secret(pb.watch_secret_file, str(pb.path), self.environ) if self.opts.listen else ""
        lock = WatchLock(self.store_root, pb.name)
        note = lock.acquire()
        if note:
            self.say(note)
        summary = WatchSummary()
        try:
            from envbisect.state.store import Store

            state = load_state(self.store_root, pb.name, Store(self.store_root))
            summary.state = state
            if self.opts.listen:
                self.listener = AlertListener(*self.opts.listen, log=self.say, secret=secret, alerts=self.alerts)
                host, port = self.listener.address
                self.event("watch-listen", {"url": f"http://{host}:{port}/"})
                self.say(f"listening for Alertmanager webhooks on http://{host}:{port}/ "
                         f"(alerts: {', '.join(self.alerts)})")
            self.event("watch-start", {"deployment": pb.name, "probe": self.opts.probe, "every_s": self.opts.every_s,
                                       "armed": state.armed})
            while self.opts.max_cycles is None or summary.cycles < self.opts.max_cycles:
                state = self._cycle(state, summary)
                summary.cycles += 1
                summary.state = state
                if self.opts.max_cycles is not None and summary.cycles >= self.opts.max_cycles:
                    break
                state = self._wait(state, summary)
                summary.state = state
        finally:
            if self.listener is not None:
                self.listener.close()
            lock.release()
        self.event("watch-stop", {"cycles": summary.cycles, "bisections": len(summary.bisections)})
        return summary

    def event(self, kind: str, data: dict) -> None:
        self.on_event(kind, data)

    def _save(self, state: WatchState) -> WatchState:
        save_state(self.store_root, self.deployment, state)
        return state

    def _cycle(self, state: WatchState, summary: WatchSummary) -> WatchState:
        from envbisect.errors import EnvbisectError

        try:
            with self.open_deployment() as dep:
                state = self._handle(dep, state, self._observe(dep), summary)
                if self.pending is not None:  # Alertmanager repeats it only after repeat_interval
                    state = self._handle(dep, state, self.pending, summary)
                return state
        except EnvbisectError as e:  # a host down, a damaged store: an unresolved observation, said, not fatal
            self.event("watch-observation", {"snapshot": None, "outcome": "unresolved", "reason": str(e)})
            self.say(f"{time.strftime('%H:%M:%S')} could not observe the stack: {e}")
            new, _ = decide(state, Observation("unresolved", None, str(e)))
            return self._save(new)

    def _observe(self, dep: Any, because: str | None = None) -> Observation:
        snap = dep.snapshot("watch", probe=dep.playbook.probes[self.opts.probe])
        o = snap.probe
        self.event("watch-observation", {"snapshot": snap.id, "outcome": o.outcome, "reason": o.reason,
                                         **({"because": because} if because else {})})
        self.say(f"{time.strftime('%H:%M:%S')} probe {o.name}: {o.outcome} ({o.reason}); snapshot {snap.id}"
                 + (f" (to confirm {because})" if because else ""))
        return Observation(o.outcome, snap.id, o.reason)

    def _wait(self, state: WatchState, summary: WatchSummary) -> WatchState:
        """Until the next cycle: alerts are handled as they come."""
        end = time.monotonic() + self.opts.every_s
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return state
            if self.listener is None:
                time.sleep(min(left, 1.0))
                continue
            try:
                alert = self.listener.alerts.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            self.event("watch-alert", {"alertname": alert.alertname, "status": alert.status,
                                       "fingerprint": alert.fingerprint, "startsAt": alert.starts_at,
                                       "groupKey": alert.group_key, "receiver": alert.receiver})
            with self.open_deployment() as dep:
                state = self._handle(dep, state, alert, summary)

    def _journal_block(self, dep: Any) -> str | None:
        from envbisect.runs.bisect import BisectOptions, BisectRun

        try:
            BisectRun(dep, self.opts.bisect or BisectOptions()).refuse_unrestored()
        except LockHeld as e:
            return str(e)
        return None

    def _handle(self, dep: Any, state: WatchState, event: Observation | Alert, summary: WatchSummary) -> WatchState:
        how = {"alerts": self.alerts, "now": time.time(), "cooldown_s": self.cooldown_s}
        new, d = decide(state, event, **how)
        if d.act is Act.CONFIRM and isinstance(event, Alert):  # an alert is a reason to probe, not evidence
            self.say(f"{time.strftime('%H:%M:%S')} {d.reason}")
            how["confirmed"] = self._confirm(dep, event)
            new, d = decide(state, event, **how)
        if d.act is Act.BISECT:  # only now is the journal looked at (an SSH round trip per host)
            blocked = self._journal_block(dep)
            if blocked:
                new, d = decide(state, event, journal_open=True, **how)
                d = dataclasses.replace(d, reason=f"{d.reason}; cannot start: {blocked}")
        if isinstance(event, Alert) or d.act is not Act.NOTHING:
            self.say(f"{time.strftime('%H:%M:%S')} {d.reason}")
        self.event("watch-decision", {"act": d.act.value, "reason": d.reason, "incident": d.incident,
                                      "trigger": d.trigger})
        if isinstance(event, Alert):
            self.pending = event if d.act is Act.WAIT else None
        if d.act is Act.WAIT:
            if d.say:
                self._notify({"watch": {"event": "blocked", "deployment": self.deployment, "incident": d.incident,
                                        "trigger": d.trigger, "reason": d.reason}})
            return self._save(new)
        if d.act is Act.BISECT:
            done = self._save(acted(new, d.incident, now=time.time()))  # first: a crash mid-bisection never repeats it
            rec = self._bisect(dep, d)
            summary.bisections.append(rec)
            return done
        return self._save(new)

    def _confirm(self, dep: Any, alert: Alert) -> Observation:
        from envbisect.errors import EnvbisectError

        try:
            return self._observe(dep, because=f"alert {alert.alertname}")
        except EnvbisectError as e:
            return Observation("unresolved", None, str(e))

    def _bisect(self, dep: Any, d: Decision) -> dict[str, Any]:
        from envbisect.errors import EnvbisectError
        from envbisect.report.bundle import make_bundle
        from envbisect.runs.bisect import BisectRun

        self.event("watch-bisect", {"incident": d.incident, "trigger": d.trigger})
        watch = {"deployment": self.deployment, "incident": d.incident, "trigger": d.trigger, "reason": d.reason}
        try:
            run = BisectRun(dep, self.opts.bisect, on_event=self.on_event)
            diff = dep.diff(since="last-good")
            self.say(diff.last_good["line"] if diff.last_good else "baseline: last-good")
            result = run.start(diff)
        except EnvbisectError as e:
            self.say(f"the bisection could not run: {e}")
            doc = {"watch": {**watch, "event": "error", "error": str(e)}}
            self._notify(doc)
            return doc
        bundle_dir = self.opts.bundle_dir or (self.store_root / "watch" / "bundles")
        bundle = None
        try:
            bundle_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            bundle = str(make_bundle(self.store_root, result.run_id, bundle_dir, dep.masker).path)
        except (EnvbisectError, OSError) as e:
            self.say(f"the bundle could not be written: {e}")
        doc = {**result.to_json(), "last_good": diff.last_good,
               "watch": {**watch, "event": "verdict", "bundle": bundle, "exit_status": int(result.exit_status)}}
        doc = dep.masker.redact_obj(json.loads(json.dumps(doc, default=str)))
        self.event("verdict", {"run": result.run_id, "verdict": result.verdict.kind,
                               "culprits": list(result.culprit_deltas), "state_left": result.state_left,
                               "bundle": bundle, "exit_status": int(result.exit_status)})
        self.say(f"verdict {result.verdict.kind}" + (f": {', '.join(result.culprit_deltas)}" if result.culprit_deltas
                                                      else "") + f"; hosts left {result.state_left}; bundle {bundle}")
        self._notify(doc)
        return doc

    def _notify(self, doc: dict[str, Any]) -> None:
        if not self.opts.notify:
            return
        res = notify(self.opts.notify, doc, self.opts.notify_timeout_s)
        self.event("watch-notify", {"ok": res.ok, "detail": res.detail})
        if not res.ok:
            self.say(f"{time.strftime('%H:%M:%S')} {res.detail}")


# --- as a service -----------------------------------------------------------------------------------

def make_service(*, playbook: Path, store: Path, ssh_config: str | None, inventory: str | None,
                 watch_args: Sequence[str], every: str, kind: str | None = None) -> WatchService:
    """systemd: a user service running the watch in the foreground (Type=simple, Restart=on-failure);
    cron: `watch --once` every interval (the remembered state carries the streak from one run to the
    next; the lock keeps two from overlapping; no --listen). A runs.schedule.Schedule, installed by
    runs.schedule.install as `schedule`'s are."""
    from envbisect import __version__
    from envbisect.inputs.playbook import load_playbook
    from envbisect.state.prune import parse_duration

    every_s = parse_duration(every, "--every")
    pb_path = absolute_path(playbook)
    pb = load_playbook(pb_path)
    args = ["-p", str(pb_path), "--store", str(absolute_path(store))]
    if ssh_config:
        if not absolute_path(ssh_config).is_file():
            raise UsageError(f"--ssh-config {ssh_config}: no such file")
        args += ["--ssh-config", str(absolute_path(ssh_config))]
    if inventory:
        if inventory == "-":
            raise UsageError("--inventory -: a watch service has no stdin; give the inventory file")
        args += ["--inventory", str(absolute_path(inventory))]
    for word in [*args, *watch_args, every, str(absolute_path(store) / "watch.log")]:
        one_line_word(word)  # a line break in --notify CMD would be a crontab job or unit setting of its own
    kind = kind or ("systemd" if systemd_present() else "cron")
    if "--listen" in watch_args and kind == "systemd":
        if not pb.watch_secret_file:  # the unit does not see this shell's ENVBISECT_WATCH_SECRET
            raise UsageError(f"--listen in a service needs the webhook secret in a file: add [watch] secret_file = "
                             f"\"/path\" to {pb_path} (the service does not see your environment)")
        load_secret(pb.watch_secret_file, str(pb_path))
    unit = f"envbisect-watch-{slug(pb.name)}"
    if kind == "systemd":
        command = envbisect_command() + args + ["watch", "--every", every, *watch_args]
        path_env = ":".join(dict.fromkeys([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]))
        text = (f"# Written by `envbisect watch --install` (envbisect {__version__}) for {pb_path}\n"
                "[Unit]\n"
                f"Description=envbisect watch of {pb.name}: bisect when the probe turns red\n\n"
                "[Service]\nType=simple\n"
                f"Environment={systemd_word('PATH=' + path_env)}\n"
                f"ExecStart={' '.join(systemd_word(a) for a in command)}\n"
                "Restart=on-failure\nRestartSec=30s\n"
                "# SIGTERM stops it as Ctrl-C does: a bisection under way puts the hosts back first\n"
                "TimeoutStopSec=15min\n\n"
                "[Install]\nWantedBy=default.target\n")
        return WatchService("systemd", every_s, "watch", pb.name, command, unit,
                            files={str(unit_dir() / f"{unit}.service"): text})
    if kind != "cron":
        raise UsageError(f"unknown scheduler {kind!r}")
    if "--listen" in watch_args:
        raise UsageError("--listen needs a watch that keeps running: install it as a systemd service (--systemd)")
    command = envbisect_command() + args + ["watch", "--once", *watch_args]
    log = str(absolute_path(store) / "watch.log")
    return WatchService("cron", every_s, "watch", pb.name, command, unit, log=log,
                        cron_marker=f"# envbisect watch: {pb.name} {pb_path}",
                        cron_line=f"{cron_expression(every_s)} " + " ".join(cron_word(a) for a in command)
                        + f" >> {cron_word(log)} 2>&1")


class WatchService(Schedule):
    """A watch installed as a service (make_service): enabled as a service, not a timer."""

    @property
    def enable_command(self) -> str:
        return f"systemctl --user daemon-reload && systemctl --user enable --now {self.unit}.service"


__all__ = ["Observation", "Alert", "WatchState", "Act", "Decision", "decide", "acted", "parse_webhook",
           "parse_listen", "AlertListener", "WatchLock", "load_state", "save_state", "notify", "WatchOptions",
           "Watcher", "make_service", "FAILS_TO_ACT"]
