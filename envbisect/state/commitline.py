"""The first-parent commit line of a deployed repo's HEAD move, read with GitPython from a local mirror.

The mirror is fetched over the existing transport: the host packs the objects reachable from the
current HEAD (`git pack-objects --revs --stdout`, read-only: no ref, no index, no file on the host
changes) and the pack is indexed into a bare repository in a local temporary directory. Nothing is
ever pushed. The line is what `git bisect --first-parent` walks: base..head following first parents,
oldest first; a merge on it is one commit (its files against its first parent), unless its
second-parent commits are asked for (`bisect --split-merges`).
"""
from __future__ import annotations

import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import contextlib

from envbisect.errors import RemoteError
from envbisect.inputs.masking import printable

SHA = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")  # a SHA-1 or SHA-256 object name, as git prints it


@dataclass(frozen=True)
class LineCommit:
    sha: str
    subject: str
    author: str  # "Name <email>"
    files: tuple[str, ...]  # changed against its first parent
    merge: bool = False
    merged_by: str | None = None  # --split-merges: the merge on the line that brought this branch commit

    def to_json(self) -> dict[str, Any]:
        return {"sha": self.sha, "subject": self.subject, "author": self.author, "files": list(self.files),
                "merge": self.merge, **({"merged_by": self.merged_by} if self.merged_by else {})}

    @property
    def short(self) -> str:
        return f"{self.sha[:12]} {self.subject!r} by {self.author}"


def git_says_text(stderr: bytes) -> str:
    lines = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "failed"


def git_says(e: Exception) -> str:
    """What git said, in one line: the last non-empty line of its stderr (GitPython wraps it as
    ``stderr: '...'``, so its own last line is the closing quote), else the error's own first line."""
    raw = str(getattr(e, "stderr", "") or "").replace("stderr:", "")
    lines = [ln.strip().strip("'").strip() for ln in raw.splitlines()]
    lines = [ln for ln in lines if ln]
    return lines[-1] if lines else (str(e).strip().splitlines() or ["git failed"])[0]


class NotALine(Exception):
    """The HEAD move is not a forward move along first parents (a rewind, a reset elsewhere), or its
    ends are not commits git can read: the commit line's own note, never an error of the run."""


def checked_sha(sha: str, what: str) -> str:
    """`sha` when it is 40 (or 64) lowercase hex digits, as a host's git reports a HEAD; NotALine
    otherwise. Only such a string reaches git on the controller (`--output=FILE` is an option)."""
    if isinstance(sha, str) and SHA.fullmatch(sha):
        return sha
    raise NotALine(f"{what} {printable(str(sha)[:80], keep_newlines=False)!r} is not a commit id (40 or 64 hex "
                   "digits)")


@contextlib.contextmanager
def mirror(transport, repo_path: str, head: str) -> Iterator[Path]:  # noqa: ANN001
    """A local bare repository holding every object reachable from `head` on the host."""
    checked_sha(head, "the HEAD the host reports")
    cmd = f"git -C {shlex.quote(repo_path)} pack-objects --revs --stdout -q"
    res = transport.run(cmd, stdin=(head + "\n").encode(), timeout=300)
    if not res.ok:
        raise RemoteError(f"{transport.host}: packing {repo_path} for a local mirror failed: {res.stderr_line()}")
    with tempfile.TemporaryDirectory(prefix="envbisect-mirror-") as tmp:
        dest = Path(tmp) / "mirror.git"
        subprocess.run(["git", "init", "-q", "--bare", str(dest)], check=True, capture_output=True)
        p = subprocess.run(["git", "-C", str(dest), "index-pack", "--stdin"], input=res.stdout, capture_output=True)
        if p.returncode != 0:
            raise RemoteError(f"{transport.host}: the pack of {repo_path} could not be indexed: "
                              f"{p.stderr.decode('utf-8', 'replace').strip()[-200:]}")
        p = subprocess.run(["git", "-C", str(dest), "update-ref", "refs/heads/envbisect-head", head],
                           capture_output=True)
        if p.returncode != 0:
            raise NotALine(f"{head[:12]} is not in the mirror of {repo_path}: git says "
                           f"{printable(git_says_text(p.stderr), keep_newlines=False)}")
        yield dest


def first_parent_line(mirror_dir: Path, base: str, head: str, *, split_merges: bool = False) -> list[LineCommit]:
    """base..head along first parents, oldest first. NotALine unless base is where the line starts.
    `split_merges`: each merge on the line is preceded by its second-parent commits (``M^1..M^2``
    along that branch's first parents, oldest first), each a step checked out as it was committed."""
    import git  # GitPython: imported here so the rest of envbisect does not pay for it

    checked_sha(base, "the baseline HEAD")
    checked_sha(head, "the current HEAD")
    repo = git.Repo(str(mirror_dir))
    try:
        return _walk(repo, base, head, split_merges)
    except git.GitCommandError as e:
        if "Invalid revision range" in git_says(e):  # the mirror holds what HEAD reaches: base is not in it
            raise NotALine(f"{base[:12]} (the baseline commit) is not an ancestor of the current HEAD {head[:12]} "
                           "(a reset, a rebase or a force-push?): there is no line of commits between them") from e
        raise NotALine(f"{base[:12]}..{head[:12]}: {printable(git_says(e), keep_newlines=False)}") from e
    except (git.GitError, ValueError) as e:  # UnsafeOptionError, a damaged object: the line's note
        raise NotALine(f"{base[:12]}..{head[:12]}: {printable(str(e), keep_newlines=False)[:300]}") from e


def _walk(repo, base: str, head: str, split_merges: bool) -> list[LineCommit]:  # noqa: ANN001
    commits = list(repo.iter_commits(f"{base}..{head}", first_parent=True))
    commits.reverse()
    if not commits or not commits[0].parents or commits[0].parents[0].hexsha != base:
        raise NotALine(f"{head[:12]} is not a first-parent descendant of {base[:12]} (a rewind or a reset?)")
    out = []
    for c in commits:
        if split_merges and len(c.parents) > 1:
            side = list(repo.iter_commits(f"{c.parents[0].hexsha}..{c.parents[1].hexsha}", first_parent=True))
            out.extend(_line_commit(repo, b, merged_by=c.hexsha) for b in reversed(side))
        out.append(_line_commit(repo, c))
    return out


def _line_commit(repo, c, merged_by: str | None = None) -> LineCommit:  # noqa: ANN001
    """One commit of the line: its files against its first parent."""
    files = tuple(f for f in repo.git.diff("--name-only", c.parents[0].hexsha, c.hexsha).splitlines() if f)
    subject = (c.message.splitlines() or [""])[0] if isinstance(c.message, str) else ""
    return LineCommit(c.hexsha, subject, f"{c.author.name} <{c.author.email}>", files, len(c.parents) > 1,
                      merged_by)
