import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envbisect.inputs.masking import MASK, SecretMasker, mask_hash

M = SecretMasker()

HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUv12"
SK = "sk-proj-" + "abcDEF123_ghiJKL456-mnoPQR789"
GH = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2"
GH_PAT = "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnop"
AWS = "AKIA" + "IOSFODNN7EXAMPLE"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
SLACK = "xoxb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOp"
PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    "MIIEpAIBAAKCAQEA1c7+9z5Pad7OejecsQ0bu3aozN3tihPmljnnudb9G3HECdnH\n"
    "lWu2/a1gB9JW5TBQ+AVpum9Okx7KfqkfBKL9mcHgSL0yWMdjMfNOqNtrQqKlN4kE\n"
    "-----END RSA PRIVATE KEY-----"
)
SHAPED = [HF, SK, GH, GH_PAT, AWS, JWT, SLACK, PEM]


def h8(v):
    """What a masker without a key of its own shows (its process's key)."""
    return mask_hash(v)


# ---------------------------------------------------------------- names


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "API_KEY",
        "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "GCP_CREDENTIALS", "PROXY_AUTH",
        "WANDB_API_KEY", "hf_token", "Hf_Token", "TOKEN", "SECRET", "PASSWD",
        "REDIS_PASS", "GOOGLE_APPLICATION_CREDENTIALS", "GIT_CREDENTIAL",
        "OPENAI_APIKEY", "AWS_ACCESS_KEY_ID", "SSH_PRIVATE_KEY", "DJANGO_SECRET_KEY",
        "MYSQL_PWD", "DB_PWD", "ANTHROPIC_API_KEYS", "accessToken", "apiKey",
        "clientSecret", "X-Api-Key", "Authorization", "Proxy-Authorization",
        "spring.datasource.password", "api-key", "SSH_PASSPHRASE",
    ],
)
def test_secret_names(name):
    assert M.is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "MAX_TOTAL_TOKENS", "KEY_CACHE_DTYPE", "SGLANG_KV_CACHE_DTYPE",
        "TOKENIZERS_PARALLELISM", "AUTHOR", "PASSTHROUGH", "NUM_KEYS", "PWD",
        "OLDPWD", "SGLANG_SM120_MMA_TARGET_CTAS", "CUDA_VISIBLE_DEVICES", "AUTHORITY",
        "KEY", "API", "PATH", "HOME", "TOKENIZER", "NUM_TOKENS", "SSH_AUTH_SOCK",
        "XAUTHORITY", "SSH_ASKPASS", "BYPASS", "KEYS", "PUBLIC_KEY", "API_URL",
        "CACHE_KEY", "SECRETS", "pwd", "", "   ",
    ],
)
def test_not_secret_names(name):
    assert not M.is_secret_name(name)


def test_extra_names_exact_and_glob():
    m = SecretMasker(extra_names=["MY_CLUSTER_PASS", "*_PASSCODE", "corp_?ey", "PWD"])
    assert m.is_secret_name("MY_CLUSTER_PASS")
    assert m.is_secret_name("my_cluster_pass")
    assert m.is_secret_name("VAULT_PASSCODE")
    assert m.is_secret_name("vault_passcode")
    assert m.is_secret_name("CORP_KEY")
    assert m.is_secret_name("PWD")  # an explicit playbook name wins
    assert not m.is_secret_name("MY_CLUSTER")
    assert not m.is_secret_name("PASSCODE_LEN")
    assert not SecretMasker().is_secret_name("VAULT_PASSCODE")


# --------------------------------------------------------------- values


@pytest.mark.parametrize("value", SHAPED)
def test_value_shapes_are_secret(value):
    assert M.is_secret_value(value)
    assert M.is_secret_value(f"prefix {value} suffix")


@pytest.mark.parametrize(
    "value",
    [
        "", "hf_short", "sk-short", "ghp_short", "AKIA1234", "hello world",
        "/usr/local/cuda/bin", "0,1,2,3", "bfloat16", "fp8_e5m2",
        "meta-llama/Llama-3.1-8B-Instruct", "xoxb-1", "eyJhbGciOi",
        "task-abcdefghijklmnopqrstuvwxyz",  # 'sk-' inside a word
        "sha256:" + "0" * 64, "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----",
        "AKIAIOSFODNN7EXAMPLEX",  # too long to be an access key id
    ],
)
def test_not_secret_values(value):
    assert not M.is_secret_value(value)


