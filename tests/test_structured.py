"""Structured watched files compared and written back per key (state/structured.py): pure, no hosts."""
from __future__ import annotations

import json

import pytest

from envbisect.state.structured import (KeyChange, Unfaithful, format_of, format_path, key_changes, parse_path,
                                        render)

YAML_OLD = b"""# feature flags for decode (owned by the serving team)
# keep this comment
decode_overlap_schedule: false   # risky
page_size: 64
router:
  policy: 'cache_aware'   # quoted on purpose
  workers: [a, b, c]
  retries: 3
list:
  - x: 1
  - x: 2
"""
YAML_NEW = (YAML_OLD.replace(b"schedule: false", b"schedule: true").replace(b"page_size: 64", b"page_size: 128")
            .replace(b"'cache_aware'", b"'round_robin'").replace(b"  retries: 3\n", b"  timeout: 30\n")
            .replace(b"  - x: 2", b"  - x: 5"))


def _by_key(changes):
    assert not isinstance(changes, Unfaithful), changes
    return {c.key: c for c in changes}


def test_yaml_keys_nested_list_items_added_removed():
    ch = _by_key(key_changes("yaml", YAML_OLD, YAML_NEW))
    assert ch == {
        "decode_overlap_schedule": KeyChange(("decode_overlap_schedule",), "changed", "false", "true"),
        "page_size": KeyChange(("page_size",), "changed", "64", "128"),
        "router.policy": KeyChange(("router", "policy"), "changed", '"cache_aware"', '"round_robin"'),
        "router.retries": KeyChange(("router", "retries"), "removed", "3", None),
        "router.timeout": KeyChange(("router", "timeout"), "added", None, "30"),
        "list[1].x": KeyChange(("list", 1, "x"), "changed", "2", "5"),
    }


def test_yaml_one_key_keeps_every_other_byte():
    changes = key_changes("yaml", YAML_OLD, YAML_NEW)
    assert not isinstance(changes, Unfaithful)
    out = render("yaml", YAML_OLD, YAML_NEW, changes, ["decode_overlap_schedule"])
    assert out == YAML_OLD.replace(b"schedule: false", b"schedule: true")
    out = render("yaml", YAML_OLD, YAML_NEW, changes, ["router.policy"])
    assert out == YAML_OLD.replace(b"'cache_aware'", b"'round_robin'")  # the quotes and the comment kept
    out = render("yaml", YAML_OLD, YAML_NEW, changes, ["router.timeout"])
    assert out == YAML_OLD.replace(b"  retries: 3\n", b"  timeout: 30\n  retries: 3\n")
    assert render("yaml", YAML_OLD, YAML_NEW, changes, []) == YAML_OLD
    assert render("yaml", YAML_OLD, YAML_NEW, changes, [c.key for c in changes]) == YAML_NEW


def test_yaml_list_that_grew_is_one_change():
    old = b"workers: [a, b]\nkeep: 1\n"
    new = b"workers: [a, b, c]\nkeep: 1\n"
    ch = _by_key(key_changes("yaml", old, new))
    assert list(ch) == ["workers"] and ch["workers"].new == '["a", "b", "c"]'


TOML_OLD = b"""# router config
[router]
policy = "cache_aware"  # default
retries = 3

[router.health]
interval_s = 10
"""
TOML_NEW = TOML_OLD.replace(b'"cache_aware"', b'"round_robin"').replace(b"interval_s = 10", b"interval_s = 30")


def test_toml_keys_keep_comments_and_order():
    changes = key_changes("toml", TOML_OLD, TOML_NEW)
    ch = _by_key(changes)
    assert set(ch) == {"router.policy", "router.health.interval_s"}
    out = render("toml", TOML_OLD, TOML_NEW, changes, ["router.health.interval_s"])
    assert out == TOML_OLD.replace(b"interval_s = 10", b"interval_s = 30")


def test_json_keys_in_the_files_own_layout():
    old = json.dumps({"temperature": 0.7, "top_p": 0.9, "stop": ["</s>"], "nested": {"a": 1}},
                     indent=2).encode() + b"\n"
    new = json.dumps({"temperature": 0.2, "top_p": 0.9, "stop": ["</s>"], "nested": {"a": 1, "b": 2}},
                     indent=2).encode() + b"\n"
    changes = key_changes("json", old, new)
    ch = _by_key(changes)
    assert set(ch) == {"temperature", "nested.b"} and ch["nested.b"].change == "added"
    out = render("json", old, new, changes, ["nested.b"])
    assert json.loads(out) == {"temperature": 0.7, "top_p": 0.9, "stop": ["</s>"], "nested": {"a": 1, "b": 2}}
    assert out.startswith(b'{\n  "temperature": 0.7') and out.endswith(b"}\n")


