"""The simulated PD deployment: real sglang-router in front of simulated prefill/decode workers.

Every test that starts processes goes through the ``sim`` fixture, whose teardown stops every
service it started and checks that no process of the deployment is left behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import httpx
import pytest

from envbisect.sim import stack as simdep
from envbisect.sim import worker as simworker
from envbisect.sim.stack import SimDeployment, build

pytestmark = pytest.mark.sim

ROUTER = Path(sys.executable).parent / "sglang-router"
needs_router = pytest.mark.skipif(not ROUTER.exists() and shutil.which("sglang-router") is None,
                                  reason="sglang-router is not installed")

BODY = {"model": "default", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}
HANG_S = 2.0  # client timeout that tells a hang apart from an answer

LAYOUT = ["SGLANG_KV_PAGE_SIZE", "SGLANG_KV_CACHE_DTYPE"]


def _procs_under(root: Path) -> list[int]:
    """Pids of live processes whose command line mentions *root* (workers, proxy)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if str(root) in cmd and state != "Z" and int(d.name) != os.getpid():
            out.append(int(d.name))
    return out


@pytest.fixture
def sim(tmp_path):
    """Factory: ``sim(**build_kwargs)`` -> SimDeployment under tmp_path; all stopped at teardown."""
    made: list[SimDeployment] = []

    def make(name: str = "dep", **kw) -> SimDeployment:
        dep = build(tmp_path / name, **kw)
        made.append(dep)
        return dep

    yield make
    for dep in made:
        pids = dict(dep.running_pids())
        dep.stop_all()
        left = {s: p for s, p in pids.items() if os.path.exists(f"/proc/{p}")
                and (Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z")}
        assert not left, f"leaked processes: {left}"
        assert not _procs_under(dep.root), f"leaked processes under {dep.root}"


def chat(client: httpx.Client, url: str, timeout: float = 5.0) -> httpx.Response:
    return client.post(url, json=BODY, timeout=timeout)


def is_hang(url: str, timeout: float = HANG_S) -> bool:
    try:
        httpx.post(url, json=BODY, timeout=timeout)
    except httpx.TimeoutException:
        return True
    return False


# --------------------------------------------------------------------------------------------
# no processes
# --------------------------------------------------------------------------------------------

def test_rule_matching():
    rules = {"rules": [
        {"service": "decode", "when": {"X": "256"}, "fault": "hang"},
        {"service": "prefill", "when": {"A": "1", "B": "1"}, "fault": "5xx"},
        {"service": ["prefill", "decode"], "when": {"C": "*"}, "fault": "slow", "delay_s": 1.5},
        {"service": "decode", "when": {"D": None, "E": "1"}, "fault": "intermittent",
         "params": {"p": 0.2, "seed": 3}},
    ]}
    faults = lambda svc, env: [f["fault"] for f in simworker.active_faults(rules, svc, env)]  # noqa: E731
    assert faults("decode", {"X": "256"}) == ["hang"]
    assert faults("prefill", {"X": "256"}) == []
    assert faults("prefill", {"A": "1"}) == []                 # a pair: one alone is harmless
    assert faults("prefill", {"A": "1", "B": "1"}) == ["5xx"]
    assert faults("prefill", {"A": "1", "B": "2"}) == []
    assert faults("decode", {"C": ""}) == ["slow"]              # "*" = set to anything
    assert faults("decode", {"E": "1"}) == ["intermittent"]    # None = must be unset
    assert faults("decode", {"E": "1", "D": "x"}) == []
    f = simworker.active_faults(rules, "decode", {"C": "1", "E": "1"})
    assert f[0]["params"] == {"delay_s": 1.5} and f[1]["params"] == {"p": 0.2, "seed": 3}


def test_when_file_and_typed_env(tmp_path):
    v = tmp_path / "VERSION"
    v.write_text("v1\n")
    rule = {"rules": [{"service": "decode", "when_file": {"path": str(v), "contains": "v2-bad"},
                       "fault": "crash"}]}
    assert simworker.active_faults(rule, "decode", {}) == []
    v.write_text("v2-bad\n")
    assert [f["fault"] for f in simworker.active_faults(rule, "decode", {})] == ["crash"]
    spec = {"typed": {"SGLANG_KV_PAGE_SIZE": {"type": "int", "default": "1"}},
            "aliases": {"SGL_KV_CACHE_DTYPE": "SGLANG_KV_CACHE_DTYPE"}}
    env = simworker.effective_env({"SGLANG_KV_PAGE_SIZE": "sixty-four", "SGL_KV_CACHE_DTYPE": "fp8"}, spec)
    assert env["SGLANG_KV_PAGE_SIZE"] == "1" and env["SGLANG_KV_CACHE_DTYPE"] == "fp8"
    fp = simworker.layout_fingerprint
    assert fp({"SGLANG_KV_PAGE_SIZE": "64"}, LAYOUT) != fp({"SGLANG_KV_PAGE_SIZE": "32"}, LAYOUT)
    assert fp({"SGLANG_KV_PAGE_SIZE": "64", "OTHER": "1"}, LAYOUT) == fp({"SGLANG_KV_PAGE_SIZE": "64"}, LAYOUT)


@needs_router
def test_build_layout(tmp_path):
    dep = build(tmp_path / "d", env={"decode": {"SGLANG_KV_PAGE_SIZE": "32", "NEW_VAR": "a b"},
                                     "prefill": {"NCCL_DEBUG": None}},
                with_proxy_hang_after=3)
    root = dep.root
    pb = tomllib.loads(dep.playbook.read_text())
    assert pb["hosts"]["node1"]["ssh"] == "local"
    assert set(pb["services"]) == {"prefill", "decode", "router"}
    assert pb["restart"] == {"order": ["prefill", "decode", "router"], "health_timeout_s": 30,
                             "poll_interval_s": 0.2}
    assert pb["services"]["router"]["health"].endswith("/readiness")
    assert pb["services"]["decode"]["env_file"] == str(root / "conf/decode.serve-env")
    assert pb["repos"] == [{"host": "node1", "path": str(root / "src")}]
    assert pb["watch"]["paths"] == [str(root / "conf/extra")]
    assert len(list((root / "conf/extra").iterdir())) >= 2
    assert pb["probes"]["e2e"]["repeat"] == 3 and pb["probes"]["multi_round"]["rounds"] == 6
    assert pb["probes"]["burst"]["concurrency"] == 16
    assert pb["probes"]["client"]["kind"] == "multi_round"
    assert pb["client"]["url"] == f"http://127.0.0.1:{dep.ports['proxy']}/v1/chat/completions"
    json.loads(pb["probes"]["e2e"]["body"])
    dec = dep.env_file("decode").read_text()
    assert "export SGLANG_KV_PAGE_SIZE=32" in dec and "export NEW_VAR='a b'" in dec
    assert re.search(r"^export HF_TOKEN=hf_\w+$", dec, re.M)
    assert "NCCL_DEBUG" not in dep.env_file("prefill").read_text()
    assert "export SGLANG_KV_PAGE_SIZE=64" in (root / "backups" / simdep.BACKUP_DATE / "decode.serve-env").read_text()
    log = subprocess.run(["git", "-C", str(root / "src"), "log", "--oneline"], capture_output=True, text=True)
    assert log.returncode == 0 and "release" in log.stdout
    assert (dep.model_dir / "tokenizer.json").is_file()
    ports = list(dep.ports.values())
    assert len(set(ports)) == len(ports)
    dep.set_env("decode", "SGLANG_KV_PAGE_SIZE", "64")
    assert "export SGLANG_KV_PAGE_SIZE=64" in dep.env_file("decode").read_text()
    # bin/stop of a service never started is fine
    assert subprocess.run([str(dep.stop_script), "decode"], capture_output=True).returncode == 0


# --------------------------------------------------------------------------------------------
# live stack
# --------------------------------------------------------------------------------------------

@needs_router
def test_happy_path(sim):
    dep = sim()
    took = dep.start_all()
    assert took < 20
    with httpx.Client() as c:
        r = chat(c, dep.chat_url)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"].startswith("sim-decode")
        for _ in range(6):  # multi-round on one keep-alive connection
            assert chat(c, dep.chat_url).status_code == 200
        assert c.get(dep.router_url + "/readiness").json()["healthy_workers"] == 2
        r = c.post(dep.router_url + "/generate", json={"text": "hello", "sampling_params": {}}, timeout=5)
        assert r.status_code == 200 and r.json()["text"].startswith("sim-decode")
        info = c.get(dep.worker_url("decode") + "/server_info").json()
        assert info["disaggregation_mode"] == "decode" and info["model_path"] == str(dep.model_dir)
        assert "sglang:num_requests_total" in c.get(dep.worker_url("prefill") + "/metrics").text
    with httpx.Client(limits=httpx.Limits(max_connections=16)) as c:  # burst
        import concurrent.futures as cf
        with cf.ThreadPoolExecutor(16) as ex:
            codes = list(ex.map(lambda _: chat(c, dep.chat_url).status_code, range(16)))
        assert codes == [200] * 16
    # the worker was started with the env file's variables, plus the rules file
    environ = Path(f"/proc/{dep.pid('decode')}/environ").read_bytes().split(b"\0")
    assert b"SGLANG_KV_PAGE_SIZE=64" in environ
    assert b"ENVBISECT_SIM_RULES=" + str(dep.rules_path).encode() in environ
    assert not any(e.startswith(b"PYTEST_CURRENT_TEST=") for e in environ)   # clean env, as under systemd
    # start is idempotent
    out = subprocess.run([str(dep.start_script), "decode"], capture_output=True, text=True)
    assert out.returncode == 0 and "already running" in out.stdout
    pids = dep.running_pids()
    assert set(pids) == {"prefill", "decode", "router"}
    dep.stop_all()
    assert dep.running_pids() == {}
    assert all(not os.path.exists(f"/proc/{p}") or
               Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z" for p in pids.values())
    assert "received signal 15" in dep.log_text("decode")


@needs_router
def test_hang_fault(sim):
    rules = {"rules": [{"service": "decode", "when": {"SGLANG_SM120_MMA_TARGET_CTAS": "256"},
                        "fault": "hang"}], "kv_layout_vars": LAYOUT}
    dep = sim(rules=rules, env={"decode": {"SGLANG_SM120_MMA_TARGET_CTAS": "256"}})
    dep.start_all()
    assert is_hang(dep.chat_url)
    assert httpx.get(dep.health_url("decode")).status_code == 200       # health stays green
    assert httpx.get(dep.health_url("router")).status_code == 200
    assert "FAULT hang" in dep.log_text("decode")


@needs_router
def test_5xx_fault_pair(sim):
    rules = {"rules": [{"service": "prefill", "when": {"A": "1", "B": "1"}, "fault": "5xx"}],
             "kv_layout_vars": LAYOUT}
    dep = sim(rules=rules, env={"prefill": {"A": "1", "B": "1"}})
    dep.start_all()
    r = httpx.post(dep.chat_url, json=BODY, timeout=5)
    assert r.status_code >= 500
    # the router retried (5 attempts by default), every one failed on prefill
    assert dep.log_text("prefill").count("FAULT 5xx") >= 2
    assert "prefill aborted" in dep.log_text("decode")


@needs_router
def test_crash_fault(sim):
    rules = {"rules": [{"service": "decode", "when_file": {"path": "SRC/VERSION", "contains": "v2-bad"},
                        "fault": "crash"}], "kv_layout_vars": LAYOUT}
    dep = sim(rules=rules)
    rules["rules"][0]["when_file"]["path"] = str(dep.src_dir / "VERSION")
    dep.set_rules(rules)
    (dep.src_dir / "VERSION").write_text("v2-bad\n")
    dep.start("prefill")
    with pytest.raises(RuntimeError, match="not running"):
        dep.start("decode", timeout=10)
    assert not dep.is_running("decode")
    assert "FATAL: simulated start failure" in dep.log_text("decode")
    (dep.src_dir / "VERSION").write_text("v1.0.0\n")
    dep.start("decode")                                   # a stale pid file does not block start
    assert dep.is_running("decode")


@needs_router
def test_fail_after_reused(sim):
    rules = {"rules": [{"service": "decode", "when": {"SIM_REUSE_BUG": "1"}, "fault": "fail_after_reused",
                        "n": 2}], "kv_layout_vars": LAYOUT}
    dep = sim(rules=rules, env={"decode": {"SIM_REUSE_BUG": "1"}})
    dep.start_all()
    with httpx.Client() as c:
        assert chat(c, dep.chat_url).status_code == 200
        assert chat(c, dep.chat_url).status_code == 200
        with pytest.raises(httpx.TimeoutException):
            chat(c, dep.chat_url, timeout=HANG_S)
    assert "fail_after_reused n=2: request #3" in dep.log_text("decode")


def _intermittent_outcomes(url: str, n: int) -> list[str]:
    out = []
    with httpx.Client() as c:
        for _ in range(n):
            try:
                out.append(str(c.post(url + "/v1/chat/completions", json=BODY, timeout=0.4).status_code))
            except httpx.TimeoutException:
                out.append("hang")
    return out


@needs_router
def test_intermittent_is_seeded(sim):
    rules = {"rules": [{"service": "decode", "when": {"SIM_FLAKY": "1"}, "fault": "intermittent",
                        "p": 0.4, "seed": 11},
                       {"service": "prefill", "when": {"SIM_FLAKY": "1"}, "fault": "intermittent",
                        "p": 0.5, "seed": 5, "mode": "5xx"}], "kv_layout_vars": LAYOUT}
    dep = sim(rules=rules, env={"decode": {"SIM_FLAKY": "1"}, "prefill": {"SIM_FLAKY": "1"}})
    # the decode worker alone (no bootstrap info: it answers directly): 500s and hangs, reproducibly
    dep.start("decode")
    first = _intermittent_outcomes(dep.worker_url("decode"), 12)
    dep.restart("decode")
    second = _intermittent_outcomes(dep.worker_url("decode"), 12)
    assert first == second
    assert {"200", "500", "hang"} <= set(first)
    # through the router: prefill fails half the time; the router's retries hide some of it
    dep.stop("decode")
    dep.set_env("decode", "SIM_FLAKY", None)
    dep.start_all()
    codes = []
    with httpx.Client() as c:
        for _ in range(4):
            codes.append(chat(c, dep.chat_url).status_code)
    assert 200 in codes
    assert "FAULT intermittent 500" in dep.log_text("prefill")


@needs_router
def test_layout_mismatch_hangs(sim):
    dep = sim(env={"decode": {"SGLANG_KV_PAGE_SIZE": "32"}})
    dep.start_all()                                        # everything reports healthy ...
    assert is_hang(dep.chat_url)                           # ... but requests hang
    assert "KV layout mismatch" in dep.log_text("decode")


@needs_router
def test_restart_prefill_alone_trap(sim):
    dep = sim()
    dep.start_all()
    assert httpx.post(dep.chat_url, json=BODY, timeout=5).status_code == 200
    dep.restart("prefill")
    dep.wait_ready("router")
    assert httpx.get(dep.health_url("decode")).status_code == 200
    assert is_hang(dep.chat_url)
    assert "prefill restarted alone?" in dep.log_text("decode")
    dep.co_restart()
    assert httpx.post(dep.chat_url, json=BODY, timeout=5).status_code == 200


@needs_router
def test_proxy_hang_after_reused(sim):
    dep = sim(with_proxy_hang_after=2)
    dep.start_all()
    assert dep.is_running("proxy")
    url = dep.proxy_url + "/v1/chat/completions"
    with httpx.Client() as c:
        assert chat(c, url).status_code == 200
        assert chat(c, url).status_code == 200
        with pytest.raises(httpx.TimeoutException):
            chat(c, url, timeout=HANG_S)
    with httpx.Client() as fresh:                          # a new connection works
        assert chat(fresh, url).status_code == 200
    assert httpx.post(dep.chat_url, json=BODY, timeout=5).status_code == 200   # router is fine
    assert "HANG: request #3" in dep.log_text("proxy")
