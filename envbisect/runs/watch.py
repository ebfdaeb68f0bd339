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
- An un-restored journal (or another run holding the deployment lock) means: say so once, keep the
  trigger pending, act on the next cycle after it is cleared.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from envbisect.errors import LockHeld, UsageError
from envbisect.runs.schedule import (Schedule, absolute_path, cron_expression, cron_word, envbisect_command,
                                     one_line_word, slug, systemd_present, systemd_word, unit_dir)

MAX_BODY = 1 << 20  # bytes: an Alertmanager group notification is a few KiB; more is refused (413)
MAX_INCIDENTS = 200  # remembered incident ids (the oldest are forgotten first)


# --- the pure decision ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Observation:
    """What one probe of the running stack said: outcome pass | fail | unresolved."""

    outcome: str
    snapshot: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class Alert:
    """One alert of an Alertmanager webhook notification (version "4")."""

    alertname: str
    status: str  # firing | resolved
    fingerprint: str = ""
    starts_at: str = ""
    group_key: str = ""
    receiver: str = ""

    @property
    def incident(self) -> str:
        if self.fingerprint:
            return f"alert:{self.fingerprint}@{self.starts_at}"
        return f"alert-group:{self.group_key}@{self.starts_at}"


@dataclass(frozen=True)
class WatchState:
    armed: bool = False  # a pass was observed since the last bisection
    fails: int = 0  # consecutive "fail" observations
    last_pass: str | None = None  # the snapshot id of the newest passing observation
    incidents: tuple[str, ...] = ()  # acted on (never again)
    blocked: str | None = None  # the incident waiting for a journal to be restored (said once)

    def to_json(self) -> dict[str, Any]:
        return {"armed": self.armed, "fails": self.fails, "last_pass": self.last_pass,
                "incidents": list(self.incidents), "blocked": self.blocked}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "WatchState":
        return cls(armed=bool(doc.get("armed")), fails=int(doc.get("fails") or 0), last_pass=doc.get("last_pass"),
                   incidents=tuple(str(i) for i in doc.get("incidents") or ()), blocked=doc.get("blocked"))


class Act(Enum):
    NOTHING = "nothing"
    BISECT = "bisect"
    WAIT = "wait"  # a trigger, but a journal is un-restored (or another run holds the lock)


@dataclass(frozen=True)
class Decision:
    act: Act
    reason: str
    incident: str | None = None
    trigger: str | None = None  # probe | alert
    say: bool = True  # WAIT: the first time for this incident (said and notified once)


FAILS_TO_ACT = 2


def decide(state: WatchState, event: Observation | Alert, *, journal_open: bool = False,
           alerts: Sequence[str] = ()) -> tuple[WatchState, Decision]:
    """The new state and what to do about `event`. `journal_open`: a bisection could not start now
    (an un-restored journal, or another run's lock). `alerts`: the alertnames that may trigger."""
    if isinstance(event, Observation):
        return _observed(state, event, journal_open)
    return _alerted(state, event, journal_open, alerts)


def _observed(state: WatchState, o: Observation, journal_open: bool) -> tuple[WatchState, Decision]:
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
    return _trigger(new, incident, "probe", f"the probe failed {fails} times in a row after a pass", journal_open)


def _alerted(state: WatchState, a: Alert, journal_open: bool, alerts: Sequence[str]) -> tuple[WatchState, Decision]:
    if a.status != "firing":
        return state, Decision(Act.NOTHING, f"alert {a.alertname} is {a.status}")
    if a.alertname not in alerts:
        return state, Decision(Act.NOTHING, f"alert {a.alertname} is not in the playbook's [watch] alerts")
    if a.incident in state.incidents:
        return state, Decision(Act.NOTHING, f"alert {a.alertname} ({a.incident}) was acted on already",
                               incident=a.incident)
    if not state.armed:
        return state, Decision(Act.NOTHING, f"alert {a.alertname}: no pass observed since the last bisection",
                               incident=a.incident)
    return _trigger(state, a.incident, "alert", f"alert {a.alertname} is firing", journal_open)


def _trigger(state: WatchState, incident: str, trigger: str, why: str,
             journal_open: bool) -> tuple[WatchState, Decision]:
    if incident in state.incidents:
        return state, Decision(Act.NOTHING, f"{why}; incident {incident} was acted on already", incident=incident)
    if journal_open:
        first = state.blocked != incident
        return (dataclasses.replace(state, blocked=incident),
                Decision(Act.WAIT, why, incident=incident, trigger=trigger, say=first))
    return state, Decision(Act.BISECT, why, incident=incident, trigger=trigger)


def acted(state: WatchState, incident: str) -> WatchState:
    """After a bisection of `incident`: remembered, and disarmed until a pass is observed again."""
    kept = tuple(i for i in state.incidents if i != incident)[-(MAX_INCIDENTS - 1):] + (incident,)
    return dataclasses.replace(state, armed=False, fails=0, incidents=kept, blocked=None)


# --- Alertmanager's webhook ----------------------------------------------------------------------