@pytest.mark.parametrize("fmt,old,new,why", [
    ("yaml", b"a: 1\n", b"a: [1\n", "does not parse as YAML"),
    ("yaml", b"a: 1\n---\nb: 2\n", b"a: 2\n---\nb: 2\n", "2 YAML documents"),
    ("yaml", b"a: 1\na: 2\n", b"a: 3\n", "does not parse as YAML"),
    ("yaml", b"- 1\n- 2\n", b"- 1\n- 3\n", "not a mapping"),
    ("yaml", b"base: &b {x: 1}\nuse: *b\n", b"base: {x: 2}\nuse: {x: 1}\n", "anchors or aliases"),
    ("yaml", b"# one\na: 1\n", b"# two\na: 2\n", "more than key values changed"),
    ("yaml", b"a: 1\nb: 2\n", b"b: 2\na: 1\n", "no key's value changed"),
    ("json", b'{"a": 1, "a": 2}', b'{"a": 3}', "twice"),
    ("json", b'{"a":1,  "b": 2}', b'{"a":2,  "b": 2}', "layout"),
    ("toml", b"a = 1\n", b"a = \n", "does not parse as TOML"),
])
def test_unfaithful_files_stay_whole_with_a_reason(fmt, old, new, why):
    got = key_changes(fmt, old, new)
    assert isinstance(got, Unfaithful) and why in got.reason, got


def test_paths_and_formats():
    for p in [("a",), ("a", "b", 2, "c"), ("x.y", "z"), ("weird key", 0)]:
        assert parse_path(format_path(p)) == p
    assert format_path(("a", "x.y", 2)) == 'a."x.y"[2]'
    assert format_of("/srv/repo/configs/feature_flags.yaml") == "yaml"
    assert format_of("/x/a.YML") == "yaml" and format_of("/x/r.toml") == "toml" and format_of("/x/s.json") == "json"
    assert format_of("/x/notes.txt") is None and format_of("/x/decode.serve-env") is None


def _key_deltas(path="/srv/repo/configs/feature_flags.yaml"):
    import hashlib

    from envbisect.state.deltas import Delta, per_key

    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    contents = {sha(YAML_OLD): YAML_OLD, sha(YAML_NEW): YAML_NEW}
    whole = Delta(f"file:node1:{path}", "file", "node1", None, path, None, "changed", sha(YAML_OLD), sha(YAML_NEW),
                  "snapshot:good")
    notes: list[str] = []
    return per_key([whole], contents, notes), contents, notes


def test_diff_and_target_state_per_key():
    from envbisect.state.configuration import FileOriginal, OriginalState, target_state

    deltas, contents, notes = _key_deltas()
    assert not notes
    ids = [d.id for d in deltas]
    guilty = "file:node1:/srv/repo/configs/feature_flags.yaml#decode_overlap_schedule"
    assert guilty in ids and "file:node1:/srv/repo/configs/feature_flags.yaml#list[1].x" in ids
    assert all(d.kind == "key" for d in deltas)
    key = ("node1", "/srv/repo/configs/feature_flags.yaml")
    original = OriginalState({key: FileOriginal(True, YAML_NEW)}, {})
    # revert --verdict: every delta but the guilty one stays applied
    t = target_state(original, deltas, [i for i in ids if i != guilty], contents)
    assert t.files[key] == YAML_NEW.replace(b"schedule: true", b"schedule: false")
    assert target_state(original, deltas, [], contents).files[key] == YAML_OLD
    # a run that left some keys out (--only): those keep the live file's value
    only = [d for d in deltas if d.id == guilty]
    t = target_state(original, only, [], contents)
    assert t.files[key] == YAML_NEW.replace(b"schedule: true", b"schedule: false")


def test_unfaithful_file_stays_one_delta_with_a_note():
    import hashlib

    from envbisect.state.deltas import Delta, per_key

    old, new = b"a: 1\n---\nb: 2\n", b"a: 2\n---\nb: 2\n"
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    whole = Delta("file:n:/x/a.yaml", "file", "n", None, "/x/a.yaml", None, "changed", sha(old), sha(new), "s")
    notes: list[str] = []
    assert per_key([whole], {sha(old): old, sha(new): new}, notes) == [whole]
    assert notes == ["n:/x/a.yaml: compared as a whole file, not per key: one side holds 2 YAML documents"]


def test_a_secret_in_a_structured_file_is_masked_and_learned():
    import hashlib

    from envbisect.inputs.masking import SecretMasker
    from envbisect.state.deltas import Delta, per_key
    from envbisect.state.structured import key_secrets

    token = "hf_SimFakeTokenDoNotUse0123456789abcdEF"
    old, new = b"hub:\n  hf_token: Xq7-pR2z-Lm9w-Tk4v\n", f"hub:\n  hf_token: {token}\n".encode()
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    whole = Delta("file:n:/x/a.yaml", "file", "n", None, "/x/a.yaml", None, "changed", sha(old), sha(new), "s")
    [d] = per_key([whole], {sha(old): old, sha(new): new}, [])
    m = SecretMasker()
    j = d.to_json(m)
    assert token not in json.dumps(j) and "Xq7-pR2z-Lm9w-Tk4v" not in json.dumps(j)
    assert j["id"] == "file:n:/x/a.yaml#hub.hf_token"
    m.learn_env(key_secrets([d]))
    assert "Xq7-pR2z-Lm9w-Tk4v" not in m.redact_text("a log line: Xq7-pR2z-Lm9w-Tk4v")


