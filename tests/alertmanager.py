"""A real Prometheus Alertmanager (Debian's `prometheus-alertmanager`) for tests: started on a free
loopback port with a route whose receiver is a webhook to `envbisect watch --listen`, alerts pushed
into it through its API (POST /api/v2/alerts), as Prometheus pushes them.

ALERTMANAGER_YML is the receiver config docs/guide.md shows ("Running unattended"); the test runs it
with the watch's URL in place of http://127.0.0.1:9798/ and its own secret file in place of
/etc/prometheus/envbisect-webhook.secret (tests/test_watch_sim.py checks the guide).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from envbisect.sim.ports import free_port

BINARY = "prometheus-alertmanager"

ALERTMANAGER_YML = """\
route:
  receiver: envbisect
  group_by: [alertname]
  group_wait: 5s
  group_interval: 5m
  repeat_interval: 4h
receivers:
  - name: envbisect
    webhook_configs:
      - url: {url}
        send_resolved: false
        http_config:
          authorization:
            type: Bearer
            credentials_file: {secret_file}
"""


def alertmanager_binary() -> str | None:
    return shutil.which(BINARY) or (f"/usr/bin/{BINARY}" if os.access(f"/usr/bin/{BINARY}", os.X_OK) else None)


@dataclass
class Alertmanager:
    url: str
    proc: subprocess.Popen
    log: Path

    def push(self, alertname: str, **labels: str) -> dict:
        """Fire an alert now (as Prometheus does); what was sent."""
        alert = {"labels": {"alertname": alertname, **labels},
                 "annotations": {"summary": f"{alertname} (envbisect test)"},
                 "startsAt": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")}
        req = urllib.request.Request(f"{self.url}/api/v2/alerts", data=json.dumps([alert]).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200, r.status
        return alert

    def alerts(self) -> list[dict]:
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_alertmanager(root: Path, webhook_url: str, secret_file: str) -> Alertmanager:
    binary = alertmanager_binary()
    assert binary, f"{BINARY} is missing"
    root.mkdir(parents=True, exist_ok=True)
    cfg = root / "alertmanager.yml"
    cfg.write_text(ALERTMANAGER_YML.format(url=webhook_url, secret_file=secret_file))
    port = free_port()
    log = root / "alertmanager.log"
    proc = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.path={root / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                             "--log.level=debug"],
                            stdout=subprocess.DEVNULL, stderr=log.open("wb"), start_new_session=True)
    am = Alertmanager(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"alertmanager exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{am.url}/-/ready", timeout=2) as r:
                if r.status == 200:
                    return am
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    am.stop()
    raise RuntimeError(f"alertmanager not ready after 30 s: {log.read_text()[-2000:]}")
