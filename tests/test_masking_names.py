"""Secret names the masker's word rules recognise (inputs/masking.py): common credential names
that a red-team found shown raw, and, over the real SGLang 0.5.23 release's environ.py, no
SGLang knob that is not a secret."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from envbisect.inputs.masking import MASK, SecretMasker
from envbisect.report.redaction import Redactor

RAW = "Hu2-n7er-xyz"  # no recognisable shape: only the name can tell
SECRET_NAMES = ["PGPASSWORD", "ADMIN_PW", "DB_PW", "SECRETKEY", "APP_SECRETKEY", "MYSQL_PASSWD", "LDAP_PASSWD",
                "AWS_CREDS", "CREDS", "DB_CRED", "DOCKER_AUTH_CONFIG", "SLACK_WEBHOOK", "ALERT_WEBHOOK_URL",
                "WEBHOOK_URL", "SESSION_COOKIE", "apiToken", "DB_APITOKEN"]
ENVIRON = Path.home() / ".cache/envbisect/sglang/0.5.23/sglang/srt/environ.py"


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_common_secret_names_are_masked_in_every_form(name):
    m = SecretMasker()
    assert m.is_secret_name(name)
    for text in (f"export {name}={RAW}\n", f'{name}="{RAW}"', f'{{"{name}": "{RAW}"}}', f"{name}: {RAW}"):
        out = m.redact_text(text)
        assert RAW not in out and MASK in out, (text, out)
    assert RAW not in Redactor(SecretMasker()).json_text({"environ": {name: RAW}})


@pytest.mark.parametrize("cmd", [f"mysql -uroot -p{RAW} prod", f"mysqldump -h db -u ops -p{RAW} prod",
                                 f"PGPASSWORD={RAW} psql -h db -U ops", f"env PGPASSWORD='{RAW}' pg_dump prod",
                                 f"mysql --password={RAW} prod", f"mysqladmin -p'{RAW}' status"])
def test_passwords_in_command_text_are_masked(cmd):
    out = SecretMasker().redact_text(cmd)
    assert RAW not in out and MASK in out, out


@pytest.mark.parametrize("name", ["SGLANG_MAX_TOKEN_LEN", "KEYS_PER_SHARD", "PASSTHROUGH", "WEBHOOK_TIMEOUT",
                                  "COOKIE_DOMAIN", "PW", "PWD", "AUTHOR", "SESSION_ID", "KV_KEY_LAYOUT",
                                  "WEBHOOK_ENABLED", "PASSES", "CREDIT_LIMIT"])
def test_names_that_only_look_like_secrets_are_not_masked(name):
    assert not SecretMasker().is_secret_name(name)


def test_no_sglang_knob_of_the_real_release_is_masked():
    """Every SGLANG_*/SGL_* name in SGLang 0.5.23's srt/environ.py (none holds a credential)."""
    text = ENVIRON.read_text()
    names = sorted(set(re.findall(r"\b(?:SGLANG|SGL)_[A-Z0-9_]+\b", text)))
    assert len(names) > 500
    m = SecretMasker()
    assert [n for n in names if m.is_secret_name(n)] == []
    assert "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE" in names and "SGLANG_LOG_DECODE_GRAPH_KEY" in names
