"""The evidence bundle and the report, built from a REAL bisection on the simulated PD deployment
with planted secrets among the deltas: the bundle checks itself, a damaged member is caught, no
planted secret survives anywhere in it, and the HTML report renders in headless Chromium."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import uuid
from html.parser import HTMLParser
from pathlib import Path

import pytest

from envbisect.report.bundle import check_bundle, make_bundle
from envbisect.inputs.masking import SecretMasker, mask_hash
from envbisect.state.store import Store
from envbisect.inputs.playbook import load_playbook
from envbisect.report import load_run, render_html, render_markdown
from envbisect.sim.stack import DEFAULT_RULES, FAKE_CLUSTER_PASS, FAKE_HF_TOKEN
from test_bisect_sim import INNOCENT, Scenario, plant

CULPRIT = "decode:SGLANG_SM120_MMA_TARGET_CTAS"
sim = pytest.mark.sim  # the tests that use `run` bisect on the simulated deployment


class Run:
    """One finished bisection with two planted secrets, and its bundle."""

    def __init__(self, tmp: Path):
        self.hf_token = "hf_" + uuid.uuid4().hex + "Zq"  # token-shaped
        self.cluster_pass = f"wobbly-{uuid.uuid4().hex[:10]}-lantern"  # no recognisable shape
        # The sim's typed-variable check logs an invalid value verbatim ("invalid value '…' for NAME"):
        # this is how the raw secrets reach the service logs, in a form no pattern recognises.
        rules = json.loads(json.dumps(DEFAULT_RULES))
        rules["typed"] = {**rules.get("typed", {}), "SIM_CLUSTER_PASS": {"type": "int"},
                          "HF_TOKEN": {"type": "choice", "choices": []}}
        self.scenario = Scenario(tmp / "sim", rules=rules)
        # Red team of main: in an env file's content (the bundle inlines it) a netrc password inside quotes
        # and a 42-character AWS-like value under an innocent name stayed raw; the bundle's own check
        # knew only the values of secret-named variables, so it did not refuse.
        self.netrc_pw = "Pq" + uuid.uuid4().hex[:10]
        self.aws_like = "wJalrXUtnFEMIK7MDENG" + uuid.uuid4().hex[:16].upper() + "bPxR9z"  # 42 characters
        # Red team of the security fixes: common secret names the word rules did not know
        self.named = {n: f"{n[:3].lower()}-{uuid.uuid4().hex[:10]}-x" for n in
                      ("PGPASSWORD", "ADMIN_PW", "SECRETKEY", "DOCKER_AUTH_CONFIG", "SLACK_WEBHOOK", "DB_CREDS")}
        with self.scenario.sim.env_file("decode").open("a") as f:
            f.write(f'NETRC_LINE="machine pypi.internal login ci password {self.netrc_pw}"\n'
                    f"export UPSTREAM_SIG={self.aws_like}\n" + "".join(f"export {n}={v}\n" for n, v in self.named.items()))
        try:
            self.scenario.sim.age_files()
            self.scenario.sim.co_restart()
            self.scenario.baseline()
            plant(self.scenario.sim, INNOCENT[:2] + [("decode", "HF_TOKEN", self.hf_token),
                                                     ("prefill", "SIM_CLUSTER_PASS", self.cluster_pass),
                                                     ("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256"), INNOCENT[2]])
            self.result = self.scenario.bisect(probe="e2e")
        finally:
            self.scenario.sim.stop_all()
        pb = load_playbook(self.scenario.sim.playbook)
        self.key = Store(self.scenario.store).mask_key()  # the hash a masked value shows is keyed with it
        self.masker = SecretMasker(pb.secret_names, pb.secret_values, key=self.key)
        self.run_dir = self.scenario.store / "runs" / self.result.run_id
        self.out = tmp / "out"
        self.out.mkdir()
        self.info = make_bundle(self.scenario.store, None, self.out, self.masker)
        with tarfile.open(self.info.path, "r:gz") as tar:
            self.members = {ti.name: (ti, tar.extractfile(ti).read()) for ti in tar}

    @property
    def secrets(self) -> dict[str, str]:
        return {"planted HF_TOKEN": self.hf_token, "planted SIM_CLUSTER_PASS": self.cluster_pass,
                "baseline HF_TOKEN": FAKE_HF_TOKEN, "baseline SIM_CLUSTER_PASS": FAKE_CLUSTER_PASS,
                "netrc password in a quoted env line": self.netrc_pw, "42-character AWS-like value": self.aws_like,
                **{f"{n} in an env file": v for n, v in self.named.items()}}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    return Run(tmp_path_factory.mktemp("bundle"))


@sim
def test_the_run_found_the_culprit_and_the_secrets_were_really_there(run):
    assert run.result.verdict.kind == "culprit" and run.result.culprit_deltas == (CULPRIT,)
    # the test is only meaningful if the raw secrets are in the run's raw material
    # (the values in both snapshots' env files are in the store's blobs, which the bundle inlines)
    raw = b"".join(p.read_bytes() for d in (run.run_dir, run.scenario.store / "blobs") for p in d.rglob("*")
                   if p.is_file())
    for what, value in run.secrets.items():
        assert value.encode() in raw, f"{what} is not in the raw run material: the leak check would be vacuous"
    logs = b"".join(p.read_bytes() for p in (run.run_dir / "evidence").rglob("prefill.log.txt"))
    assert run.cluster_pass.encode() in logs  # unshaped, in a log line


@sim
def test_bundle_checks_itself_and_has_every_member(run):
    assert check_bundle(run.info.path) == []
    names = list(run.members)
    assert names == list(run.info.members)
    assert names[:10] == ["manifest.json", "report.md", "report.html", "run.json", "diff.json", "verdict.json",
                          "trials.jsonl", "events.jsonl", "environment.json", "journal-summary.json"]
    doc = json.loads(run.members["run.json"][1])
    snaps = {f"snapshots/{doc['baseline']}.json", f"snapshots/{doc['current']}.json"}
    assert snaps <= set(names)
    n_trials = len(run.result.trials)
    assert {f"evidence/trial-{n:03d}/decode.log.txt" for n in range(1, n_trials + 1)} <= set(names)
    assert "journal.json" not in names
    assert all(ti.mode == 0o600 and ti.isreg() for ti, _ in run.members.values())
    manifest = json.loads(run.members["manifest.json"][1])
    assert manifest["run_id"] == run.result.run_id and manifest["envbisect_version"] and manifest["created_at"]
    assert [m["path"] for m in manifest["members"]] == names[1:]
    for m in manifest["members"]:
        data = run.members[m["path"]][1]
        assert m["size"] == len(data) and m["sha256"] == hashlib.sha256(data).hexdigest()
    assert len(json.loads(run.members["trials.jsonl"][1].splitlines()[0])["probe"]["runs"]) >= 1
    # delta ids name secret variables ("decode:HF_TOKEN") but are not secrets: they stay readable
    verdict = json.loads(run.members["verdict.json"][1])
    assert verdict["units"] == {u: list(ds) for u, ds in run.result.units.items()}
    assert verdict["culprits"] == [CULPRIT] and doc["units"] == verdict["units"]
    env = json.loads(run.members["environment.json"][1])
    assert env["envbisect"] and env["repos"] and env["repos"][0]["describe"]
    summary = json.loads(run.members["journal-summary.json"][1])
    files = [f for h in summary["hosts"].values() for f in h["files"]]
    assert files and all({"path", "mode", "hmac_sha256", "size"} <= set(f) and "content_b64" not in f for f in files)
    # snapshots: env files inlined as redacted text, the secret masked but visibly changed
    cur = json.loads(run.members[f"snapshots/{doc['current']}.json"][1])
    decode_env = next(f for h in cur["hosts"].values() for p, f in h["files"].items() if p.endswith("decode.serve-env"))
    assert "SGLANG_SM120_MMA_TARGET_CTAS=256" in decode_env["content"]
    assert f"HF_TOKEN=hf_••••(masked, sha256:{mask_hash(run.hf_token, run.key)})" in decode_env["content"]
    # same run, same member order and (apart from the manifest's timestamp) the same bytes
    again = make_bundle(run.scenario.store, run.result.run_id, run.out / "again.tar.gz", run.masker)
    assert again.members == run.info.members
    with tarfile.open(again.path, "r:gz") as tar:
        assert {ti.name: tar.extractfile(ti).read() for ti in tar if ti.name != "manifest.json"} == \
               {n: d for n, (_, d) in run.members.items() if n != "manifest.json"}


def _rewrite(src: Path, dst: Path, change) -> Path:  # noqa: ANN001
    with tarfile.open(src, "r:gz") as tin, tarfile.open(dst, "w:gz") as tout:
        for ti in tin:
            data = tin.extractfile(ti).read()
            for ti2, data2 in change(ti, data):
                ti2.size = len(data2)
                tout.addfile(ti2, io.BytesIO(data2))
    return dst


@sim
def test_check_bundle_reports_damage(run, tmp_path):
    def flip(ti, data):
        if ti.name == "verdict.json":
            data = data.replace(b"culprit", b"cu1prit", 1)  # same size, different bytes
        return [(ti, data)]

    probs = check_bundle(_rewrite(run.info.path, tmp_path / "flip.tar.gz", flip))
    assert len(probs) == 1 and "verdict.json" in probs[0] and "sha256" in probs[0]

    def grow_and_drop(ti, data):
        if ti.name == "events.jsonl":
            return []
        if ti.name == "report.md":
            extra = tarfile.TarInfo("extra.txt")
            extra.mode = 0o600
            return [(ti, data + b"\n"), (extra, b"not in the manifest")]
        return [(ti, data)]

    probs = check_bundle(_rewrite(run.info.path, tmp_path / "grow.tar.gz", grow_and_drop))
    text = "\n".join(probs)
    assert "report.md: size" in text and "events.jsonl: listed in the manifest but missing" in text
    assert "extra.txt: in the archive but not listed" in text
    (tmp_path / "cut.tar.gz").write_bytes(run.info.path.read_bytes()[:4000])
    assert check_bundle(tmp_path / "cut.tar.gz")


@sim
def test_no_secret_survives_anywhere_in_the_bundle(run):
    tar_bytes = gzip.decompress(run.info.path.read_bytes())
    blobs = {name: data for name, (_, data) in run.members.items()}
    blobs["<the whole tar, gunzipped>"] = tar_bytes
    blobs["<the .tar.gz itself>"] = run.info.path.read_bytes()
    for what, value in run.secrets.items():
        for form in {value.encode(), value.encode("utf-16-le"), json.dumps(value).encode()[1:-1]}:
            leaks = [name for name, data in blobs.items() if form in data]
            assert not leaks, f"{what} leaked into {leaks}"
    # the bundle's own last check knows them too (it refuses to write when one survives)
    from envbisect.report import make_redactor

    known = make_redactor(run.run_dir, SecretMasker()).raw_values
    assert run.netrc_pw in known and run.aws_like in known
    # ...while the deltas are still visibly there, masked with a hash that shows they changed
    diff = blobs["diff.json"].decode()
    assert mask_hash(run.cluster_pass, run.key) in diff and mask_hash(run.hf_token, run.key) in diff
    assert "prefill:SIM_CLUSTER_PASS" in blobs["report.md"].decode()


@sim
def test_markdown_report_tells_the_story(run):
    md = run.members["report.md"][1].decode()
    for heading in ("## The question", "## What changed (deltas)", "## Premise checks", "## Timeline", "## Trials",
                    "## Verdict", "## End state", "## Environment and versions"):
        assert heading in md
    assert "**Verdict: culprit**" in md and CULPRIT in md
    assert "Reproduced: the current configuration" in md and "The baseline (no deltas) passes" in md
    assert md.count("### Trial ") == len(run.result.trials)
    assert "restoring the original files and co-restarting" in md  # the timeline has the end state
    rec = load_run(run.run_dir, run.masker)
    assert render_markdown(rec) == md  # the bundle's report is the plain rendering of the run


_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _Dom(HTMLParser):
    """Just enough of the DOM: svg ids, trial marks inside an svg, the verdict element's text, and
    anything that would load an external resource."""

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.svg_ids: list[str] = []
        self.marks: list[dict] = []
        self.verdict_depth: int | None = None
        self.verdict_text = ""
        self.external: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg":
            self.svg_ids.append(a.get("id", ""))
        if "trial-mark" in (a.get("class") or "").split() and "svg" in self.stack:
            self.marks.append(a)
        if tag == "script":
            self.scripts += 1
        for attr in ("src", "href", "srcset", "data", "poster"):
            v = a.get(attr) or ""
            if v and not v.startswith("#"):
                self.external.append(f"<{tag} {attr}={v}>")
        if tag == "link" or (tag == "meta" and (a.get("http-equiv") or "").lower() == "refresh"):
            self.external.append(f"<{tag}>")
        if tag in _VOID:
            return
        self.stack.append(tag)
        if a.get("id") == "verdict":
            self.verdict_depth = len(self.stack)

    def handle_startendtag(self, tag, attrs):
        a = dict(attrs)
        if "trial-mark" in (a.get("class") or "").split() and "svg" in self.stack:
            self.marks.append(a)

    def handle_endtag(self, tag):
        if tag in self.stack:
            while self.stack and self.stack.pop() != tag:
                pass
        if self.verdict_depth is not None and len(self.stack) < self.verdict_depth:
            self.verdict_depth = None

    def handle_data(self, data):
        if self.verdict_depth is not None:
            self.verdict_text += data


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@sim
def test_html_report_renders_in_headless_chromium(run, tmp_path):
    html = run.members["report.html"][1].decode()
    static = _Dom()
    static.feed(html)
    assert static.external == [] and static.scripts == 0  # self-contained, no JS
    browser = _chromium()
    if browser is None:
        msg = "chromium is not installed (apt-get install chromium, or run scripts/test.sh)"
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            pytest.fail(msg + " -- required in CI", pytrace=False)
        pytest.skip(msg)
    page = tmp_path / "report.html"
    page.write_text(html)
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'chromium-profile'}"]
    dom = subprocess.run(flags + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=90)
    assert dom.returncode == 0, dom.stderr[-2000:]
    d = _Dom()
    d.feed(dom.stdout)
    assert "trials-chart" in d.svg_ids
    assert [int(m["data-trial"]) for m in d.marks] == [t.n for t in run.result.trials]
    assert [m["data-outcome"] for m in d.marks] == [t.outcome for t in run.result.trials]
    assert "CULPRIT" in d.verdict_text and CULPRIT in d.verdict_text
    shot = tmp_path / "report.png"
    r = subprocess.run(flags + ["--window-size=1280,1600", f"--screenshot={shot}", page.as_uri()],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", r.stderr[-2000:]
    if os.environ.get("ENVBISECT_KEEP_SCREENSHOT"):  # for a human look: ENVBISECT_KEEP_SCREENSHOT=/tmp/x.png
        shutil.copy(shot, os.environ["ENVBISECT_KEEP_SCREENSHOT"])


def test_report_of_a_not_config_run_and_of_an_unfinished_one(tmp_path):
    """The branches a culprit run does not reach, on hand-written run files."""
    run_dir = tmp_path / "store" / "runs" / "R1"
    run_dir.mkdir(parents=True)
    delta = {"id": "decode:SGLANG_SM120_MMA_TARGET_CTAS", "kind": "env", "host": "node1", "service": "decode",
             "path": "/srv/decode.serve-env", "key": "SGLANG_SM120_MMA_TARGET_CTAS", "change": "changed",
             "old": "128", "new": "512", "baseline_source": "snapshot:S0", "detail": []}
    (run_dir / "run.json").write_text(json.dumps({
        "run_id": "R1", "deployment": "pd <prod>", "playbook": "/nonexistent.toml", "created_at": 1.7e9,
        "probe": "client", "options": {"confidence": 0.95, "leave": "original"}, "baseline": "S0", "current": "S1",
        "since": 1.7e9 - 3600, "deltas": [delta], "units": {delta["id"]: [delta["id"]]},
        "diff": {"baseline": {"snapshot": "S0", "label": "noon", "taken_at": "x"}, "deltas": [delta], "drift": []}}))
    trial = {"n": 1, "purpose": "premise: current must fail", "units": [delta["id"]], "config": [delta["id"]],
             "outcome": "fail", "reason": "round 4: hang", "restart_s": 2, "probe_s": 5, "restart_durations": {},
             "started_at": 1.7e9, "probe": {"runs": [], "passes": 0}, "log_tail": "", "aborted": False}
    base = {**trial, "n": 2, "purpose": "premise: baseline must pass", "units": [], "config": []}
    (run_dir / "trials.jsonl").write_text(json.dumps(trial) + "\n" + json.dumps(base) + "\n")
    (run_dir / "events.jsonl").write_text(json.dumps({"ts": 1.7e9, "kind": "trial-start", "n": 1,
                                                      "purpose": trial["purpose"], "config": [delta["id"]]}) + "\n")
    rec = load_run(run_dir)
    md, html = render_markdown(rec), render_html(rec)
    assert "No verdict: the run did not finish" in md and "did not finish" in html
    assert "&lt;prod&gt;" in html and "<prod>" not in html  # escaped
    (run_dir / "verdict.json").write_text(json.dumps({
        "run": "R1", "verdict": "not-config", "culprits": [], "culprit_units": [], "confidence": 0.99,
        "suspects": [], "explanation": "the baseline fails too", "units": {delta["id"]: [delta["id"]]}, "restarts": 2,
        "path": {"layers": [{"layer": "router (router) directly", "target": "http://r", "ok": True, "reason": "ok"},
                            {"layer": "client path", "target": "http://p", "ok": False, "reason": "round 4: hang"}],
                 "broken_at": "client path", "conclusion": "look at the path between the client and the router"},
        "drift_hint": [], "final_probe": None, "state_left": "original", "notes": []}))
    rec = load_run(run_dir)
    md, html = render_markdown(rec), render_html(rec)
    assert "## Request path, layer by layer" in md and "Broken at **client path**" in md
    assert "The baseline fails too" in md and 'id="verdict" class="v-not-config"' in html
    assert html.count('class="trial-mark"') == 2


@sim
def test_a_masked_env_file_cannot_be_recovered_from_the_bundle_by_its_hash(run):
    """The red-team's crack: a bundled env file keeps its masked content; had the raw file's
    unkeyed sha256 gone with it, putting each word of a dictionary (here: one holding the real
    secrets) where a masked value is and hashing would give the secret back. No raw content's
    sha256 is anywhere in the bundle (the store's keyed hash stands for it)."""
    import re

    text = "\n".join(data.decode("utf-8", "replace") for _, data in run.members.values())
    raws = [p.read_bytes() for p in (run.scenario.store / "blobs").rglob("*") if p.is_file()]
    env_raws = [r for r in raws if b"SIM_CLUSTER_PASS" in r or b"HF_TOKEN" in r]
    assert env_raws
    for raw in env_raws:
        assert hashlib.sha256(raw).hexdigest() not in text
    words = ["password", "hunter2", *run.secrets.values()]
    recovered = []
    for name, (_, data) in run.members.items():
        if not name.startswith("snapshots/"):
            continue
        for host in json.loads(data)["hosts"].values():
            for path, f in host["files"].items():
                if not f.get("content_redacted"):
                    continue
                hashes = {v for v in f.values() if isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v)}
                for line in f["content"].splitlines():
                    m = re.match(r"(.*?=)(.*)$", line)
                    if "•" not in line or not m:
                        continue
                    for w in words:
                        cand = f["content"].replace(line, m.group(1) + w)
                        if hashlib.sha256(cand.encode()).hexdigest() in hashes | set(re.findall(r"[0-9a-f]{64}", text)):
                            recovered.append((path, w))
    assert not recovered
