"""What an env file is evaluated in, and as whom (issue 22, F4).

The collector (snapshot) and the post-write check (env_check) source a service's env file with bash in
the service's recorded start environment. That environment is the service user's to choose: BASH_ENV,
ENV, LD_PRELOAD and an `env` early on its PATH ran as the ssh user (often root) at the next snapshot.
Here they do not, what bash makes of the file is unchanged, and as root the file is evaluated with the
privileges of the user the service runs as. Real bash, a real preloadable library, real processes,
through `ssh = "local"` and a real sshd."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from envbisect.hosts.journal import HostEditor
from envbisect.inputs.playbook import load_playbook
from envbisect.runs.deployment import ConnectOptions, Deployment
from envbisect.state.configuration import target_state
from envbisect.state.store import Store

from hosttree import make_tree

pytestmark = pytest.mark.skipif(not shutil.which("bash") or not shutil.which("gcc"), reason="bash or gcc missing")

# a library that, preloaded into anything but the service itself, says so in MARK
EVIL_C = r"""
#include <stdio.h>
#include <string.h>
extern char *program_invocation_short_name;
__attribute__((constructor)) static void evil(void) {
    if (!strcmp(program_invocation_short_name, "sleep") || !strcmp(program_invocation_short_name, "setpriv"))
        return;
    FILE *f = fopen(MARK, "a");
    if (f) { fprintf(f, "LD_PRELOAD in %s\n", program_invocation_short_name); fclose(f); }
}
"""

ENV_FILE = """\
# decode engine
export CUDA_VISIBLE_DEVICES=4,5,6,7
export LIBS="/opt/nccl/lib:$LD_LIBRARY_PATH"
export PP="${PYTHONPATH}:/x"
export HAS_PRELOAD="${LD_PRELOAD:+yes}"
export WORKERS=$(nproc)
export WHO=$(id -u)
export SGLANG_KV_PAGE_SIZE=64
"""


@pytest.fixture(params=["local", "ssh"])
def via(request):
    if request.param == "local":
        return "local", None
    server = request.getfixturevalue("sshd")
    return server.alias, str(server.ssh_config)


@pytest.fixture
def traps(tmp_path):
    """BASH_ENV/ENV scripts, a preloadable library and an `env` on PATH, each writing to MARK when run."""
    d = Path(tempfile.mkdtemp(prefix="envbisect-traps-"))
    d.chmod(0o755)
    mark = d / "MARK"
    evil_sh = d / "evil.sh"
    evil_sh.write_text(f'echo "BASH_ENV or ENV ran" >> {mark}\n')
    src = d / "evil.c"
    src.write_text(EVIL_C)
    so = d / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", f'-DMARK="{mark}"', "-o", str(so), str(src)], check=True)
    evilbin = d / "bin"
    evilbin.mkdir()
    (evilbin / "env").write_text(f'#!/bin/sh\necho "env on PATH ran" >> {mark}\nexec /usr/bin/env "$@"\n')
    (evilbin / "env").chmod(0o755)
    env = {"PATH": f"{evilbin}:/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "BASH_ENV": str(evil_sh),
           "ENV": str(evil_sh), "LD_PRELOAD": str(so), "LD_LIBRARY_PATH": "/opt/cuda/lib", "PYTHONPATH": "/srv/py"}
    yield mark, env
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def tree():
    """A host tree every user can read (a service user's evaluation must be able to reach the file)."""
    d = Path(tempfile.mkdtemp(prefix="envbisect-evaltree-"))
    d.chmod(0o755)
    t = make_tree(d / "host")
    t.edit("decode", ENV_FILE)
    t.name = "ev-" + uuid.uuid4().hex[:8]
    t.procs = []
    yield t
    for p in t.procs:
        p.kill()
        p.wait()
    shutil.rmtree(d, ignore_errors=True)


def nproc() -> str:
    return subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout.strip()


def start_service(tree, start_env: dict, as_user: str | None = None) -> None:
    """The decode service as its start script left it: the start environment plus what the file gave it.
    Started without bash, so that nothing in the start environment runs at start."""
    values = {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "LIBS": "/opt/nccl/lib:" + start_env["LD_LIBRARY_PATH"],
              "PP": start_env["PYTHONPATH"] + ":/x", "HAS_PRELOAD": "yes", "WORKERS": nproc(), "WHO": "0",
              "SGLANG_KV_PAGE_SIZE": "64"}
    cmd = ["sleep", "120"]
    if as_user:
        cmd = ["setpriv", f"--reuid={as_user}", f"--regid={as_user}", "--clear-groups", *cmd]
    proc = subprocess.Popen(cmd, env={**start_env, **values}, cwd="/")
    tree.procs.append(proc)
    (tree.root / "run" / "decode.pid").write_text(f"{proc.pid}\n")
    for _ in range(100):  # until sleep runs (setpriv has exec'd)
        try:
            if Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"sleep"):
                break
        except OSError:
            pass
        time.sleep(0.02)


def open_dep(tree, via, store) -> Deployment:
    ssh, cfg = via
    pb = load_playbook(tree.playbook(ssh, pid_files=True, name=tree.name))
    return Deployment(pb, Store(store), ConnectOptions(ssh_config=cfg, attempts=1))