def test_toml_added_and_removed_keys():
    old = TOML_OLD.replace(b"# router config\n", b'# router config\ntitle = "r"  # t\n')
    new = old.replace(b"retries = 3\n", b"retries = 3\ntimeout_s = 30\n").replace(b'title = "r"  # t\n', b"")
    changes = key_changes("toml", old, new)
    ch = _by_key(changes)
    assert (ch["title"].change, ch["router.timeout_s"].change) == ("removed", "added")
    assert render("toml", old, new, changes, ["title"]) == old.replace(b'title = "r"  # t\n', b"")
    assert render("toml", old, new, changes, ["router.timeout_s"]) == old.replace(b"retries = 3\n",
                                                                                   b"retries = 3\ntimeout_s = 30\n")


def test_a_file_edited_since_the_diff_beyond_its_keys_is_refused_not_overwritten():
    from envbisect.errors import UsageError
    from envbisect.state.configuration import FileOriginal, OriginalState, target_state

    deltas, contents, _ = _key_deltas()
    key = ("node1", "/srv/repo/configs/feature_flags.yaml")
    edited = YAML_NEW.replace(b"# keep this comment", b"# someone edited this since")
    with pytest.raises(UsageError, match="changed since the diff in more than its key deltas"):
        target_state(OriginalState({key: FileOriginal(True, edited)}, {}), deltas, [], contents)
    # a live file with some keys reverted already is one of the renderings: accepted
    half = YAML_NEW.replace(b"schedule: true", b"schedule: false")
    t = target_state(OriginalState({key: FileOriginal(True, half)}, {}), deltas, [], contents)
    assert t.files[key] == YAML_OLD


def test_yaml_document_start_and_block_scalars_kept():
    old = b"---\n# flags\na: 1\nnote: |\n  line one\n  line two\nitems:\n- 1\n- 2\n"
    new = old.replace(b"a: 1", b"a: 2").replace(b"- 2\n", b"- 3\n")
    changes = key_changes("yaml", old, new)
    ch = _by_key(changes)
    assert set(ch) == {"a", "items[1]"}
    assert render("yaml", old, new, changes, ["items[1]"]) == old.replace(b"- 2\n", b"- 3\n")


def test_a_hotfix_to_a_structured_repo_file_is_per_key_and_still_a_repo_file():
    """Issue 24 part 3's last bullet: an uncommitted edit of a tracked YAML in a deployed repo is a
    delta per key, and each key delta is still known as a repo file (no checkout runs over it)."""
    import hashlib

    from envbisect.errors import UsageError
    from envbisect.state.configuration import check_applicable
    from envbisect.state.deltas import Delta, is_repo_file, per_key

    path = "/srv/src/configs/feature_flags.yaml"
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    why = ("uncommitted change to configs/feature_flags.yaml in the deployed repo /srv/src (tracked, not "
           "committed: a hotfix on the box?)",)
    hotfix = Delta(f"file:node1:{path}", "file", "node1", None, path, None, "changed", sha(YAML_OLD), sha(YAML_NEW),
                   "git:aaaa", why)
    keys = per_key([hotfix], {sha(YAML_OLD): YAML_OLD, sha(YAML_NEW): YAML_NEW}, [])
    assert f"file:node1:{path}#decode_overlap_schedule" in {d.id for d in keys}
    assert all(is_repo_file(d) for d in keys)
    git_d = Delta("git:node1:/srv/src", "git", "node1", None, "/srv/src", None, "changed", "a" * 40, "b" * 40, "s")
    with pytest.raises(UsageError, match="--exclude git:node1:/srv/src"):
        check_applicable([git_d, *keys])


@pytest.mark.parametrize("old, new, key", [
    # a key added at the end of a mapping that a blank line and a comment follow (blind red-team,
    # exact changes: the whole file was one delta, "more than key values changed")
    (b"a:\n  x: 1\n\n# c\nb: 2\n", b"a:\n  x: 1\n  y: 2\n\n# c\nb: 2\n", "a.y"),
    # and the same key removed again
    (b"a:\n  x: 1\n  y: 2\n\n# c\nb: 2\n", b"a:\n  x: 1\n\n# c\nb: 2\n", "a.y"),
    # at the top level, with a comment between
    (b"x: 1\n\n# c\n", b"x: 1\ny: 2\n\n# c\n", "y"),
])
def test_yaml_a_key_added_or_removed_before_a_comment_is_compared_per_key(old, new, key):
    changes = key_changes("yaml", old, new)
    assert [c.key for c in _by_key(changes).values()] == [key]
    assert render("yaml", old, new, changes, []) == old
    assert render("yaml", old, new, changes, [key]) == new
