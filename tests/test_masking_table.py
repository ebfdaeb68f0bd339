"""What is masked and what is not, one row per case (issue 22, F8). Every must-mask row names the secret
that must not survive; every must-not-mask row must come back unchanged."""
from __future__ import annotations

import pytest

from envbisect.inputs.masking import MASK, SecretMasker

M = SecretMasker()
SHA = "3f786850e387550fdab836ed7e6dc881de23001b"  # a commit
SLACK_HOOK = "https://hooks.slack.com/services/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"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
HEX32 = "9c1185a5c5e9fc54612808977ee8f548"

# (case, name or None for free text, value / text, the secret that must not appear)
MUST_MASK = [
    ("URL password containing /", "DATABASE_URL", "postgres://app:s3cr/t+pw@db.internal:5432/app", "s3cr/t+pw"),
    ("URL password containing / in free text", None, "dsn=postgres://app:ab/cd/ef99@db/app ok", "ab/cd/ef99"),
    ("URL user containing @", "DB_URL", "postgres://ops@corp.example:Zq9!pw77@db/app", "Zq9!pw77"),
    ("token used as the URL user", "REPO_URL", "https://Xk3hG9pQ2mL7vR4tW8zY1nB6@git.example.com/o/r.git",
     "Xk3hG9pQ2mL7vR4tW8zY1nB6"),
    ("*_KEY without a qualifier", "OPENAI_KEY", "abc123-not-shaped", "abc123-not-shaped"),
    ("SSH_KEY", "SSH_KEY", "AAAAC3NzaC1lZDI1NTE5", "AAAAC3NzaC1lZDI1NTE5"),
    ("32-hex key under an innocent name", "DD_APP", HEX32, HEX32),
    ("32-hex key in free text assignment", None, f"export DD_APP={HEX32}", HEX32),
    ("Stripe restricted key", "PAYMENTS", "rk_live_51HxYzAbCdEfGhIjKlMnOpQr", "51HxYzAbCdEfGhIjKlMnOpQr"),
    ("Stripe secret key in text", None, "key is sk_live_4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"),
    ("Slack webhook URL", "NOTIFY", SLACK_HOOK, "q1w2e3r4t5y6u7i8o9p0AbCd"),
    ("Slack webhook URL in a log", None, f"posting to {SLACK_HOOK} failed", "B0FG34HIJ/q1w2e3r4t5y6u7i8o9p0AbCd"),
    ("AWS secret key under an innocent name", "BACKUP_S3", AWS_SECRET, AWS_SECRET),
    ("curl -u user:pw", None, "curl -u admin:Hunter2pw https://x/y", "Hunter2pw"),
    ("curl --user=user:pw", None, "curl --user=admin:Hunter2pw https://x/y", "Hunter2pw"),
    ("--api-key inside an argument string", "SGLANG_ARGS", "--port 30000 --api-key plainvalue123", "plainvalue123"),
    ("netrc line", None, "machine api.example.com login bot password n3tRcPw!", "n3tRcPw!"),
    ("netrc on several lines", None, "machine h\n  login u\n  password n3tRcPw2\n", "n3tRcPw2"),
    ("DB_PASS", "DB_PASS", "x", "x"),
    ("BASIC_AUTH", "BASIC_AUTH", "user:pw", "user:pw"),
    ("AUTH_TOKEN", "AUTH_TOKEN", "tok", "tok"),
    ("PASSWORD", "POSTGRES_PASSWORD", "pw", "pw"),
]

