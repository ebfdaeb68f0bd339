"""A real directory tree that looks like a serving host: serve-env files, a deployed git repo,
watched config files. Used by the snapshot/diff tests through both `ssh = "local"` and a real sshd."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

PREFILL = """\
# prefill engine (GPU0-3)
export CUDA_VISIBLE_DEVICES=0,1,2,3
export SGLANG_KV_PAGE_SIZE=64
export NCCL_IB_HCA="mlx5_0,mlx5_1"
export HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123
export SGLANG_DISAGGREGATION_BOOTSTRAP_PORT=8998
"""
DECODE = """\
# decode engine (GPU4-7)
export CUDA_VISIBLE_DEVICES=4,5,6,7
export SGLANG_KV_PAGE_SIZE=64
export NCCL_IB_HCA="mlx5_0,mlx5_1"
export MAX_TOTAL_TOKENS=65536
export HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123
"""
ROUTER = """\
# router
export RUST_LOG=info
export ROUTER_REQUEST_TIMEOUT_SECS=600
"""


def git(repo: Path, *args: str, env: dict | None = None) -> str:
    e = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
         "GIT_COMMITTER_EMAIL": "t@example.com", **(env or {})}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=e).stdout.strip()


@dataclass
class HostTree:
    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "conf"

    @property
    def repo(self) -> Path:
        return self.root / "src"

    @property
    def watch(self) -> Path:
        return self.root / "watch"

    def env(self, service: str) -> Path:
        return self.conf / f"{service}.serve-env"

    def edit(self, service: str, text: str) -> None:
        self.env(service).write_text(text)

    def commit(self, message: str, content: str) -> str:
        (self.repo / "VERSION").write_text(content)
        git(self.repo, "commit", "-qam", message)
        return git(self.repo, "rev-parse", "HEAD")

    def playbook(self, ssh: str = "local", *, name: str = "testdep", backups: list[str] | None = None,
                 pid_files: bool = False, extra: str = "") -> Path:
        services = ""
        for s, port in (("prefill", 1), ("decode", 2), ("router", 3)):
            pid = f'pid_file = "{self.root}/run/{s}.pid"\n' if pid_files else ""
            services += textwrap.dedent(f"""
                [services.{s}]
                host = "node1"
                env_file = "{self.env(s)}"
                start = "true"
                stop = "true"
                health = "http://127.0.0.1:{port}/health"
                """) + pid
        bk = ", ".join(f'"{b}"' for b in (backups or []))
        text = textwrap.dedent(f"""
            [deployment]
            name = "{name}"

            [hosts.node1]
            ssh = "{ssh}"
            python = "{sys.executable}"
            """) + services + textwrap.dedent(f"""
            [restart]
            order = ["prefill", "decode", "router"]

            [[repos]]
            host = "node1"
            path = "{self.repo}"

            [watch]
            paths = ["{self.watch}"]

            [baseline]
            backups = [{bk}]
            """) + extra
        path = self.root / f"envbisect-{name}.toml"
        path.write_text(text)
        return path


def make_tree(root: Path, n_watched: int = 20) -> HostTree:
    t = HostTree(root)
    t.conf.mkdir(parents=True)
    (root / "run").mkdir()
    t.env("prefill").write_text(PREFILL)
    t.env("decode").write_text(DECODE)
    t.env("router").write_text(ROUTER)
    t.repo.mkdir()
    git(t.repo, "init", "-q", "-b", "main")
    (t.repo / "VERSION").write_text("v1\n")
    git(t.repo, "add", ".")
    git(t.repo, "commit", "-qm", "v1")
    t.watch.mkdir()
    (t.watch / "sub").mkdir()
    for i in range(n_watched):
        d = t.watch if i % 2 else t.watch / "sub"
        (d / f"cfg{i:02d}.yaml").write_text(f"setting_{i}: {i}\n")
    # things the walk must not enter or follow
    (t.watch / ".git").mkdir()
    (t.watch / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    outside = root / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("should not be walked\n")
    os.symlink(outside, t.watch / "linkdir")
    return t
