"""Unit tests of the Prometheus and accuracy probes' pure parts: reading a /metrics page with
prometheus-client's parser, rates and histogram quantiles, the PromQL answer, the binomial
decision, answer matching, and the playbook keys checked at load."""
from __future__ import annotations

import random
from fractions import Fraction
from math import comb
from pathlib import Path

import pytest

from envbisect.errors import PlaybookError
from envbisect.inputs.playbook import parse_playbook
from envbisect.search.accuracy import binom_cdf, decide_accuracy
from envbisect.sim.worker import Histogram, solve
from envbisect.trials.probe_answers import is_right, reply_text
from envbisect.trials.probe_metrics import (Reading, histogram_quantile, increase, promql_value, rate, read_family,
                                            window_text)

PAGE = """# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m",role="decode"} 1200.0
sglang:generation_tokens_total{model_name="m",role="prefill"} 30.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",role="decode"} 3.0
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m",role="decode"} 10.0
sglang:time_to_first_token_seconds_bucket{le="0.5",model_name="m",role="decode"} 30.0
sglang:time_to_first_token_seconds_bucket{le="1.0",model_name="m",role="decode"} 40.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m",role="decode"} 40.0
sglang:time_to_first_token_seconds_sum{model_name="m",role="decode"} 9.5
sglang:time_to_first_token_seconds_count{model_name="m",role="decode"} 40.0
"""


def test_a_counter_is_read_by_either_spelling_and_filtered_by_labels():
    assert read_family(PAGE, "sglang:generation_tokens_total").total == 1230.0
    assert read_family(PAGE, "sglang:generation_tokens").total == 1230.0
    assert read_family(PAGE, "sglang:generation_tokens_total", [("role", "decode")]).total == 1200.0
    assert read_family(PAGE, "sglang:num_queue_reqs").total == 3.0
    assert read_family(PAGE, "sglang:absent_total") is None


