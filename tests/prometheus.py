"""A real Prometheus server (Debian's `prometheus` package) for the tests: started on a free
loopback port with its own storage, scraping the given targets every second.

Missing binary: the test is skipped when run by hand, and FAILS under scripts/test.sh or CI
(ENVBISECT_REQUIRE_SSHD or CI set), where scripts/test.sh has installed it.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import httpx
import pytest

try:
    from sshd import free_port
except ImportError:
    from tests.sshd import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def required() -> bool:
    return any(os.environ.get(v, "").strip().lower() not in ("", "0", "false", "no")
               for v in ("CI", "ENVBISECT_REQUIRE_SSHD"))


@dataclass
class PrometheusServer:
    url: str
    proc: subprocess.Popen
    workdir: Path

    def query(self, q: str) -> dict:
        return httpx.get(self.url + "/api/v1/query", params={"query": q}, timeout=5).json()

    def targets_up(self) -> int:
        doc = self.query("sum(up)")
        res = doc.get("data", {}).get("result") or []
        return int(float(res[0]["value"][1])) if res else 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_prometheus(workdir: Path, targets: Iterable[str], *, timeout: float = 30.0) -> PrometheusServer:
    """Prometheus scraping `targets` ("127.0.0.1:PORT", path /metrics) every 250 ms (a rate over a few seconds of load sees a dozen scrapes, not two); ready and with
    every target scraped up once when this returns."""
    if not os.access(PROMETHEUS, os.X_OK):
        msg = f"{PROMETHEUS} is missing (apt-get install prometheus, or run scripts/test.sh)"
        if required():
            pytest.fail(msg + " -- required because CI/ENVBISECT_REQUIRE_SSHD is set", pytrace=False)
        pytest.skip(msg)
    targets = list(targets)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 250ms\n  evaluation_interval: 1s\n"
                   "scrape_configs:\n  - job_name: sim\n    scrape_timeout: 200ms\n    static_configs:\n"
                   f"      - targets: [{', '.join(repr(t) for t in targets)}]\n")
    port = free_port()
    log = open(workdir / "prometheus.log", "wb")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = PrometheusServer(f"http://127.0.0.1:{port}", proc, workdir)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited {proc.returncode}: "
                               + (workdir / "prometheus.log").read_text()[-2000:])
        try:
            if httpx.get(server.url + "/-/ready", timeout=1).status_code == 200 and \
                    server.targets_up() == len(targets):
                return server
        except (httpx.HTTPError, ValueError, KeyError, IndexError):
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"prometheus did not scrape {targets} within {timeout:g} s: "
                       + (workdir / "prometheus.log").read_text()[-2000:])