def test_extra_values_literal():
    m = SecretMasker(extra_values=["hunter2", "a.b*c", "", "  "])
    assert m.is_secret_value("hunter2")
    assert m.is_secret_value("pw=hunter2;")
    assert m.is_secret_value("x a.b*c y")
    assert not m.is_secret_value("aXbbc")  # literal, not a regex
    assert not m.is_secret_value("plain")  # blank extras are ignored


# ----------------------------------------------------------- mask_value


def test_mask_value_unchanged_when_not_secret():
    for name, value in [
        ("PATH", "/usr/bin:/bin"),
        ("MAX_TOTAL_TOKENS", "4096"),
        ("PWD", "/home/me"),
        ("CUDA_VISIBLE_DEVICES", "0,1"),
        ("KEY_CACHE_DTYPE", "fp8_e5m2"),
    ]:
        assert M.mask_value(name, value) == value


def test_mask_value_none_and_empty():
    assert M.mask_value("HF_TOKEN", None) is None
    assert M.mask_value("HF_TOKEN", "") == ""
    assert M.mask_value("PATH", None) is None


def test_mask_value_hint_and_hash():
    out = M.mask_value("HF_TOKEN", HF)
    assert out == f"hf_{MASK}(masked, sha256:{h8(HF)})"
    assert HF not in out
    assert mask_hash(HF) == M.mask_value("HF_TOKEN", HF).split("sha256:")[1][:8]
    assert M.mask_value("DB_PASSWORD", "hunter2") == f"{MASK}(masked, sha256:{h8('hunter2')})"
    assert M.mask_value("AWS_ACCESS_KEY_ID", AWS).startswith("AKIA" + MASK)
    assert M.mask_value("GH", GH).startswith("ghp_" + MASK)
    assert M.mask_value("X", GH_PAT).startswith("github_pat_" + MASK)
    assert M.mask_value("X", SK).startswith("sk-" + MASK)
    assert M.mask_value("X", SLACK).startswith("xoxb-" + MASK)
    assert M.mask_value("X", JWT).startswith("eyJ" + MASK)
    assert M.mask_value("X", PEM).startswith("-----BEGIN RSA PRIVATE KEY-----" + MASK)


def test_mask_value_secret_value_under_innocent_name():
    assert M.mask_value("SOME_VAR", HF) == f"hf_{MASK}(masked, sha256:{h8(HF)})"
    m = SecretMasker(extra_values=["hunter2"])
    assert m.mask_value("NOTE", "hunter2") == f"{MASK}(masked, sha256:{h8('hunter2')})"


def test_mask_value_masks_only_the_secret_part_of_innocent_values():
    out = M.mask_value("SGLANG_ARGS", f"--port 30000 --api-key {SK} --tp 2")
    assert out == f"--port 30000 --api-key sk-{MASK}(masked, sha256:{h8(SK)}) --tp 2"
    out = M.mask_value("DATABASE_URL", "postgres://admin:pw123@db:5432/app")
    assert out == f"postgres://admin:{MASK}(masked, sha256:{h8('pw123')})@db:5432/app"


def test_hash_hint_is_stable_and_tracks_changes():
    a1 = M.mask_value("HF_TOKEN", HF)
    a2 = SecretMasker(extra_names=["X"]).mask_value("HF_TOKEN", HF)
    b = M.mask_value("HF_TOKEN", HF[:-1] + "Z")
    assert a1 == a2
    assert a1 != b
    assert a1.startswith("hf_") and b.startswith("hf_")
    # the same value gets the same hash under a different name and via redact_text
    assert M.mask_value("OTHER_TOKEN", HF) == a1
    assert M.redact_text(f"HF_TOKEN={HF}") == f"HF_TOKEN={a1}"


def test_mask_value_is_idempotent():
    once = M.mask_value("HF_TOKEN", HF)
    assert M.mask_value("HF_TOKEN", once) == once
    assert M.redact_text(f"HF_TOKEN={once}") == f"HF_TOKEN={once}"


# ---------------------------------------------------------- redact_text