def parse_webhook(body: bytes) -> list[Alert]:
    """The alerts of an Alertmanager webhook notification (version "4"). ValueError: not one."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("alerts"), list):
        raise ValueError("not an Alertmanager webhook notification (no alerts list)")
    if str(doc.get("version", "4")) != "4":
        raise ValueError(f"webhook version {doc.get('version')!r}: envbisect reads version 4")
    out = []
    for a in doc["alerts"]:
        if not isinstance(a, dict) or not isinstance(a.get("labels"), dict):
            raise ValueError("an alert without labels")
        out.append(Alert(alertname=str(a["labels"].get("alertname", "")), status=str(a.get("status") or
                                                                                        doc.get("status") or ""),
                         fingerprint=str(a.get("fingerprint") or ""), starts_at=str(a.get("startsAt") or ""),
                         group_key=str(doc.get("groupKey") or ""), receiver=str(doc.get("receiver") or "")))
    return out


def parse_listen(spec: str, *, allow_remote: bool) -> tuple[str, int]:
    """HOST:PORT for --listen; a non-loopback HOST only with `allow_remote`."""
    m = re.fullmatch(r"\[?([^\]]*?)\]?:(\d{1,5})", spec.strip())
    if not m or not m.group(1) or int(m.group(2)) > 65535:
        raise UsageError(f"--listen {spec}: give HOST:PORT, e.g. 127.0.0.1:9798")
    host, port = m.group(1), int(m.group(2))
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        raise UsageError(f"--listen {spec}: HOST must be an IP address or localhost") from None
    if not loopback and not allow_remote:
        raise UsageError(f"--listen {spec}: {host} is not a loopback address; anyone who reaches it could start a "
                         "bisection: add --listen-remote to mean it (and put it behind your firewall)")
    return host, port


class AlertListener:
    """A small HTTP server for Alertmanager's webhook: each POST's alerts go on `alerts` (a queue the
    watch loop reads between cycles). Bodies over MAX_BODY are refused unread (413)."""

    def __init__(self, host: str, port: int, log: Callable[[str], None]):
        self.alerts: "queue.Queue[Alert]" = queue.Queue()
        me = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                try:
                    n = int(self.headers.get("Content-Length") or "-1")
                except ValueError:
                    n = -1
                if n < 0:
                    return self._answer(411, "Content-Length required")
                if n > MAX_BODY:
                    self.close_connection = True
                    return self._answer(413, f"body over {MAX_BODY} bytes")
                try:
                    got = parse_webhook(self.rfile.read(n))
                except ValueError as e:
                    log(f"webhook from {self.client_address[0]} refused: {e}")
                    return self._answer(400, str(e))
                for a in got:
                    me.alerts.put(a)
                return self._answer(200, f"{len(got)} alert(s) received")

            def do_GET(self) -> None:  # noqa: N802
                self._answer(200, "envbisect watch: POST Alertmanager webhook notifications here")

            def _answer(self, code: int, text: str) -> None:
                data = (text + "\n").encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a: Any) -> None:
                pass

        family = socket.AF_INET6 if ":" in host else socket.AF_INET

        class Server(ThreadingHTTPServer):
            address_family = family
            daemon_threads = True

        try:
            self.server = Server((host, port), Handler)
        except OSError as e:
            raise UsageError(f"--listen {host}:{port}: {e.strerror or e}") from None
        self.address = self.server.server_address[:2]
        self._thread = threading.Thread(target=self.server.serve_forever, name="envbisect-watch-listen", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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
                self.listener = AlertListener(*self.opts.listen, log=self.say)
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
                snap = dep.snapshot("watch", probe=dep.playbook.probes[self.opts.probe])
                o = snap.probe
                obs = Observation(o.outcome, snap.id, o.reason)
                self.event("watch-observation", {"snapshot": snap.id, "outcome": o.outcome, "reason": o.reason})
                self.say(f"{time.strftime('%H:%M:%S')} probe {o.name}: {o.outcome} ({o.reason}); snapshot {snap.id}")
                state = self._handle(dep, state, obs, summary)
                if self.pending is not None:  # Alertmanager repeats it only after repeat_interval
                    state = self._handle(dep, state, self.pending, summary)
                return state
        except EnvbisectError as e:  # a host down, a damaged store: an unresolved observation, said, not fatal
            self.event("watch-observation", {"snapshot": None, "outcome": "unresolved", "reason": str(e)})
            self.say(f"{time.strftime('%H:%M:%S')} could not observe the stack: {e}")
            new, _ = decide(state, Observation("unresolved", None, str(e)))
            return self._save(new)

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
        new, d = decide(state, event, alerts=self.alerts)
        if d.act is Act.BISECT:  # only now is the journal looked at (an SSH round trip per host)
            blocked = self._journal_block(dep)
            if blocked:
                new, d = decide(state, event, journal_open=True, alerts=self.alerts)
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
            self._save(acted(new, d.incident))  # remembered first: a crash mid-bisection never repeats it
            rec = self._bisect(dep, d)
            summary.bisections.append(rec)
            return acted(new, d.incident)
        return self._save(new)

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
