"""A start command line held in a script or unit file (issue 24, part 1: "the start command line
itself"): each flag changed on it is its own delta ``file:HOST:PATH[--flag]``, a trial rewrites only
the chosen flags of that line, and what cannot be split stays a whole-file delta with a note."""
from __future__ import annotations

import hashlib

import pytest

from envbisect.inputs.masking import SecretMasker
from envbisect.state.configuration import FileOriginal, OriginalState, target_state
from envbisect.state.delta_cmdline import flag_holds, per_flag
from envbisect.state.deltas import Delta, DeltaKind

PATH = "/srv/start-decode.sh"
OLD = """#!/bin/bash
# decode: its server flags live here
export CUDA_VISIBLE_DEVICES=4,5,6,7
exec python -m sglang.launch_server --model-path /models/m \\
    --tp 2 \\
    --attention-backend flashinfer \\
    --enable-metrics
"""
NEW = OLD.replace("--tp 2", "--tp 4").replace("flashinfer", "triton").replace(
    "    --enable-metrics\n", "    --disable-radix-cache\n")


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def split(old: str, new: str, path: str = PATH) -> tuple[list[Delta], list[str], dict]:
    o, n = old.encode(), new.encode()
    contents = {sha(o): o, sha(n): n}
    d = Delta(f"file:node1:{path}", "file", "node1", None, path, None, "changed", sha(o), sha(n), "snapshot:x")
    notes: list[str] = []
    return per_flag([d], contents, notes), notes, contents


def test_each_flag_of_a_start_scripts_command_line_is_a_delta():
    deltas, notes, _ = split(OLD, NEW)
    assert not notes
    got = {d.id: (d.kind, d.change, d.old, d.new) for d in deltas}
    assert got == {
        f"file:node1:{PATH}[--tp]": (DeltaKind.FLAG, "changed", "--tp 2", "--tp 4"),
        f"file:node1:{PATH}[--attention-backend]": (DeltaKind.FLAG, "changed", "--attention-backend flashinfer",
                                                    "--attention-backend triton"),
        f"file:node1:{PATH}[--disable-radix-cache]": (DeltaKind.FLAG, "added", None, "--disable-radix-cache"),
        f"file:node1:{PATH}[--enable-metrics]": (DeltaKind.FLAG, "removed", "--enable-metrics", None),
    }
    j = deltas[0].to_json(SecretMasker())
    assert j["kind"] == "flag" and j["flag"] == "--tp"


def test_a_trial_rewrites_only_the_chosen_flags_of_that_line():
    deltas, _, contents = split(OLD, NEW)
    key = ("node1", PATH)
    original = OriginalState({key: FileOriginal(True, NEW.encode())}, {})
    guilty = f"file:node1:{PATH}[--attention-backend]"

    def trial(applied: set[str]) -> str:
        return target_state(original, deltas, applied, contents).files[key].decode()

    assert trial(set()) == OLD and trial({d.id for d in deltas}) == NEW
    mixed = trial({guilty})
    assert mixed == OLD.replace("flashinfer", "triton"), mixed  # every other byte as the baseline's
    assert flag_holds(mixed.encode(), next(d for d in deltas if d.id == guilty)) is True
    assert flag_holds(mixed.encode(), next(d for d in deltas if d.flag == "--tp")) is False
    # an added flag goes after the flag the current line has before it, laid out one flag per line
    added = trial({f"file:node1:{PATH}[--disable-radix-cache]"})
    assert added == OLD.replace("flashinfer \\\n", "flashinfer \\\n    --disable-radix-cache \\\n"), added
    removed = trial({f"file:node1:{PATH}[--enable-metrics]"})
    assert removed == OLD.replace(" \\\n    --enable-metrics", ""), removed
    # a flag left out of the run keeps its current state
    only_tp = [d for d in deltas if d.flag == "--tp"]
    assert "--attention-backend triton" in target_state(original, only_tp, set(), contents).files[key].decode()


def test_a_unit_files_exec_start_is_split_and_its_other_lines_are_not():
    old = "[Service]\nEnvironment=A=1\nExecStart=-/usr/bin/python3 -m sglang.launch_server --tp 2 --port 30000\n"
    deltas, notes, _ = split(old, old.replace("--tp 2", "--tp=4"), "/etc/systemd/system/decode.service")
    assert [(d.id, d.old, d.new) for d in deltas] == [
        ("file:node1:/etc/systemd/system/decode.service[--tp]", "--tp 2", "--tp=4")] and not notes
    deltas, notes, _ = split(old, old.replace("A=1", "A=2"), "/etc/systemd/system/decode.service")
    assert [d.kind for d in deltas] == [DeltaKind.FILE] and not notes


@pytest.mark.parametrize("new, why", [
    (OLD.replace("--tp 2", "--tp 4 >> /var/log/decode.log"), "a shell operator '>'"),
    (NEW.replace("CUDA_VISIBLE_DEVICES=4,5,6,7", "CUDA_VISIBLE_DEVICES=0"), "2 lines changed"),
    (OLD.replace("python -m", "python3 -m"), "positional"),
])
def test_what_cannot_be_split_stays_one_whole_file_delta_with_a_note(new, why):
    deltas, notes, _ = split(OLD, new)
    assert [d.kind for d in deltas] == [DeltaKind.FILE]
    assert len(notes) == 1 and "compared as a whole file, not per flag" in notes[0] and why in notes[0], notes


def test_a_script_line_without_flags_is_a_plain_file_change():
    deltas, notes, _ = split(OLD, OLD.replace("4,5,6,7", "0,1"))
    assert [d.kind for d in deltas] == [DeltaKind.FILE] and not notes


DEBUG_BRANCH = """#!/bin/bash
if [ -n "${DECODE_DEBUG:-}" ]; then
  exec python -m sglang.launch_server --attention-backend flashinfer --log-level debug
fi
exec python -m sglang.launch_server --attention-backend flashinfer --mem-fraction-static 0.8
"""


def test_a_changed_line_whose_program_words_another_line_has_too_stays_one_whole_file_delta():
    # a debug branch above the real line runs the same program: a flag state read back from the file
    # could come from either line, so the change is not split per flag
    new = DEBUG_BRANCH.replace("flashinfer --mem-fraction-static 0.8", "triton --mem-fraction-static 0.85")
    deltas, notes, _ = split(DEBUG_BRANCH, new)
    assert [(d.id, d.kind) for d in deltas] == [(f"file:node1:{PATH}", DeltaKind.FILE)]
    assert notes == [f"node1:{PATH}: compared as a whole file, not per flag: its command line (line 5) runs "
                     "the same program words as line 3, so a flag's state in the file is ambiguous"]


def test_a_flag_is_neither_old_nor_new_when_two_lines_run_its_program():
    deltas, _, _ = split(OLD, NEW)
    tp = next(d for d in deltas if d.flag == "--tp")
    assert flag_holds(NEW.encode(), tp) is True and flag_holds(OLD.encode(), tp) is False
    twice = NEW.replace("exec python", "if [ -n \"$DEBUG\" ]; then\n  exec python -m sglang.launch_server --tp 2\nfi\n"
                                       "exec python", 1)
    assert flag_holds(twice.encode(), tp) is None
