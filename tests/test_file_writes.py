"""Files envbisect writes outside its store (the `init` draft, systemd units) are written through a
temp file it creates itself (O_EXCL, never through a planted symlink) and never through a symlinked
destination."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envbisect.errors import UsageError
from envbisect.runs import playbook_draft
from envbisect.runs.schedule import Schedule, _install_systemd


def _plant(folder: Path, name: str, victim: Path) -> None:
    """Another local user who can write the folder plants symlinks at the temp names a writer could pick."""
    pid = os.getpid()
    for p in range(pid - 5, pid + 50):
        os.symlink(victim, folder / f".{name}.tmp-{p}")


def test_init_out_never_writes_through_a_planted_temp_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's data\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    _plant(shared, "draft.toml", victim)
    out = shared / "draft.toml"
    playbook_draft.write_draft(out, "[deployment]\nname = 'x'\n", force=False)
    assert victim.read_text() == "the victim's data\n"
    assert not out.is_symlink() and out.read_text() == "[deployment]\nname = 'x'\n"
    assert oct(out.stat().st_mode & 0o777) == oct(0o644)


def test_init_out_refuses_a_destination_that_is_a_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's data\n")
    out = tmp_path / "draft.toml"
    out.symlink_to(victim)
    with pytest.raises(UsageError, match="symlink"):
        playbook_draft.write_draft(out, "x = 1\n", force=True)
    assert victim.read_text() == "the victim's data\n" and out.is_symlink()


def test_systemd_units_never_written_through_a_planted_temp_symlink_or_a_symlinked_unit(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's data\n")
    units = tmp_path / "units"
    units.mkdir()
    _plant(units, "envbisect-snapshot-x.service", victim)
    service = units / "envbisect-snapshot-x.service"
    sch = Schedule("systemd", 60.0, "auto", "x", ["envbisect"], "envbisect-snapshot-x",
                   files={str(service): "[Service]\n"})
    got = _install_systemd(sch)
    assert got.changed == [str(service)]
    assert victim.read_text() == "the victim's data\n" and service.read_text() == "[Service]\n"
    timer = units / "envbisect-snapshot-x.timer"
    timer.symlink_to(victim)
    sch2 = Schedule("systemd", 60.0, "auto", "x", ["envbisect"], "envbisect-snapshot-x",
                    files={str(timer): "[Timer]\n"})
    with pytest.raises(UsageError, match="symlink"):
        _install_systemd(sch2)
    assert victim.read_text() == "the victim's data\n"
