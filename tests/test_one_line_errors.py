"""Issue 8, item 5: one clear line and a documented exit status, never a traceback.

Every reproduction from the issue runs the real CLI (`python -m envbisect.cli`) in a subprocess and
checks stdout/stderr byte for byte: one line on stderr, no "Traceback", the status from
`envbisect.errors.ExitStatus`. The last-resort handler (a bug) writes a private crash log with
secrets masked and prints one line pointing to it; `--traceback` shows the traceback instead.
"""
from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from envbisect.errors import ExitStatus, PlaybookError
from envbisect.playbook import PROBE_REPEAT_MAX, load_playbook
from envbisect.search import Search

ENVBISECT = [sys.executable, "-m", "envbisect.cli"]


def run_cli(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*ENVBISECT, *args], capture_output=True, text=True, env=env, timeout=300, **kw)


def one_line(r: subprocess.CompletedProcess) -> str:
    """The whole stderr, which must be exactly one line and no traceback."""
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("envbisect: "), lines[0]
    return lines[0]


# --- playbook: probe settings are checked at load ------------------------------------------------

PROBE_HEAD = """
[hosts.a]
ssh = "local"
[services.x]
host = "a"
env_file = "/tmp/x.env"
start = "true"
stop = "true"
health = "http://127.0.0.1:1/health"
[probes.p]
"""


@pytest.mark.parametrize("probe,needle", [
    ('kind = "concurrent"\nurl = "http://127.0.0.1:1/"\nconcurrency = 0', "probes.p.concurrency: must be between 1 and"),
    ('kind = "multi_round"\nurl = "http://127.0.0.1:1/"\nrounds = 0', "probes.p.rounds: must be between 1 and"),
    ('kind = "http"\nurl = "http://127.0.0.1:1/"\nexpect_body = "(unclosed"',
     "probes.p.expect_body: is not a valid regular expression"),
    (f'kind = "command"\ncommand = "true"\nrepeat = {PROBE_REPEAT_MAX + 1}', "probes.p.repeat: must be between 1 and"),
    ('kind = "command"\ncommand = "true"\nrepeat = 0', "probes.p.repeat: must be between 1 and"),
    ('kind = "http"\nurl = "http://127.0.0.1:1/"\ntimeout_s = 0', "probes.p.timeout_s: must be > 0"),
    ('kind = "http"\nurl = "http://127.0.0.1:1/"\nexpect_status = 20', "probes.p.expect_status: must be an HTTP status"),
    ('kind = "http"\nurl = "http://127.0.0.1:1/"\nmethod = "GET /x"', "probes.p.method: must be an HTTP method"),
    ('kind = "http"\nurl = "127.0.0.1:1/"', "probes.p.url: must be an http(s) URL"),
])
def test_bad_probe_settings_are_refused_at_load(tmp_path, probe, needle):
    pb = tmp_path / "pb.toml"
    pb.write_text(PROBE_HEAD + probe + "\n")
    with pytest.raises(PlaybookError, match="probes.p"):
        load_playbook(pb)
    r = run_cli("-p", str(pb), "--store", str(tmp_path / "store"), "bisect", "--since", "noon")
    assert r.returncode == ExitStatus.USAGE
    assert needle in one_line(r)
    assert not (tmp_path / "store" / "runs").exists()  # refused before any run, lock or journal


def test_probe_repeat_limit_is_the_search_cap():
    # a probe repeated more often than the search may probe a trial was found only mid-run (after
    # the lock and the journal were taken, leaving the hosts locked): the playbook refuses it now
    assert PROBE_REPEAT_MAX == inspect.signature(Search).parameters["max_probes"].default
    Search(["a"], base_probes=PROBE_REPEAT_MAX)  # the largest accepted value is one the search takes
