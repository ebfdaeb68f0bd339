"""The local mirror of a deployed repo, fetched over the real sshd, and its first-parent line (GitPython)."""
from __future__ import annotations

import subprocess

import pytest

from envbisect.errors import RemoteError
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


@pytest.mark.local
def test_a_sha_the_host_reports_reaches_git_only_as_40_or_64_hex(tmp_path):
    """A host reports the HEADs: an option (`--output=FILE`), a name or a short sha is refused before
    git sees it, and what git refuses becomes the commit line's own note (NotALine), never an
    uncaught CalledProcessError / UnsafeOptionError after the verdict."""
    repo, base, head = _repo(tmp_path)
    out = tmp_path / "written-by-git"
    t = LocalTransport()
    for bad in (f"--output={out}", "main", head[:12], head + "\n" + base, head.upper() + "x", ""):
        with pytest.raises(NotALine, match="not a commit id"):
            with mirror(t, str(repo), bad):
                pass
        with mirror(t, str(repo), head) as m:
            with pytest.raises(NotALine, match="not a commit id"):
                first_parent_line(m, bad, head)
            with pytest.raises(NotALine, match="not a commit id"):
                first_parent_line(m, base, bad)
    assert not out.exists()
    missing = "0123456789abcdef" * 2 + "01234567"  # 40 hex the host's pack does not hold
    with pytest.raises(RemoteError, match="bad object"):  # the host's git says so: the line's note too
        with mirror(t, str(repo), missing):
            pass

    class PacksAnotherHead:  # a host that answers with a pack of another commit than the HEAD it reported
        host = "node1"

        def run(self, cmd, stdin=None, timeout=None):  # noqa: ANN001
            return t.run(cmd, stdin=(head + "\n").encode(), timeout=timeout)

    with pytest.raises(NotALine, match="is not in the mirror"):  # git's update-ref refuses: no CalledProcessError
        with mirror(PacksAnotherHead(), str(repo), missing):
            pass
    with mirror(t, str(repo), head) as m:
        with pytest.raises(NotALine):
            first_parent_line(m, missing, head)


@pytest.mark.local  # GitPython runs `git version` on import
def test_the_gitpython_required_refuses_options():
    import tomllib
    from pathlib import Path

    import git

    deps = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    (req,) = [d for d in deps["dependencies"] if d.lower().startswith("gitpython")]
    assert req.replace(" ", "").lower().startswith("gitpython>=3.2"), req
    assert "--output" in " ".join(git.objects.commit.Commit.unsafe_git_rev_options)
