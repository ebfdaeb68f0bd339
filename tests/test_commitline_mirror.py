"""The local mirror of a deployed repo, fetched over the real sshd, and its first-parent line (GitPython)."""
from __future__ import annotations

import subprocess

import pytest

from envbisect.hosts.transport import LocalTransport, SSHTransport
from envbisect.inputs.playbook import Host
from envbisect.state.commitline import NotALine, first_parent_line, mirror


def _git(repo, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=Ann", "-c", "user.email=ann@x",
                           "-c", "commit.gpgsign=false", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def _repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "VERSION").write_text("v1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    for i in range(1, 4):
        (repo / f"f{i}").write_text(f"{i}\n")
        _git(repo, "add", ".")
        _git(repo, "commit", "-qm", f"commit {i}")
    # a merge on the first-parent line: its side branch's commits are not steps of their own
    _git(repo, "checkout", "-qb", "side", "HEAD~1")
    (repo / "side").write_text("s\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "side work")
    _git(repo, "checkout", "-q", "main")
    _git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    return repo, base, _git(repo, "rev-parse", "HEAD")


def _line(transport, repo, base, head):
    before = (_git(repo, "rev-parse", "HEAD"), _git(repo, "for-each-ref"), _git(repo, "status", "--porcelain"))
    with mirror(transport, str(repo), head) as m:
        line = first_parent_line(m, base, head)
    assert (_git(repo, "rev-parse", "HEAD"), _git(repo, "for-each-ref"), _git(repo, "status", "--porcelain")) == before
    return line


@pytest.mark.parametrize("over_ssh", [False, True])
def test_first_parent_line_oldest_first_with_subject_author_files(tmp_path, request, over_ssh):
    repo, base, head = _repo(tmp_path)
    if over_ssh:
        sshd = request.getfixturevalue("sshd")
        transport = SSHTransport(Host("node1", sshd.alias), ssh_config=str(sshd.ssh_config))
    else:
        transport = LocalTransport()
    line = _line(transport, repo, base, head)
    assert [c.subject for c in line] == ["commit 1", "commit 2", "commit 3", "merge side"]
    assert line[0].files == ("f1",) and line[0].author == "Ann <ann@x>" and not line[0].merge
    assert line[-1].merge and line[-1].files == ("side",) and line[-1].sha == head


def test_a_rewind_is_not_a_line(tmp_path):
    repo, base, head = _repo(tmp_path)
    with pytest.raises(NotALine):
        _line(LocalTransport(), repo, head, base)
