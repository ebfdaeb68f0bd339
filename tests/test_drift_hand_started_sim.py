"""Issue 34 part 3: drift the operator started by hand. decode was started from a shell that
exported SGLANG_SM120_MMA_TARGET_CTAS=1024, a key no file sets (neither its env file today nor
at the baseline), and it hangs with it. After a full co-restart from the files the stack passes:
the not-reproduced verdict names the key with its value, the service, and where it is not set,
in the CLI, --json and the report."""
from __future__ import annotations

import copy
import json

import pytest

from envbisect.report.markdown import render_markdown
from envbisect.report.record import load_run
from envbisect.sim.stack import DEFAULT_RULES
from test_bisect_sim import INNOCENT, plant, scenario  # noqa: F401 - fixture

pytestmark = [pytest.mark.sim, pytest.mark.slow]
KEY = "SGLANG_SM120_MMA_TARGET_CTAS"


def test_a_key_no_file_sets_in_a_hand_started_process_is_named_in_the_not_reproduced_verdict(scenario):
    rules = copy.deepcopy(DEFAULT_RULES)
    rules["rules"].append({"service": "decode", "when": {KEY: "1024"}, "fault": "hang"})
    s = scenario(rules=rules, env={"decode": {KEY: None}})  # no file sets the key
    s.baseline()
    plant(s.sim, INNOCENT[:1])
    # the operator's shell: export the key, start decode, and the file never held it
    s.sim.set_env("decode", KEY, "1024")
    s.sim.restart("decode")
    s.sim.set_env("decode", KEY, None)
    s.sim.age_files()
    assert KEY not in s.sim.env_file("decode").read_text()
    p = s.cli("bisect", "--against", "good", "--probe", "e2e", "--json")
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "not-reproduced" and p.returncode == 5, (doc["verdict"], doc["explanation"])
    env_file = str(s.sim.env_file("decode"))
    for text in (doc["explanation"], " ".join(doc["drift_hint"])):
        assert f"{KEY}=1024" in text and "decode" in text and "no file sets" in text, text
        assert env_file in text and "nor at the baseline" in text, text
    md = render_markdown(load_run(s.store / "runs" / doc["run"]))
    assert f"{KEY}=1024" in md and env_file in md, md[:3000]
    human = s.cli("show", doc["run"])
    assert human.returncode == 0 and f"{KEY}=1024" in human.stdout and env_file in human.stdout, human.stdout[-3000:]
