"""A guilty HEAD move searched commit by commit, after the verdict named it alone.

The first-parent line is searched first (search/commits.py): each step is the culprit alone with
the repo at one commit of it. With `--split-merges`, a merge's branch is searched only when that
merge is the first failing commit of the first-parent line, and only between the merge's first
parent (seen passing) and the merge (seen failing): the branch's commits are checked out as they
were committed, without the first-parent commits made since the branch left, so mixed into the
first-parent line they could pass again after a failing one and clear the guilty commit.

A branch commit is named only when a branch commit before it was seen passing as committed and
the merge brings a file it changes (the branch may undo a change before the merge); the merge stays
named when every branch commit passes (the failure comes from the merge bringing the
two together) or when the branch's first commit already fails (its branch point was not tried).
`revert --verdict` goes back to the named commit's first parent, or, for a branch commit, to just
before the merge that brought it in, so that no first-parent commit is dropped.

A commit is named only once confirmed alone: the deployed HEAD with only its change undone (a commit
object built on the host from a private index, hostops.undo_commit: the work tree, the index and the
refs are untouched; the trial checks it out like any commit) must pass. An innocent commit that fails
only while it is checked out is refused, and the line is searched again after it (up to
`CONFIRM_TRIES` commits are tried); a change that does not undo cleanly on HEAD, or a confirmation
that does not pass, names the range, with the reason, never the commit.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from envbisect.errors import RemoteError
from envbisect.hosts.agent_calls import run_ops
from envbisect.hosts.transport_base import Transport
from envbisect.outcome import Outcome
from envbisect.runs.result import CommitVerdict
from envbisect.search import TrialKind
from envbisect.search.commits import CommitFound, walk_line
from envbisect.state.commitline import LineCommit, first_parent_line, mirror
from envbisect.state.deltas import Delta
from envbisect.trials.runner import Trial

StepTrial = Callable[[LineCommit, str, TrialKind], Trial]  # one trial of the culprit alone at a commit
# the confirmation of a commit: (its trial, "") or (None, why it could not be built)
Confirm = Callable[[LineCommit], "tuple[Trial | None, str]"]
CONFIRM_TRIES = 2  # commits refused by their confirmation before the line ends as a range


def undo_on_host(transport: Transport, g: Delta, c: LineCommit) -> LineCommit | str:
    """The deployed HEAD (the delta's new commit) with only `c`'s change undone, as a commit object
    on the host; or why it cannot be built."""
    head = g.new or ""
    try:
        got = run_ops(transport, [{"op": "undo_commit", "repo": g.path, "head": head, "commit": c.sha}])[0]
    except RemoteError as e:
        return f"the deployed HEAD without {c.sha[:12]} could not be built ({e})"
    if got.get("conflict"):
        return (f"{c.sha[:12]}'s change does not undo cleanly on the deployed HEAD {head[:12]} "
                f"({got['conflict']}), so it cannot be confirmed alone")
    return LineCommit(got["sha"], f"{head[:12]} without {c.sha[:12]}", "envbisect", c.files)


@dataclass(frozen=True)
class Lines:
    first_parent: tuple[LineCommit, ...]  # oldest first, merges as one step
    split: tuple[LineCommit, ...]  # with --split-merges, each merge preceded by its branch; else first_parent


def read_lines(transport: Transport, g: Delta, split_merges: bool) -> Lines:
    """The HEAD move's commits, read from a local mirror fetched over `transport` (NotALine,
    RemoteError when they cannot be)."""
    with mirror(transport, g.path or "", g.new or "") as m:
        line = tuple(first_parent_line(m, g.old or "", g.new or ""))
        split = tuple(first_parent_line(m, g.old or "", g.new or "", split_merges=True)) if split_merges else line
    return Lines(line, split)


def search_line(g: Delta, lines: Lines, trials: Sequence[Trial], trial_at: StepTrial,
                notes: list[str], confirm: Confirm | None = None) -> CommitVerdict | None:
    """The commit of the HEAD move `g` that is first to fail, observed and confirmed alone (or the
    range it was narrowed to, and why)."""
    found = _search(g, lines, trials, trial_at, notes)
    if found is None:
        return None
    first, whys = found, list[str]()  # the first search's ends: its passing end was observed passing
    while confirm is not None and found is not None and found.commit is not None:
        c = found.commit
        t, why = confirm(c)
        if t is not None and t.outcome is Outcome.PASS:
            return replace(found, confirmed_by=t.n)
        if t is not None:
            why = f"{c.sha[:12]} is not named: {_refusal(t)}"
        notes.append(f"{g.id}: {why}")
        whys.append(why)
        later = _after(lines, c)
        if t is None and len(whys) == 1:  # not built: the line stays narrowed to the commit, with why
            return replace(found, commit=None, why=why)
        again = (None if t is None or not later or len(whys) >= CONFIRM_TRIES else
                 _search(g, Lines(later, later), trials, trial_at, notes, premised=True, start=c.merged_by or c.sha))
        if again is None or again.commit is None:
            used = found.trials + (again.trials if again is not None else ())
            return _refused(first, g, used, "; ".join(whys))
        found = replace(again, line=found.line, trials=found.trials + again.trials)
    return found


def _refusal(t: Trial) -> str:
    """What the confirmation (the deployed HEAD without the commit) saw, when it did not pass."""
    if t.outcome is Outcome.UNRESOLVED:
        return f"the deployed HEAD without it was unresolved (trial {t.n}: {t.reason})"
    if t.symptom == "other":
        return (f"the deployed HEAD without it failed another way (trial {t.n}: {t.reason}): a second problem "
                "in the later commits")
    return (f"the deployed HEAD without it still failed with the symptom (trial {t.n}: {t.reason}): a later "
            "commit gives it too")


def _refused(first: CommitVerdict, g: Delta, used: tuple[int, ...], why: str) -> CommitVerdict:
    """The line as a range after its first failing commit was refused by its confirmation: from the
    last commit observed passing to HEAD; the refused commit stays first failing with the symptom,
    unconfirmed."""
    refused = first.commit.sha if first.commit is not None else ""
    head = g.new or (first.line[-1].sha if first.line else first.failed)
    return replace(first, commit=None, failed=head, trials=used, revert_to=first.revert_to or first.passed, why=why,
                   unconfirmed=refused)


def _after(lines: Lines, c: LineCommit) -> tuple[LineCommit, ...]:
    """The first-parent commits after `c` (after the merge that brought it, for a branch commit)."""
    at = c.merged_by or c.sha
    shas = [x.sha for x in lines.first_parent]
    return lines.first_parent[shas.index(at) + 1:] if at in shas else ()


def _search(g: Delta, lines: Lines, trials: Sequence[Trial], trial_at: StepTrial,
            notes: list[str], premised: bool = False, start: str | None = None) -> CommitVerdict | None:
    """The line search proper (module docstring); `premised`: the line's last commit (HEAD) is
    already known to fail; `start`: the commit before the line (the baseline commit by default)."""
    used: list[int] = []

    def run(c: LineCommit, purpose: str, kind: TrialKind) -> Trial:
        t = trial_at(c, purpose, kind)
        used.append(t.n)
        if t.outcome is Outcome.UNRESOLVED:  # retried once, as the search retries an unresolved trial
            t = trial_at(c, "retry (last trial unresolved): " + purpose, kind)
            used.append(t.n)
        return t

    line = lines.first_parent
    alone = [t for t in trials if tuple(t.config) == (g.id,) and t.outcome.failed and t.symptom != "other"]
    if not alone and not premised and len(line) > 1:
        t = run(line[-1], f"{g.id} alone at {line[-1].sha[:12]} (the current HEAD) must fail: the commit line's "
                          "premise", TrialKind.CONFIRM)
        if not t.outcome.failed or t.symptom == "other":
            notes.append(f"{g.id}: alone at the current HEAD it did not fail with the symptom (trial {t.n}: "
                         f"{t.reason}); not searched commit by commit")
            return None

    def walk(steps: Sequence[LineCommit], what: str) -> CommitFound:
        def at(index: int) -> tuple[bool | None, bool]:
            c = steps[index - 1]
            t = run(c, f"commit line of {g.id}: does it fail at {what} {index} of {len(steps)} "
                       f"({c.sha[:12]} {c.subject!r})?", TrialKind.REFINE)
            if t.symptom == "other":
                notes.append(f"{g.id}: commit {c.sha[:12]} failed differently from the symptom (trial {t.n}: "
                             f"{t.reason}); skipped, as `git bisect skip` does")
            return (None if t.outcome is Outcome.UNRESOLVED else t.outcome.failed), t.symptom == "other"
        return walk_line(len(steps), at)

    nxt = walk(line, "commit")
    passed = (g.old or "" if start is None else start) if nxt.passed == 0 else line[nxt.passed - 1].sha
    found = line[nxt.index - 1]
    if not nxt.found:
        return CommitVerdict(g.id, lines.split, None, passed, found.sha, tuple(used), passed)
    branch = tuple(c for c in lines.split if c.merged_by == found.sha) if found.merge else ()
    if not branch:
        return CommitVerdict(g.id, lines.split, found, passed, found.sha, tuple(used), passed)
    # the merge fails and its first parent passes: which commit of its branch, checked out as committed?
    sub = walk((*branch, found), "branch commit (as committed)")
    named = branch[sub.index - 1] if sub.found and 0 < sub.passed and sub.index <= len(branch) else None
    if named is not None and set(named.files) & set(found.files):
        return CommitVerdict(g.id, lines.split, named, branch[sub.passed - 1].sha, named.sha, tuple(used), passed)
    if named is not None:
        why = (f"{named.sha[:12]} {named.subject!r} fails as committed, but what it changes is not in the merge "
               "(its branch undid it before the merge)")
    elif sub.found and sub.index > len(branch):
        why = "every commit of its branch passes as committed: the merge brings the failure together"
    elif sub.found:
        why = "its branch's first commit already fails as committed (its branch point was not tried)"
    else:
        why = "its branch was not narrowed to one commit"
    notes.append(f"{g.id}: the merge {found.sha[:12]} {found.subject!r} stays named: {why}")
    return CommitVerdict(g.id, lines.split, found, passed, found.sha, tuple(used), passed)


__all__ = ["Lines", "read_lines", "search_line"]
