"""A small live deployment for CLI tests: a host tree (tests/hosttree.py) through `ssh = "local"`,
three services whose start/stop is `true` behind a real HTTP health endpoint, and a `command` probe.
Every run goes through the real CLI (`python -m envbisect.cli.app`) in a subprocess.

Each stack has its own deployment name: the lock and host journal (~/.envbisect) are per name and
shared with every other run on this machine.
"""
from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

from hosttree import make_tree

ENVBISECT = [sys.executable, "-m", "envbisect.cli.app"]


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *a):  # quiet
        pass


@contextlib.contextmanager
def health_endpoint() -> Iterator[str]:
    """A health URL that always answers 200."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/health"
    finally:
        srv.shutdown()
        srv.server_close()


class CliStack:
    """`probe` is the TOML of the probes; "{decode}" in it stands for the decode env file's path."""

    def __init__(self, root: Path, health_url: str, probe: str, *, name: str = "cli"):
        self.tree = make_tree(root / "host")
        self.name = f"{name}-{uuid.uuid4().hex[:8]}"
        pb = self.tree.playbook("local", name=self.name, extra=probe.replace("{decode}", str(self.tree.env("decode"))))
        text = re.sub(r"http://127\.0\.0\.1:\d/health", health_url, pb.read_text())
        text = text.replace("[restart]\n", "[restart]\npoll_interval_s = 0.1\nhealth_timeout_s = 10\n")
        pb.write_text(text)
        self.playbook = pb
        self.store = root / "store"

    def argv(self, *args: str) -> list[str]:
        return [*ENVBISECT, "-p", str(self.playbook), "--store", str(self.store), *args]

    def cli(self, *args: str, check: int | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
        r = subprocess.run(self.argv(*args), capture_output=True, timeout=300, env=env)
        if check is not None:
            assert r.returncode == check, r.stderr.decode(errors="replace")
        return r