LOG = f"""\
[2026-12-02 12:00:01] INFO server_args: model=/models/llama tp=2 max_total_tokens=4096
[2026-12-02 12:00:01] INFO env: HF_TOKEN={HF} CUDA_VISIBLE_DEVICES=0,1 PWD=/srv/app
+ python -m sglang.launch_server --port 30000 --api-key {SK} --tp 2
+ export DB_PASSWORD="correct horse battery"
+ curl -H 'Authorization: Bearer abcdefghijklmnop123' http://localhost:30000/v1/models
password: hunter2
WANDB_API_KEY = 0123456789abcdef
proxy_auth=user:pw TOKENIZERS_PARALLELISM=false
db=postgres://app:dbpass99@10.0.0.5:5432/main
GIT_TOKEN={GH} aws={AWS} jwt={JWT} slack={SLACK}
key: {PEM}
done; KEY_CACHE_DTYPE=fp8_e5m2 MAX_TOTAL_TOKENS=4096
"""

LOG_SECRETS = [
    HF, SK, "correct horse battery", "abcdefghijklmnop123", "hunter2",
    "0123456789abcdef", "user:pw", "dbpass99", GH, AWS, JWT, SLACK,
    "MIIEpAIBAAKCAQEA1c7", "lWu2/a1gB9JW5TBQ",
]


def test_redact_log_excerpt():
    out = M.redact_text(LOG)
    for s in LOG_SECRETS:
        assert s not in out, s
    # real deltas stay visible
    for keep in [
        "model=/models/llama", "tp=2", "max_total_tokens=4096", "CUDA_VISIBLE_DEVICES=0,1",
        "PWD=/srv/app", "--port 30000", "--tp 2", "TOKENIZERS_PARALLELISM=false",
        "http://localhost:30000/v1/models", "@10.0.0.5:5432/main",
        "KEY_CACHE_DTYPE=fp8_e5m2 MAX_TOTAL_TOKENS=4096", "done;",
    ]:
        assert keep in out, keep
    assert f"HF_TOKEN=hf_{MASK}(masked, sha256:{h8(HF)})" in out
    assert f'DB_PASSWORD="{MASK}(masked, sha256:{h8("correct horse battery")})"' in out
    assert f"password: {MASK}(masked, sha256:{h8('hunter2')})" in out
    assert out.count("\n") == LOG.count("\n") - PEM.count("\n")  # only the PEM block folds


def test_redact_json_stays_valid_json():
    doc = {
        "HF_TOKEN": HF,
        "DB_PASSWORD": "p@ss \"quoted\" w0rd",
        "PIN_PASSWORD": 123456,
        "API_KEY": None,
        "AUTH": True,
        "MAX_TOTAL_TOKENS": 4096,
        "TOKENIZERS_PARALLELISM": "false",
        "nested": {"apiKey": "abc123xyz", "accessToken": "zzz", "model": "llama"},
        "log": f"started with Authorization: Bearer abcdefghijk and {SK}\nnext line",
        "pem": PEM + "\n",
        "env": ["HF_TOKEN=plainsecret1", "PATH=/usr/bin"],
    }
    for text in (json.dumps(doc), json.dumps(doc, indent=2)):
        out = M.redact_text(text)
        back = json.loads(out)
        assert back["HF_TOKEN"] == f"hf_{MASK}(masked, sha256:{h8(HF)})"
        assert back["DB_PASSWORD"].startswith(MASK)
        assert back["PIN_PASSWORD"].startswith(MASK)  # number -> masked string
        assert back["API_KEY"] is None and back["AUTH"] is True  # literals kept
        assert back["MAX_TOTAL_TOKENS"] == 4096
        assert back["TOKENIZERS_PARALLELISM"] == "false"
        assert back["nested"]["model"] == "llama"
        assert back["nested"]["apiKey"].startswith(MASK)
        assert back["nested"]["accessToken"].startswith(MASK)
        assert back["log"].startswith("started with Authorization: ")
        assert back["log"].endswith("\nnext line")
        assert back["pem"].startswith("-----BEGIN RSA PRIVATE KEY-----" + MASK)
        assert back["env"][0].startswith("HF_TOKEN=" + MASK)
        assert back["env"][1] == "PATH=/usr/bin"
        for s in [HF, "w0rd", "123456", "abc123xyz", "abcdefghijk", SK, "MIIEp",
                  "plainsecret1"]:
            assert s not in out, s


