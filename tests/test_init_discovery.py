"""Discovery (issue 12, part 4): `envbisect init --host HOST` over a real sshd, on the simulated PD
deployment (simulated workers behind the real sglang-router, which hides its arguments behind the
process title "sglang::router") and on stand-in `python -m sglang.launch_server` processes started
by a foreground shell script. The draft must load once its required TODOs are filled, name the
services, their env files and the repo, and the host must be exactly as it was."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from hosttree import git

from envbisect.inputs.playbook import load_playbook
from envbisect.sim.stack import build

ENVBISECT = [sys.executable, "-m", "envbisect.cli.app"]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*ENVBISECT, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def fingerprint(root: Path, skip: tuple[str, ...] = ("log",)) -> dict[str, tuple]:
    """Every file and folder below root (bytes, mode, mtime), .git included; logs skipped (the
    running servers write them, init or not)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if rel.parts and rel.parts[0] in skip:
            continue
        st = p.lstat()
        data = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else None
        out[str(rel)] = (data, st.st_mode, st.st_mtime_ns, st.st_size if data else None)
    return out


def fill_required(text: str) -> str:
    """What a person does with the draft: uncomment the key under each `# TODO (required)`."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        out.append(lines[i])
        if lines[i].startswith("# TODO (required)"):
            assert lines[i + 1].startswith("# ") and " = " in lines[i + 1], lines[i + 1]
            out.append(lines[i + 1][2:])
            i += 1
        i += 1
    return "\n".join(out) + "\n"


@pytest.fixture
def sim(tmp_path, sshd):
    s = build(tmp_path / "dep", ssh=sshd.alias, router_cli=True)  # started as users start it: `sglang-router launch`
    s.age_files()
    s.start_all()
    yield s
    s.stop_all()


def test_init_drafts_the_simulated_deployment_over_sshd_and_changes_nothing(tmp_path, sshd, sim):
    cfg = str(sshd.ssh_config)
    before = fingerprint(sim.root)
    pids = sim.running_pids()
    out = tmp_path / "draft" / "envbisect.toml"
    name = f"init-{uuid.uuid4().hex[:8]}"
    r = run("--ssh-config", cfg, "init", "--host", sshd.alias, "--under", str(sim.root), "--out", str(out),
            "--python", sys.executable, "--name", name, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["draft"] == str(out) and doc["todo_required"] == 0, doc
    svcs = doc["services"]
    assert list(svcs) == ["prefill", "decode", "router"]  # in co-restart order
    for s in ("prefill", "decode", "router"):
        got = svcs[s]
        assert got["pid"] == pids[s]
        assert got["env_file"] == str(sim.env_file(s)), (s, got)
        assert got["start"] == f"{sim.start_script} {s}" and got["stop"] == f"{sim.stop_script} {s}"
        assert got["health"] == sim.health_url(s)
        assert got["pid_file"] == str(sim.pid_file(s)) and got["log"] == str(sim.log_file(s))
    assert svcs["router"]["matcher"] == "sglang-router" and svcs["prefill"]["matcher"] == "envbisect simulator worker"
    assert svcs["router"]["metrics"] == f"http://127.0.0.1:{sim.ports['router_metrics']}/metrics"
    assert str(sim.src_dir) in [x["path"] for x in doc["repos"]]

    # the host is as it was: every byte, mode and mtime; the same processes, still running
    assert fingerprint(sim.root) == before
    assert sim.running_pids() == pids

    text = out.read_text()
    assert "# TODO (optional)" in text and "TODO (required)" not in text.split("\n[deployment]")[1]
    pb = load_playbook(out)  # loads as written (no required TODO left for this stack)
    assert pb.name == name and next(iter(pb.hosts.values())).ssh == sshd.alias
    assert {s: pb.services[s].env_file for s in pb.services} == {s: str(sim.env_file(s)) for s in sim.services}
    assert pb.restart.order == ("prefill", "decode", "router")
    # the engines start at once, the router after both (issue 38)
    assert pb.restart.start_groups == (("prefill", "decode"), ("router",))
    assert "prefill and decode start at once" in text
    assert any(rp.path == str(sim.src_dir) for rp in pb.repos)
    assert pb.backups == (str(sim.root / "backups") + "/*/{name}",)
    assert pb.probes["e2e"].url == sim.chat_url and pb.probes["e2e"].vantage == next(iter(pb.hosts))

    # and it works: a snapshot and the layered check through the draft, over the same sshd
    store = tmp_path / "store"
    r = run("-p", str(out), "--store", str(store), "--ssh-config", cfg, "snapshot", "--label", "known-good", "--json")
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)
    host = next(iter(snap["hosts"]))
    procs = snap["hosts"][host]["processes"]
    assert procs["prefill"] == procs["decode"] == "ok"  # found through the pid files of the draft
    assert procs["router"] == "unknown"  # running, but the router blanks its /proc/PID/environ
    r = run("-p", str(out), "--store", str(store), "--ssh-config", cfg, "verify", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    # .git included: the snapshot's `git status` must not refresh the checkout's index either
    assert fingerprint(sim.root) == before and sim.running_pids() == pids


FAKE_SERVER = '''\
"""A stand-in for `python -m sglang.launch_server`: /health and /v1/chat/completions."""
import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("--host", default="127.0.0.1")
ap.add_argument("--port", type=int, default=30000)
ap.add_argument("--served-model-name", default="default")
args, _ = ap.parse_known_args()


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({"ok": True})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send({"choices": [{"message": {"role": "assistant", "content": "hi"}}]})

    def log_message(self, *a):
        pass


ThreadingHTTPServer((args.host, args.port), H).serve_forever()
'''


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_stack(root: Path, port: int, launcher: list[str] | None = None) -> dict:
    """A checkout holding the `sglang` package, an env file, and a start script that sources it and
    runs the server in the foreground (it stays the server's parent). `launcher` is what runs
    `bash start-server.sh` (a CI job, a harness): by default the test process itself."""
    checkout = root / "checkout"
    pkg = checkout / "python" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(FAKE_SERVER)
    git(checkout, "init", "-q", "-b", "main")
    git(checkout, "add", ".")
    git(checkout, "commit", "-qm", "v1")
    (root / "conf").mkdir()
    env = root / "conf" / "server.env"
    env.write_text(f"export MODEL_SHARDS=8\nexport SGLANG_KV_PAGE_SIZE=64\nexport FAKE_PORT={port}\n")
    start = root / "start-server.sh"
    start.write_text(textwrap.dedent(f"""\
        #!/usr/bin/env bash
        # starts the server in the foreground
        cd "$(dirname "$0")"
        set -a
        . ./conf/server.env
        set +a
        export PYTHONPATH={checkout}/python
        {sys.executable} -m sglang.launch_server --host 127.0.0.1 --port "$FAKE_PORT" --served-model-name tiny-model
        echo "server exited"
        """))
    start.chmod(0o755)
    stop = root / "stop-server.sh"
    stop.write_text(f"#!/usr/bin/env bash\npkill -f -- 'sglang.launch_server --host 127.0.0.1 --port {port} ' || true\n")
    stop.chmod(0o755)
    p = subprocess.Popen([*(launcher or []), "bash", str(start)], cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline or p.poll() is not None:
                raise RuntimeError("the fake server did not start")
            time.sleep(0.1)
    return {"root": root, "checkout": checkout, "env": env, "start": start, "stop": stop, "proc": p, "port": port}


@pytest.fixture
def stacks(tmp_path):
    made = []
    try:
        for name in ("a", "b"):
            made.append(make_stack(tmp_path / f"stack-{name}", free_port()))
        yield made
    finally:
        for s in made:
            try:
                os.killpg(s["proc"].pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            s["proc"].wait(timeout=10)


def test_init_on_sglang_launch_server_started_by_a_foreground_script(tmp_path, sshd, stacks):
    cfg = str(sshd.ssh_config)
    a = stacks[0]
    before = {s["root"]: fingerprint(s["root"]) for s in stacks}
    base = ["--ssh-config", cfg, "init", "--host", sshd.alias, "--python", sys.executable]

    # two stacks on the host: init will not mix them into one co-restart
    r = run(*base, "--out", str(tmp_path / "x.toml"))
    assert r.returncode == 2 and "pick one stack with --under DIR" in r.stderr, r.stderr
    assert str(stacks[0]["root"]) in r.stderr and str(stacks[1]["root"]) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.toml").exists()

    out = tmp_path / "envbisect.toml"
    r = run(*base, "--under", str(a["root"]), "--out", str(out), "--name", f"fake-{uuid.uuid4().hex[:6]}")
    assert r.returncode == 0, r.stderr
    assert "1 TODO (required)" in r.stdout, r.stdout
    text = out.read_text()
    with pytest.raises(Exception):
        load_playbook(out)  # start is still a TODO: the draft does not load yet
    assert f'env_file = "{a["env"]}"' in text
    assert f"stop = \"{a['stop']}\"" in text
    assert f'health = "http://127.0.0.1:{a["port"]}/health"' in text
    # the foreground script: start must return, so the draft says how to run it detached
    todo = text.split("# TODO (required): ")[1].splitlines()
    assert "runs in the foreground" in todo[0] and todo[1].startswith("# start = ") and "setsid nohup" in todo[1]
    assert f'path = "{a["checkout"]}"' in text  # the checkout of module sglang (PYTHONPATH), read without git
    assert "tiny-model" in text  # --served-model-name, for the probe's body

    assert {s["root"]: fingerprint(s["root"]) for s in stacks} == before  # init changed nothing
    out.write_text(fill_required(text))
    pb = load_playbook(out)
    svc = pb.services["server"]
    assert svc.env_file == str(a["env"]) and "setsid nohup" in svc.start and svc.start.endswith("&")
    assert [rp.path for rp in pb.repos] == [str(a["checkout"])]
    assert pb.probes["e2e"].url == f"http://127.0.0.1:{a['port']}/v1/chat/completions"

    r = run("-p", str(out), "--store", str(tmp_path / "store"), "--ssh-config", cfg, "snapshot", "--json")
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)
    assert str(a["checkout"]) in list(snap["hosts"].values())[0]["repos"]

    # the host named by an Ansible inventory: the draft keeps naming it that way
    inv = tmp_path / "inventory.json"
    inv.write_text(json.dumps({"_meta": {"hostvars": {"gpu1": {"ansible_host": sshd.alias}}},
                               "all": {"children": ["ungrouped"]}, "ungrouped": {"hosts": ["gpu1"]}}))
    out2 = tmp_path / "from-inventory.toml"
    r = run("--ssh-config", cfg, "--inventory", str(inv), "init", "--host", "gpu1", "--python", sys.executable,
            "--under", str(a["root"]), "--out", str(out2))
    assert r.returncode == 0, r.stderr
    out2.write_text(fill_required(out2.read_text()))
    pb2 = load_playbook(out2)
    assert pb2.hosts["gpu1"].inventory == "gpu1" and pb2.inventory_file == str(inv)
    r = run("-p", str(out2), "--store", str(tmp_path / "store2"), "--ssh-config", cfg, "snapshot")
    assert r.returncode == 0, r.stderr  # bound through the [inventory] file the draft names
    assert all(s["proc"].poll() is None for s in stacks)


def test_init_does_not_take_the_repo_of_whatever_started_the_start_script(tmp_path, sshd):
    """The chain of CI: `bash ci/run.sh` in a checkout of its own runs a Python harness, which runs
    `bash start-server.sh`, which runs the server. Only the shells that start the server itself are
    its start scripts: a shell above a program that is not a shell or a wrapper (nohup, sudo...)
    started that program, not the server, and its checkout is not the server's code."""
    ci = tmp_path / "ci-checkout"
    (ci / "ci").mkdir(parents=True)
    harness = ci / "ci" / "run.sh"
    harness.write_text(f'#!/usr/bin/env bash\ncd "$(dirname "$0")/.."\nexec {sys.executable} -c '
                       '"import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))" "$@"\n')
    harness.chmod(0o755)
    git(ci, "init", "-q", "-b", "main")
    git(ci, "add", ".")
    git(ci, "commit", "-qm", "ci")
    # bash run.sh stays the harness's parent: no exec in a subshell, so the chain is
    # bash run.sh -> python harness -> bash start-server.sh -> python -m sglang.launch_server
    harness.write_text(harness.read_text().replace("exec ", ""))
    stack = make_stack(tmp_path / "stack", free_port(), launcher=["bash", str(harness)])
    try:
        r = run("--ssh-config", str(sshd.ssh_config), "init", "--host", sshd.alias, "--python", sys.executable,
                "--under", str(stack["root"]), "--out", "-", "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert [x["path"] for x in doc["repos"]] == [str(stack["checkout"])], doc["repos"]
    finally:
        os.killpg(stack["proc"].pid, signal.SIGTERM)
        stack["proc"].wait(timeout=10)


def test_init_errors_are_one_line(tmp_path, sshd, stacks):
    cfg = str(sshd.ssh_config)
    base = ["--ssh-config", cfg, "init", "--host", sshd.alias, "--python", sys.executable]
    empty = tmp_path / "nothing-runs-here"
    empty.mkdir()
    r = run(*base, "--under", str(empty), "--out", str(tmp_path / "d.toml"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no SGLang server or router is running under" in r.stderr and "--match REGEX" in r.stderr
    existing = tmp_path / "envbisect.toml"
    existing.write_text("# mine\n")
    r = run(*base, "--under", str(stacks[0]["root"]), "--out", str(existing))
    assert r.returncode == 2 and "--force" in r.stderr and existing.read_text() == "# mine\n"
    r = run(*base, "--match", "([", "--out", "-")
    assert r.returncode == 2 and "--match" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run("--ssh-config", cfg, "init", "--host", "nosuchhost.invalid", "--out", "-")
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # --out - prints the draft (nothing is written)
    r = run(*base, "--under", str(stacks[1]["root"]), "--out", "-")
    assert r.returncode == 0 and r.stdout.startswith("# envbisect playbook draft") and "[services.server]" in r.stdout


def test_init_proposes_the_engines_as_one_start_group_only_when_both_roles_run():
    from envbisect.runs.playbook_draft import Service as Found, start_order

    def svcs(*roles: str) -> list[Found]:
        return [Found(f"{r}{i}" if roles.count(r) > 1 else r, r, 100 + i, "m", None) for i, r in enumerate(roles)]

    assert start_order(svcs("prefill", "decode", "router")) == [["prefill", "decode"], "router"]
    assert start_order(svcs("prefill", "prefill", "decode", "router")) == [["prefill0", "prefill1", "decode"],
                                                                         "router"]
    # no pair: nothing to start side by side that the draft can justify
    assert start_order(svcs("decode", "router")) == ["decode", "router"]
    assert start_order(svcs("server")) == ["server"]