def test_snapshot_runs_nothing_of_the_start_environment_and_evaluates_as_before(tree, traps, via, tmp_path):
    mark, start_env = traps
    start_service(tree, start_env)
    with open_dep(tree, via, tmp_path / "store") as dep:
        snap = dep.snapshot("noon")
    proc = snap.hosts["node1"].processes["decode"]
    assert not mark.exists(), mark.read_text()
    assert proc.file_eval_error is None
    assert dict(proc.file_eval) == {
        "CUDA_VISIBLE_DEVICES": "4,5,6,7", "LIBS": "/opt/nccl/lib:/opt/cuda/lib", "PP": "/srv/py:/x",
        "HAS_PRELOAD": "yes", "WORKERS": nproc(), "WHO": str(os.geteuid()), "SGLANG_KV_PAGE_SIZE": "64"}


def test_post_write_check_runs_nothing_of_the_start_environment(tree, traps, via, tmp_path):
    mark, start_env = traps
    start_service(tree, start_env)
    with open_dep(tree, via, tmp_path / "store") as dep:
        dep.snapshot("noon")
        tree.edit("decode", ENV_FILE.replace("PAGE_SIZE=64", "PAGE_SIZE=128"))
        diff = dep.diff(against="noon")
        assert {d.id for d in diff.deltas} == {"decode:SGLANG_KV_PAGE_SIZE"}
        ed = HostEditor(dep.playbook, dep.transports, tmp_path / "run", "run-1")
        ed.lock()
        try:
            orig = ed.begin({("node1", str(tree.env("decode")))}, set())
            base = target_state(orig, diff.deltas, set(), diff.contents)
            assert base.checks[("node1", str(tree.env("decode")))].env is not None  # sourced in the start env
            ed.apply(base)  # the check passes: what bash makes of it is what the baseline should give
            assert tree.env("decode").read_text() == ENV_FILE
            ed.restore()
            ed.finish()
        finally:
            ed.unlock()
    assert not mark.exists(), mark.read_text()


needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="dropping privileges needs root and setpriv")


@needs_root
def test_as_root_the_file_is_evaluated_as_the_service_user(tree, traps, via, tmp_path):
    mark, start_env = traps
    start_service(tree, start_env, as_user="65534")
    with open_dep(tree, via, tmp_path / "store") as dep:
        proc = dep.snapshot("noon").hosts["node1"].processes["decode"]
    assert proc.file_eval_error is None
    assert proc.file_eval["WHO"] == "65534" and proc.file_eval["LIBS"] == "/opt/nccl/lib:/opt/cuda/lib"
    assert not mark.exists()


@needs_root
def test_a_root_only_file_is_evaluated_as_root_and_a_service_owned_unreadable_one_not_at_all(tree, traps, via,
                                                                                            tmp_path):
    """The service user cannot read a root-owned 0600 file: it cannot have written it either, so root
    evaluates it (scrubbed). A file the service user owns and made unreadable is not evaluated by root;
    one that folders only root can enter keep the user from is."""
    mark, start_env = traps
    start_service(tree, start_env, as_user="65534")
    env = tree.env("decode")
    env.chmod(0o600)
    with open_dep(tree, via, tmp_path / "store") as dep:
        proc = dep.snapshot("a").hosts["node1"].processes["decode"]
        assert proc.file_eval_error is None and proc.file_eval["WHO"] == "0"
        os.chown(env, 65534, 65534)
        env.chmod(0o000)
        proc = dep.snapshot("b").hosts["node1"].processes["decode"]
        assert proc.file_eval is None and "65534" in (proc.file_eval_error or "")
        # readable by its owner, but in a folder only root can enter and write: root evaluates it
        env.chmod(0o644)
        env.parent.chmod(0o700)
        try:
            proc = dep.snapshot("c").hosts["node1"].processes["decode"]
        finally:
            env.parent.chmod(0o755)
        assert proc.file_eval_error is None and proc.file_eval["WHO"] == "0"
    assert not mark.exists()


@needs_root
def test_post_write_check_evaluates_as_the_files_owner(tree, traps, via, tmp_path):
    """The check after a write compares what bash makes of the file with what the snapshot recorded
    (evaluated as the service user): run as root, a value built from $(id -u) would not match."""
    mark, start_env = traps
    env = tree.env("decode")
    env.write_text(ENV_FILE + "export STAMP=1-$(id -u)\n")
    os.chown(env, 65534, 65534)
    start_service(tree, start_env, as_user="65534")
    with open_dep(tree, via, tmp_path / "store") as dep:
        proc = dep.snapshot("noon").hosts["node1"].processes["decode"]
        assert proc.file_eval["STAMP"] == "1-65534"
        env.write_text(ENV_FILE + "export STAMP=2-$(id -u)\n")
        diff = dep.diff(against="noon")
        assert {d.id for d in diff.deltas} == {"decode:STAMP"}
        ed = HostEditor(dep.playbook, dep.transports, tmp_path / "run", "run-1")
        ed.lock()
        try:
            orig = ed.begin({("node1", str(env))}, set())
            base = target_state(orig, diff.deltas, set(), diff.contents)
            assert {e.key: e.value for e in base.checks[("node1", str(env))].expect}["STAMP"] == "1-65534"
            ed.apply(base)  # EnvCheckFailed if bash ran as root (1-0)
            ed.restore()
            ed.finish()
        finally:
            ed.unlock()
    assert not mark.exists()