def test_redact_python_repr_and_yaml():
    text = "{'HF_TOKEN': 'abc123', 'PORT': '30000'}\nsecrets:\n  db_password: 'x y z'\n  user: bob\n"
    out = M.redact_text(text)
    assert "abc123" not in out and "x y z" not in out
    assert "'PORT': '30000'" in out and "user: bob" in out


def test_redact_extra_values_everywhere():
    m = SecretMasker(extra_values=["s3cr3t-cluster", "zz"])
    text = "connecting with s3cr3t-cluster (again: s3cr3t-cluster) zz"
    out = m.redact_text(text)
    assert "s3cr3t-cluster" not in out and "zz" not in out
    assert out.count(MASK) == 3
    assert out.startswith("connecting with ")


def test_redact_extra_names():
    m = SecretMasker(extra_names=["MY_CLUSTER_PASS", "*_PIN"])
    out = m.redact_text('MY_CLUSTER_PASS=abc SIM_PIN=1234 OTHER=1 {"card_pin": "9876"}')
    assert "abc" not in out and "1234" not in out and "9876" not in out
    assert "OTHER=1" in out


def test_redact_leaves_plain_text_alone():
    text = (
        "KV cache dtype fp8; tokens/s=1234; author: alice; PWD=/x; OLDPWD=/y\n"
        "time 12:00:01 ratio=0.5 key_cache_dtype: auto num_keys=3 a == b\n"
    )
    assert M.redact_text(text) == text
    assert M.redact_text("") == ""


def test_redact_is_idempotent():
    once = M.redact_text(LOG)
    assert M.redact_text(once) == once
    j = M.redact_text(json.dumps({"HF_TOKEN": HF, "pem": PEM}))
    assert M.redact_text(j) == j


def test_unterminated_pem_is_masked_through_body():
    text = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nAbCdEf0123456789"
    out = M.redact_text(text)
    assert "MIIEvQ" not in out and "AbCdEf0123" not in out


def test_url_without_password_is_kept():
    text = "git clone https://github.com/org/repo.git and ssh://git@host:22/x"
    assert M.redact_text(text) == text


# ------------------------------------------------------------ properties

_secret_text = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="\"'\\"),
    min_size=9,
    max_size=40,
).filter(lambda s: any(c.isalnum() for c in s))
_secret_names = st.sampled_from(
    ["HF_TOKEN", "DB_PASSWORD", "OPENAI_API_KEY", "PROXY_AUTH", "GCP_CREDENTIALS"]
)


@settings(max_examples=300, deadline=None)
@given(name=_secret_names, value=_secret_text)
def test_prop_masked_output_never_contains_secret(name, value):
    out = M.mask_value(name, value)
    assert value not in out
    assert out.endswith(f"(masked, sha256:{h8(value)})")
    slot = "\x00"
    for template in (
        f"{name}={slot}",
        f'export {name}="{slot}"',
        f"{name}: {slot}",
        json.dumps({name: "@@", "other": 1}).replace("@@", slot),
        f"--{name.lower().replace('_', '-')} {slot}",
    ):
        if template.startswith("--") and value.startswith("-"):
            continue  # a flag-looking value is taken for the next flag
        if value in template.replace(slot, ""):
            continue  # e.g. value "CREDENTIA" is spelled inside the name itself
        line = template.replace(slot, value)
        red = M.redact_text(line)
        assert value not in red, line
        assert MASK in red, line


@settings(max_examples=300, deadline=None)
@given(
    before=st.text(max_size=60),
    after=st.text(max_size=60),
    secret=st.sampled_from(SHAPED),
)
def test_prop_shaped_secrets_redacted_anywhere(before, after, secret):
    # separate with spaces so the secret is not glued onto surrounding word chars
    text = f"{before} {secret} {after}"
    out = M.redact_text(text)
    body = secret.splitlines()[1] if "\n" in secret else secret[4:]
    assert body not in out


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200), extra=_secret_text)
def test_prop_extra_values_never_survive(text, extra):
    m = SecretMasker(extra_values=[extra])
    mid = len(text) // 2
    src = text[:mid] + extra + text[mid:]
    assert extra not in m.redact_text(src)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_prop_redact_never_crashes_and_is_idempotent(text):
    once = M.redact_text(text)
    assert M.redact_text(once) == once


