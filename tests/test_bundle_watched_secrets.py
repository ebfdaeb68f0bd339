"""A bundle of a run whose watched files hold secrets (red-team 2, e3.py/e4.py/crack4.py): a password
file changed since the baseline, a YAML file's `db.password`, and a failing service whose log (printed
by the probe) shows that password and a remembered env secret cut across two lines.

- The content hash of a watched file goes out keyed (the store's key), never as the raw sha256 a
  dictionary of guesses can be hashed against (full, or the 12 hex digits report.md shows).
- A secret recognised by its key in a structured watched file is learned before anything is written,
  so the log line that prints it is masked in events.jsonl, trials.jsonl, verdict.json and every
  member; so are both halves of a learned secret a line break cut in two."""
from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import pytest

from clistack import CliStack, health_endpoint

YAML_PW = "Yq3mRv8LtP2wXs6"
ENV_PW = "Hb5nKd9QfZ3tRw2"
FILE_PW = "hunter2"


class Bundled:
    def __init__(self, root: Path, url: str):
        log = root / "host" / "watch" / "svc.log"
        probe = f'[probes.p]\nkind = "command"\ncommand = "cat {log}; ! grep -q BAD {{decode}}"\n'
        self.stack = s = CliStack(root, url, probe, name="rt2w")
        t = s.tree
        (t.watch / "app.yaml").write_text(f"db:\n  password: {YAML_PW}\n")
        log.write_text("ok\n")
        env = t.env("decode").read_text() + f"export DB_PASSWORD={ENV_PW}\n"
        t.env("decode").write_text(env)
        s.cli("snapshot", "--label", "noon", check=0)
        t.env("decode").write_text(env + "export BAD=1\n")
        log.write_text(f"db connect failed: password rejected for app (pw {YAML_PW})\n"
                       f"env dump: {ENV_PW[:7]}\n{ENV_PW[7:]}\n"
                       f"retrying with credentials -> {YAML_PW}\n")
        (t.watch / "db.password").write_text(FILE_PW + "\n")
        self.bisect = s.cli("bisect", "--against", "noon", "--json")
        out = root / "b.tar.gz"
        r = s.cli("bundle", "--out", str(out))
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        with tarfile.open(out) as tar:
            self.members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        self.run_dir = next((s.store / "runs").iterdir())


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    with health_endpoint() as url:
        yield Bundled(tmp_path_factory.mktemp("rt2w"), url)


def test_a_watched_files_content_cannot_be_recovered_from_its_hash_in_the_bundle(bundled):
    """crack4.py: hash each guess (with and without a newline) and look for it in the bundle."""
    text = "\n".join(data.decode("utf-8", "replace") for data in bundled.members.values())
    assert "db.password" in bundled.members["report.md"].decode()  # the file's delta is there
    words = ["password", "123456", "letmein", FILE_PW, "admin", "changeme"]
    recovered = [c for w in words for c in (w, w + "\n")
                 if hashlib.sha256(c.encode()).hexdigest()[:12] in text]
    assert not recovered, recovered


def test_a_structured_files_secret_printed_by_the_service_is_masked_everywhere(bundled):
    """e3.py: the YAML's db.password, unchanged since the baseline, is printed by the failing service;
    the env secret comes out cut across two lines."""
    assert bundled.bisect.returncode == 0, bundled.bisect.stderr.decode(errors="replace")
    found = {name: [s for s in (YAML_PW, ENV_PW[:7], ENV_PW[7:]) if s.encode() in data]
             for name, data in bundled.members.items()}
    assert not {k: v for k, v in found.items() if v}, found
    for name in ("events.jsonl", "trials.jsonl", "verdict.json"):
        data = (bundled.run_dir / name).read_bytes() if (bundled.run_dir / name).exists() else b""
        assert YAML_PW.encode() not in data and ENV_PW[7:].encode() not in data, name
    assert "password rejected" in bundled.members["trials.jsonl"].decode()  # the log line is there, masked


def test_a_learned_secret_cut_by_a_line_break_or_a_space_is_masked_in_both_pieces():
    from envbisect.inputs.masking import SecretMasker

    m = SecretMasker(key=b"k" * 32)
    m.learn_values([ENV_PW])
    for text in (f"dump: {ENV_PW[:7]}\n{ENV_PW[7:]}\nnext", f"dump: {ENV_PW[:3]} {ENV_PW[3:]} next",
                 f"a line ending {ENV_PW[:8]}", f"{ENV_PW[-8:]} begins a line\nand more"):
        out = m.redact_text(text)
        assert not any(p in out for p in (ENV_PW[:3], ENV_PW[-3:])), out
    assert m.redact_text("dump: Hb5 and more") == "dump: Hb5 and more"  # a short piece alone is not a secret


def test_every_secret_keyed_string_of_a_structured_file_and_of_its_text_is_learned():
    from envbisect.inputs.masking import SecretMasker
    from envbisect.state.structured import file_pairs

    m = SecretMasker(key=b"k" * 32)
    m.learn_env(file_pairs("/w/app.yaml", b"db:\n  password: Yq3mRv8LtP2wXs6\nauth:\n  token: |\n    Mz8kQ2vR7tLp4Wn\n"
                                          b"name: plainservice\n"))
    m.learn_text("[db]\npassword = Kx7mQ2vR9tLp4Wz\n")
    out = m.redact_text("printed: Yq3mRv8LtP2wXs6 Mz8kQ2vR7tLp4Wn Kx7mQ2vR9tLp4Wz plainservice")
    assert "Yq3m" not in out and "Mz8k" not in out and "Kx7m" not in out and "plainservice" in out, out