def test_a_histogram_is_read_as_cumulative_buckets():
    h = read_family(PAGE, "sglang:time_to_first_token_seconds")
    assert h.total == 40.0
    assert h.buckets == ((0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (float("inf"), 40.0))


def test_histogram_quantile_interpolates_like_prometheus():
    b = ((0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (float("inf"), 40.0))
    assert histogram_quantile(0.5, b) == pytest.approx(0.3)  # rank 20: 0.1 + 0.4 * 10/20
    assert histogram_quantile(0.25, b) == pytest.approx(0.1)
    assert histogram_quantile(0.9, b) == pytest.approx(0.5 + 0.5 * 6 / 10)
    assert histogram_quantile(0.99, ((0.1, 1.0), (float("inf"), 5.0))) == 0.1  # in +Inf: the highest bound
    assert histogram_quantile(0.5, ((0.1, 0.0), (float("inf"), 0.0))) != histogram_quantile(0.5, ())  # NaN


def test_the_quantile_of_a_window_uses_the_observations_made_in_it():
    before = Reading(10, ((0.1, 10.0), (0.5, 10.0), (float("inf"), 10.0)))  # 10 fast ones before the window
    after = Reading(20, ((0.1, 10.0), (0.5, 20.0), (float("inf"), 20.0)))  # 10 slower ones in it
    inc = increase(before, after)
    assert inc == ((0.1, 0.0), (0.5, 10.0), (float("inf"), 10.0))
    assert histogram_quantile(0.5, inc) == pytest.approx(0.3)


def test_the_simulated_histogram_round_trips_through_the_parser():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.2, 0.3, 5.0):
        h.observe(v)
    text = "# TYPE x histogram\n" + "\n".join(h.lines("x", 'role="decode"')) + "\n"
    r = read_family(text, "x")
    assert r.total == 4 and r.buckets == ((0.1, 1.0), (1.0, 3.0), (float("inf"), 4.0))


def test_rate_is_the_increase_per_second_and_survives_a_counter_reset():
    assert rate(Reading(100), Reading(400), 3.0) == 100.0
    assert rate(Reading(1000), Reading(90), 3.0) == 30.0  # restarted: 90 since the restart


def test_a_promql_answer_must_be_one_number():
    assert promql_value({"status": "success", "data": {"resultType": "vector",
                                                       "result": [{"metric": {}, "value": [1, "646.5"]}]}}) == 646.5
    assert promql_value({"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}) == 2.0
    assert promql_value({"status": "success", "data": {"resultType": "vector", "result": []}}) is None
    two = [{"metric": {"a": "1"}, "value": [1, "1"]}, {"metric": {"a": "2"}, "value": [1, "2"]}]
    assert promql_value({"status": "success", "data": {"resultType": "vector", "result": two}}) is None
    assert promql_value({"status": "error", "error": "parse error"}) is None
    assert window_text(2.3) == "2s" and window_text(2.9) == "2s" and window_text(0.2) == "1s"


def test_binom_cdf_is_exact():
    for n, p in ((10, 0.3), (25, 0.9), (7, 0.5)):
        for k in range(n + 1):
            want = sum(comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))
            assert binom_cdf(k, n, p) == pytest.approx(want, rel=1e-9, abs=1e-15)
    # large n (comb(n, i) alone overflows a float): against exact rational arithmetic
    assert binom_cdf(1000, 2000, 0.5) == pytest.approx(float(Fraction(1, 2) + Fraction(comb(2000, 1000), 2 ** 2001)),
                                                       rel=1e-9)


def _draw(rng: random.Random, p: float, n: int) -> int:
    return sum(rng.random() < p for _ in range(n))


def test_equal_accuracy_is_never_named_worse_across_many_seeds():
    for n in (100, 200):
        for acc in (0.95, 0.8, 0.6):
            for seed in range(500):
                rng = random.Random(seed)
                d = decide_accuracy(_draw(rng, acc, n), n, _draw(rng, acc, n), n, tolerance=0.10)
                assert not d.worse, (n, acc, seed, d.text)


def test_a_drop_from_95_to_60_percent_is_named_worse():
    # 200 prompts a side (the probe's default): in every seed; 100: nearly always (the baseline's own
    # luck can put it at 89% and the drop's at 67%, which the test cannot tell from the tolerance)
    for n, need in ((200, 1000), (100, 950)):
        worse = 0
        for seed in range(1000):
            rng = random.Random(seed)
            d = decide_accuracy(_draw(rng, 0.95, n), n, _draw(rng, 0.60, n), n, tolerance=0.10)
            worse += d.worse
            assert not d.worse or "beyond chance" in d.text
        assert worse >= need, (n, worse)


def test_answers_match_exactly_by_regex_or_by_choice_letter():
    assert is_right("The answer is 42.", "exact", "42") and is_right("42", "exact", "42")
    assert not is_right("The answer is 43.", "exact", "42") and not is_right("420", "exact", "42")
    assert is_right("it is 42 I think", "regex", r"\b42\b") and not is_right("421", "regex", r"\b42\b")
    assert is_right("The answer is B.", "choice", "B") and is_right("(C) because", "choice", "C")
    assert not is_right("The answer is A.", "choice", "B")
    assert reply_text('{"choices": [{"message": {"content": "hi"}}]}') == "hi"
    assert reply_text('{"choices": [{"text": "yo"}]}') == "yo" and reply_text("oops") is None


def test_the_simulated_worker_solves_arithmetic_and_knows_a_wrong_answer():
    assert solve("What is 17 + 25?") == ("The answer is 42.", "The answer is 43.")
    assert solve("What is 6 * 7? A) 41 B) 42 C) 43") == ("The answer is B.", "The answer is A.")
    assert solve("Write a haiku.") is None


def _book(tmp_path: Path, probe: dict) -> dict:
    return {"hosts": {"h": {"ssh": "local"}},
            "services": {"s": {"host": "h", "env_file": "/e", "start": "x", "stop": "y", "health": "http://h/"}},
            "probes": {"p": probe}}


def _load(tmp_path: Path, probe: dict):
    return parse_playbook(_book(tmp_path, probe), tmp_path / "pb.toml").probes["p"]


def test_metrics_and_promql_keys_are_checked_at_load(tmp_path):
    url = "http://127.0.0.1:1/v1/chat/completions"
    p = _load(tmp_path, {"kind": "metrics", "url": url, "metrics_url": "http://127.0.0.1:2/metrics",
                         "series": "sglang:time_to_first_token_seconds", "reading": "quantile", "quantile": 0.9,
                         "labels": {"role": "decode"}, "load_s": 2})
    assert p.is_perf and not p.higher_is_better and p.labels == (("role", "decode"),) and p.load_s == 2.0
    assert p.metric == "p90 of sglang:time_to_first_token_seconds"
    p = _load(tmp_path, {"kind": "metrics", "url": url, "metrics_url": "http://127.0.0.1:2/metrics",
                         "series": "sglang:generation_tokens_total"})
    assert p.higher_is_better and p.reading == "rate"
    p = _load(tmp_path, {"kind": "promql", "url": url, "prometheus": "http://127.0.0.1:9090/",
                         "query": "sum(rate(sglang:generation_tokens_total[$window]))", "higher_is_better": True})
    assert p.is_perf and p.higher_is_better and p.prometheus == "http://127.0.0.1:9090"
    bad = [({"kind": "metrics", "url": url, "series": "x"}, "probes.p.metrics_url"),
           ({"kind": "metrics", "url": url, "metrics_url": "http://a/m", "series": "no spaces"}, "probes.p.series"),
           ({"kind": "metrics", "url": url, "metrics_url": "http://a/m", "series": "g", "reading": "gauge"},
            "probes.p.higher_is_better"),
           ({"kind": "metrics", "url": url, "metrics_url": "http://a/m", "series": "g", "reading": "max"},
            "probes.p.reading"),
           ({"kind": "promql", "url": url, "prometheus": "http://a", "query": "up"}, "probes.p.higher_is_better"),
           ({"kind": "promql", "url": url, "query": "up", "higher_is_better": True}, "probes.p.prometheus"),
           ({"kind": "metrics", "url": url, "metrics_url": "http://a/m", "series": "g", "load_s": 0},
            "probes.p.load_s")]
    for probe, key in bad:
        with pytest.raises(PlaybookError) as e:
            _load(tmp_path, probe)
        assert key in str(e.value), (probe, str(e.value))


def test_answers_keys_and_file_are_checked_at_load(tmp_path):
    url = "http://127.0.0.1:1/v1/chat/completions"
    (tmp_path / "qa.jsonl").write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n\n'
                                       '{"prompt": "What is 2 * 3?", "regex": "\\\\b6\\\\b"}\n'
                                       '{"prompt": "What is 2 + 2? A) 3 B) 4", "choice": "B"}\n')
    p = _load(tmp_path, {"kind": "answers", "url": url, "answers": "qa.jsonl", "requests": 40, "tolerance": "5%"})
    assert p.needs_reference and not p.is_perf and p.requests == 40 and p.tolerance == 0.05
    assert [k for _, k, _ in p.answer_items] == ["exact", "regex", "choice"]
    for text, why in (('{"prompt": "x"}\n', "exactly one of"), ('{"prompt": "x", "answer": "1", "choice": "A"}\n',
                                                               "exactly one of"),
                      ('not json\n', "line 1 is not JSON"), ('{"prompt": "x", "regex": "("}\n', "bad regex"),
                      ('{"prompt": "x", "choice": "Z"}\n', "one letter"), ("\n", "no prompts")):
        (tmp_path / "bad.jsonl").write_text(text)
        with pytest.raises(PlaybookError) as e:
            _load(tmp_path, {"kind": "answers", "url": url, "answers": "bad.jsonl"})
        assert why in str(e.value) and "probes.p.answers" in str(e.value), str(e.value)
    with pytest.raises(PlaybookError) as e:
        _load(tmp_path, {"kind": "answers", "url": url, "answers": "missing.jsonl"})
    assert "cannot read" in str(e.value)


@pytest.mark.local  # the probe check runs its reachability test through the local transport (bash)
def test_a_promql_probe_whose_prometheus_is_not_there_is_refused_before_any_edit(tmp_path):
    from envbisect.errors import ProbeBroken
    from envbisect.trials.probe_check import refuse_broken_probe

    try:
        from sshd import free_port
    except ImportError:
        from tests.sshd import free_port
    import socket

    stack = socket.socket()  # the stack's port: listening (a health URL of the playbook)
    stack.bind(("127.0.0.1", 0))
    stack.listen()
    port = stack.getsockname()[1]
    book = _book(tmp_path, {"kind": "promql", "url": f"http://127.0.0.1:{port}/v1/chat/completions",
                            "prometheus": f"http://127.0.0.1:{free_port()}", "query": "up",
                            "higher_is_better": True})
    book["services"]["s"]["health"] = f"http://127.0.0.1:{port}/health"
    pb = parse_playbook(book, tmp_path / "pb.toml")
    try:
        with pytest.raises(ProbeBroken) as e:
            refuse_broken_probe(pb.probes["p"], pb, {})
        assert "the Prometheus server is not there" in str(e.value) and "nothing was changed" in str(e.value)
    finally:
        stack.close()


MALFORMED = [[], {}, "x", {"status": "success", "data": "x"}, {"status": "success", "data": {"resultType": "vector",
             "result": [{}]}}, {"status": "success", "data": {"resultType": "vector", "result": [{"value": 5}]}},
             {"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "many"]}]}},
             {"status": "success", "data": {"resultType": "scalar", "result": [1, {"a": 1}]}},
             {"status": "error", "error": "bad\nquery\x1b[2J"}]


def test_a_malformed_promql_answer_is_no_number():
    for doc in MALFORMED:
        assert promql_value(doc) is None, doc


def test_a_malformed_prometheus_answer_is_a_probe_that_cannot_test_in_one_line(tmp_path):
    """A real HTTP exchange: the load target answers, the 'Prometheus' answers each malformed shape."""
    import json
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlsplit

    from envbisect.outcome import Outcome
    from envbisect.trials.probe_metrics import promql_sample

    answer: list = [None]

    class H(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(b'{"choices": [{"message": {"content": "hi"}}]}')

        def do_GET(self):  # noqa: N802
            q = parse_qs(urlsplit(self.path).query).get("query", [""])[0]
            doc = {"status": "success", "data": {"resultType": "scalar", "result": [0, str(time.time() + 60)]}} \
                if q == "min(timestamp(up))" else answer[0]
            self._send(doc if isinstance(doc, bytes) else json.dumps(doc).encode())

        def _send(self, data: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        probe = _load(tmp_path, {"kind": "promql", "url": base + "/v1/chat/completions", "prometheus": base,
                                 "query": "sum(rate(x[$window]))", "higher_is_better": True, "load_s": 0.2,
                                 "warmup": 0, "concurrency": 1})
        for doc in [*MALFORMED, b"[" * 100_000 + b"]" * 100_000]:  # the last: nested past the parser's depth
            answer[0] = doc
            run = promql_sample(probe, (base, "/v1/chat/completions", f"127.0.0.1:{srv.server_address[1]}"), base,
                                time.monotonic())
            assert run.outcome is Outcome.CANNOT_TEST, (doc, run)
            assert "\n" not in run.reason and "\x1b" not in run.reason, run
            assert run.reason.startswith("sum(rate(" if not isinstance(doc, bytes) else "cannot query"), run
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_malformed_metrics_page_is_a_value_error_never_a_crash():
    """The same class as a malformed Prometheus answer: a /metrics page whose histogram bucket has
    no `le` raised KeyError through metrics_sample (which reads ValueError as "cannot read")."""
    for page in ('# TYPE h histogram\nh_bucket{x="1"} 3\nh_count 3\n', '# TYPE h histogram\nh_bucket{le="abc"} 3\n'):
        with pytest.raises(ValueError):
            read_family(page, "h")


def test_a_deeply_nested_answer_is_no_answer():
    """A model server's, a Prometheus server's or a host agent's answer nested past the JSON
    parser's depth is data that is no answer (RecursionError is no ValueError)."""
    from envbisect.errors import RemoteError
    from envbisect.hosts.agent_calls import _answer
    from envbisect.hosts.transport_base import CommandResult

    deep = "[" * 100_000 + "]" * 100_000
    assert reply_text(deep) is None

    class Host:
        host, python = "node1", "python3"

    with pytest.raises(RemoteError, match="not JSON"):
        _answer(Host(), CommandResult(0, deep.encode(), b""), "a host operation")


def test_an_infinite_nan_or_boolean_sample_is_no_number():
    """A promql answer of "+Inf", "-Inf", "NaN" or JSON true holds no number to test (the probe
    cannot test, in one line); so does a metrics page whose series sums a non-finite sample."""
    for v in ("+Inf", "-Inf", "Inf", "NaN", "nan", True, False, None, [1], {"v": 1}, "1e400", ""):
        vector = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, v]}]}}
        scalar = {"status": "success", "data": {"resultType": "scalar", "result": [1, v]}}
        assert promql_value(vector) is None and promql_value(scalar) is None, v
    for v in ("+Inf", "NaN", "-Inf"):
        page = f"# TYPE sglang_num_running_reqs gauge\nsglang_num_running_reqs {v}\n"
        with pytest.raises(ValueError, match="not a finite number"):
            read_family(page, "sglang_num_running_reqs")
    assert read_family("# TYPE g gauge\ng 3\n", "g").total == 3.0