# ------------------------------------------- issue 8: names, shapes, over-mask, hygiene

from envbisect.inputs.masking import encodable, printable, strip_escapes  # noqa: E402


@pytest.mark.parametrize(
    "name",
    ["GITHUB_PAT", "GITLAB_PAT", "MY_PAT", "ENCRYPTION_KEY", "SIGNING_KEY", "JWT_SIGNING_KEY",
     "SENTRY_DSN", "DATABASE_DSN", "HMAC_KEY", "MASTER_KEY", "HF_TOKEN", "ACCESS_TOKEN", "TOKEN"],
)
def test_secret_names_issue8(name):
    assert M.is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["SGLANG_MAX_TOKEN_LEN", "MAX_TOKENS", "SGLANG_TOKEN_LIMIT", "TOKEN_BUDGET", "NUM_TOKEN",
     "PATH", "PATCH_LEVEL", "HTTP_PATH", "PATTERN", "DSNAME", "SIGNING_ALGORITHM", "ENCRYPTION"],
)
def test_not_secret_names_issue8(name):
    assert not M.is_secret_name(name)
    assert M.mask_value(name, "4096") == "4096"


def test_password_containing_at_is_masked_whole():
    for url, pw in [("https://user:p@ss@host/x", "p@ss"), ("redis://:p@ss@w0rd@cache:6379", "p@ss@w0rd"),
                    ("SENTRY=https://k:s3@cr@t@o1.ingest.sentry.io/5", "s3@cr@t")]:
        out = M.redact_text(url)
        assert pw not in out and "ss@" not in out and "@cr" not in out, out
        assert f"{MASK}(masked, sha256:{h8(pw)})@" in out
    assert M.redact_text("postgres://admin:pw123@db:5432/app") == \
        f"postgres://admin:{MASK}(masked, sha256:{h8('pw123')})@db:5432/app"


def test_40_hex_token_value_is_masked_but_commits_are_kept():
    tok = "0123456789abcdef0123456789abcdef01234567"
    assert M.mask_value("WEBHOOK", tok) == f"{MASK}(masked, sha256:{h8(tok)})"
    assert M.mask_value("DD_APP", tok + "89abcdef") != tok + "89abcdef"
    out = M.redact_text(f"export WEBHOOK={tok}\nGIT_COMMIT={tok} SRC_SHA={tok}\nHEAD {tok}")
    assert out.count(tok) == 3 and f"WEBHOOK={MASK}" in out  # commits, digests and free text kept
    assert M.mask_value("X", "0123abcd") == "0123abcd"  # short hex is not a token


@pytest.mark.parametrize("value", [GH, GH_PAT, AWS, JWT, "glpat-" + "abcdefghij0123456789"])
def test_token_shapes_in_any_context(value):
    for text in (value, f"x={value}", f'"v": "{value}"', f"https://{value}@github.com/o/r",
                 f"Authorization: Bearer {value}", f"[{value}]"):
        assert value not in M.redact_text(text), text


def test_learned_values_are_replaced_literally_everywhere():
    m = SecretMasker()
    m.learn_env([("HF_TOKEN", "plain-looking-secret"), ("PORT", "30000"), ("DB_PASSWORD", "abc"),
                 ("API_KEY", "4096"), ("AUTH", "true")])
    out = m.redact_text("worker said: plain-looking-secret rejected; port 30000 4096 true abc")
    assert "plain-looking-secret" not in out and "port 30000 4096 true abc" in out
    assert m.known_values == ("plain-looking-secret",)


def test_redact_obj_masks_keys_values_and_numbers():
    doc = {"HF_TOKEN": "anything", "PIN_PASSWORD": 1234, "n": 5, "ok": True, "decode:HF_TOKEN": "id",
           "log": [f"GITHUB_PAT={GH}", "MAX_TOKENS=7"], "nested": {"SENTRY_DSN": "https://a:b@s/1"}}
    out = M.redact_obj(doc)
    assert out["HF_TOKEN"].startswith(MASK) and out["PIN_PASSWORD"].startswith(MASK)
    assert out["n"] == 5 and out["ok"] is True and out["decode:HF_TOKEN"] == "id"
    assert out["log"][1] == "MAX_TOKENS=7" and GH not in out["log"][0]
    assert out["nested"]["SENTRY_DSN"].startswith(MASK)
    assert json.loads(M.redact_json(doc)) == out