# (case, name or None for free text, value / text)
MUST_NOT_MASK = [
    ("*_PASS_* knob", "SGLANG_NUM_PASS_LAYERS", "4"),
    ("AUTH_* knob", "AUTH_MODE", "none"),
    ("AUTH_ENABLED", "ROUTER_AUTH_ENABLED", "false"),
    ("*_TOKEN_CACHE", "HF_TOKEN_CACHE", "/data/hf/token-cache"),
    ("*_PASSWORD_FILE is a path", "POSTGRES_PASSWORD_FILE", "/run/secrets/pg"),
    ("PUBLIC_KEY", "PUBLIC_KEY", "ssh-ed25519 AAAAC3Nza"),
    ("CACHE_KEY", "CACHE_KEY", "prefix-v2"),
    ("KEY alone", "KEY", "value"),
    ("a commit sha in free text", None, f"HEAD {SHA} (was 1a2b3c4)"),
    ("a commit sha under a commit name", "GIT_COMMIT", SHA),
    ("a commit sha in a diff line", None, f"repo /srv/sglang: {SHA[:12]} -> {SHA}"),
    ("a 32-hex digest under a digest name", "MODEL_MD5", HEX32),
    ("a 32-hex id", "RUN_ID", HEX32),
    ("a 32-hex value in free text", None, f"md5 {HEX32} ok"),
    ("a URL with a port and an @ in the path", None, "https://npm.example:443/@scope/pkg"),
    ("a URL with a user only", None, "ssh://git@github.com:22/org/repo.git"),
    ("a URL with a short user", None, "https://deploy@git.example.com/o/r.git"),
    ("python -u", None, "python -u serve.py --port 30000"),
    ("docker -u uid:gid", None, "docker run -u 1000:1000 img"),
    ("a path", "MODEL_PATH", "/models/Qwen3-235B-A22B-FP8/decode"),
    ("prose with password", None, "password authentication failed for user decode"),
]


@pytest.mark.parametrize("case,name,value,secret", MUST_MASK, ids=[c[0] for c in MUST_MASK])
def test_must_mask(case, name, value, secret):
    out = M.mask_value(name, value) if name else M.redact_text(value)
    assert secret not in out and MASK in out, out
    # and what is learned from the env file finds it again in any other text
    if name:
        m = SecretMasker()
        m.learn_env([(name, value)])
        if len(secret) >= 8:
            assert any(secret in v for v in m.known_values), case


@pytest.mark.parametrize("case,name,value", MUST_NOT_MASK, ids=[c[0] for c in MUST_NOT_MASK])
def test_must_not_mask(case, name, value):
    out = M.mask_value(name, value) if name else M.redact_text(value)
    assert out == value


@pytest.mark.parametrize("secret_name,value", [("HF_TOKEN", "decode"), ("DB_PASSWORD", "sglang-decode"),
                                               ("API_KEY", "password"), ("AUTH_PASSWORD", "prefill1"),
                                               ("GOOGLE_APPLICATION_CREDENTIALS", "/etc/gcp/decode-sa.json")])
def test_a_common_word_learned_as_a_secret_is_not_masked_elsewhere(secret_name, value):
    m = SecretMasker()
    m.learn_env([(secret_name, value)])
    assert m.mask_value(secret_name, value).startswith(MASK)  # still masked as NAME=VALUE
    text = "service decode on /srv/sglang-decode/decode.serve-env: password ok; prefill1 up; /etc/gcp/decode-sa.json"
    assert m.redact_text(text) == text


def test_learned_secrets_are_found_again_literally():
    m = SecretMasker()
    m.learn_env([("DATABASE_URL", "postgres://app:s3cr/t+pw@db/app"), ("NOTIFY", SLACK_HOOK),
                 ("CURL", "curl -u admin:Hunter2pw x"), ("BACKUP_S3", AWS_SECRET), ("OPENAI_KEY", "abc123-not-shaped")])
    out = m.redact_text(f"s3cr/t+pw ... {SLACK_HOOK} Hunter2pw {AWS_SECRET} abc123-not-shaped")
    for s in ("s3cr/t+pw", "q1w2e3r4t5y6u7i8o9p0AbCd", "Hunter2pw", AWS_SECRET, "abc123-not-shaped"):
        assert s not in out, s


def test_a_process_environment_in_a_json_document_is_masked_by_the_same_rules():
    env = {"DD_APP": HEX32, "BACKUP_S3": AWS_SECRET, "GIT_COMMIT": SHA, "NOTIFY": SLACK_HOOK, "AUTH_MODE": "none"}
    out = M.redact_obj({"environ": env, "old": SHA, "new": SHA, "sha256": HEX32})
    assert HEX32 not in str(out["environ"]) and AWS_SECRET not in str(out) and "q1w2e3r4" not in str(out)
    assert out["environ"]["GIT_COMMIT"] == SHA and out["environ"]["AUTH_MODE"] == "none"
    assert (out["old"], out["new"], out["sha256"]) == (SHA, SHA, HEX32)  # git HEADs and digests stay visible