def test_printable_makes_escapes_visible():
    assert printable("a\x1b[31mred\x1b[0m") == "a\\x1b[31mred\\x1b[0m"
    assert printable("\x1b]0;pwned\x07") == "\\x1b]0;pwned\\x07"
    assert printable("x\r\x00y\x9b\u202e") == "x\\r\\x00y\\x9b\\u202e"
    assert printable("caf\udce9") == "caf\\xe9"  # a byte that was not UTF-8
    assert printable("a\tb\nc") == "a\tb\nc"
    assert printable("a\tb\nc", keep_newlines=False) == "a\\tb\\nc"
    assert printable("plain [bold]é ✓") == "plain [bold]é ✓"


def test_strip_escapes_and_encodable():
    assert strip_escapes("HF_TOKEN\x1b[0m=x\x1b]8;;http://e\x1b\\link") == "HF_TOKEN=xlink"
    assert encodable("caf\udce9").encode("utf-8") == b"caf\\xe9"


def test_a_known_value_cut_at_the_edge_of_a_text_is_still_masked():
    # a probe keeps the last 160 characters of its output, a log tail the last 2000: the cut can
    # fall inside a secret, and what is left has no recognisable shape
    m = SecretMasker()
    m.learn_env([("SESSION", JWT), ("WEBHOOK", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b"),
                 ("DB_URL", "postgres://app:dbp@ss@w0rd@db/x"), ("ARGS", f"--port 1 --api-key {SK}")])
    out = m.redact_text(JWT[25:] + " ok 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b ... " + SK[:12])
    assert JWT[25:40] not in out and "9f86d081" not in out and SK[3:12] not in out
    assert " ok " in out and " ... " in out
    assert m.redact_text("--port 1 stays") == "--port 1 stays"  # only the secret parts were learned
    assert m.redact_text("abc" + JWT[-7:]) == "abc" + JWT[-7:]  # 7 characters are not enough to tell


# --- red team of main: file content, header credentials, paths that end in a secret word ---------

NETRC_PW = "Pq8vZt3LmN0x"


@pytest.mark.parametrize("content", [
    f'NETRC_LINE="machine pypi.internal login ci password {NETRC_PW}"\n',
    f"export NETRC_LINE='machine pypi.internal login ci password {NETRC_PW}'\n",
    f"NETRC_LINE=machine\\ pypi.internal\\ login\\ ci\\ password\\ {NETRC_PW}\n",
    f'X=1\nNETRC="default login ci password {NETRC_PW}" # the mirror\n',
])
def test_netrc_password_in_a_quoted_env_line_is_masked_in_file_content(content):
    """Red team: the netrc rule wanted whitespace before `machine`, so inside quotes (an env file's
    content, as the bundle inlines it) the password stayed raw while `diff` (the value) masked it."""
    m = SecretMasker()
    out = m.redact_text(content)
    assert NETRC_PW not in out and MASK in out, out
    assert "pypi.internal" in out or "default login ci" in out  # only the password goes
    # and the value alone, as diff shows it, is masked the same way (one rule for values and files)
    assert NETRC_PW not in m.mask_value("NETRC_LINE", f"machine pypi.internal login ci password {NETRC_PW}")


def test_netrc_password_keeps_a_quote_inside_it():
    m = SecretMasker()
    out = m.redact_text("NETRC=\"machine h login u password pa'ss9Wd\"")
    assert "ss9Wd" not in out and "pa'" not in out, out


def test_aws_like_base64_values_of_40_and_more_characters_are_masked_under_any_name():
    """Red team: a 42-character AWS-like value under an innocent name was raw (the rule was exactly 40)."""
    m = SecretMasker()
    for n in (40, 42, 64, 88):
        v = ("wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY" * 3)[:n - 1] + "9"
        assert v not in m.mask_value("UPSTREAM_SIG", v), n
        assert v not in m.redact_text(f"UPSTREAM_SIG={v}\n"), n
        assert v not in m.redact_text(f'UPSTREAM_SIG="{v}"\n'), n
    padded = "aGVsbG8gd29ybGQ+PT09PT0+aGVsbG8gd29ybGQ+PT09PT0=="
    assert m.mask_value("UPSTREAM_SIG", padded).startswith(MASK)  # padded base64 too
    assert m.mask_value("GIT_COMMIT", "0123456789abcdef0123456789abcdef01234567").startswith("0123")  # a commit
    for keep in ("/opt/models/Meta-Llama-3.1-70B-Instruct-FP8/tokenizer.json",
                 "ThisIsAVeryLongCamelCaseIdentifierWithoutDigits"):
        assert m.mask_value("MODEL_PATH", keep) == keep


@pytest.mark.parametrize("line, kept", [
    ('+ HDR=Authorization: Basic ZGVwbG95Okh1bnRlcjJQdzl4   [decode:HDR; 1 change]', ["[decode:HDR; 1 change]",
                                                                                    "Authorization: Basic "]),
    ("decode: HDR file=Authorization: Basic ZGVwbG95Okh1bnRlcjJQdzl4 process=Authorization: Basic "
     "ZGVwbG95Okh1bnRlcjJQdzl4 (restart to apply)", [" process=Authorization: Basic ", "(restart to apply)"]),
    ('curl -H "Authorization: Bearer ZGVwbG95Okh1bnRlcjJQdzl4" http://x/', ['" http://x/', "Bearer "]),
    ("Proxy-Authorization: Basic ZGVwbG95Okh1bnRlcjJQdzl4", ["Proxy-Authorization: Basic "]),
])
def test_an_authorization_header_masks_the_credential_not_the_rest_of_the_line(line, kept):
    """Red team: `+ HDR=Authorization: ••••(masked…)••••(masked…)` swallowed the delta id after it,
    and the drift line lost ` process=`."""
    m = SecretMasker()
    once = m.redact_text(line)
    twice = m.redact_text(m.redact_text(m.mask_value("HDR", "Authorization: Basic ZGVwbG95Okh1bnRlcjJQdzl4")
                                        .join(line.split("Authorization: Basic ZGVwbG95Okh1bnRlcjJQdzl4", 1)))
                          if "Basic ZGV" in line else once)
    for out in (once, twice):
        assert "ZGVwbG95Okh1bnRlcjJQdzl4" not in out, out
        for k in kept:
            assert k in out, (k, out)
        assert out.count(MASK) == line.count("ZGVwbG95Okh1bnRlcjJQdzl4"), out


@pytest.mark.parametrize("line", [
    "secrets/db_password: expected '=' after a key (line 3)",
    "FAIL /etc/passwd: not a gzip file",
    "envbisect: error: ./vault/api_token: no such file",
    "/run/secrets/PASSWORD: permission denied",
])
def test_a_path_that_ends_in_a_secret_word_is_not_a_secret_key(line):
    """Red team: `secrets/db_password: <reason>` and `FAIL /etc/passwd: <reason>` hid the reason."""
    assert SecretMasker().redact_text(line) == line


def test_a_secret_key_after_a_colon_is_still_masked():
    m = SecretMasker()
    for line in ("db_password: hunter2", "  password: hunter2", "PASSWORD: hunter2", '{"x": 1} password: hunter2'):
        assert "hunter2" not in m.redact_text(line), line


def test_the_hash_of_a_masked_value_is_keyed_with_the_stores_key(tmp_path):
    """A bundle's `sha256:f52fbd32` for DB_PASSWORD=hunter2 was the unsalted SHA-256 prefix: a
    dictionary matched it. It is HMAC-SHA256 with a key derived from the store's journal key: the
    same within one store (a changed secret still shows), unmatchable without the key."""
    from envbisect.state.store import Store

    plain = hashlib.sha256(b"hunter2").hexdigest()[:8]
    a, b = Store(tmp_path / "a"), Store(tmp_path / "b")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ka, kb = a.mask_key(), b.mask_key()
    assert ka and kb and ka != kb and ka not in (a.journal_key(create=False),) and a.mask_key() == ka
    shown = SecretMasker(key=ka).mask_value("DB_PASSWORD", "hunter2")
    assert plain not in shown and mask_hash("hunter2", ka) in shown
    assert SecretMasker(key=ka).mask_value("DB_PASSWORD", "hunter2") == shown  # one store: alike
    assert mask_hash("hunter2", kb) not in shown and plain not in M.mask_value("DB_PASSWORD", "hunter2")
