"""Secret names and shapes the second red-team found raw (mask1.py .. mask4.py): each is masked, in a
value, in free text and in a JSON-like object; names that only look like them are not."""
from __future__ import annotations

import pytest

from envbisect.inputs.masking import SecretMasker

V = "Kd8Lq2Wm5Rt9Zx"


@pytest.mark.parametrize("name", ["JWT", "SERVICE_JWT", "AUTH_TOKEN_VALUE", "API_TOKEN_STRING", "X_PASS_WORD",
                                  "DB_PASS_PHRASE", "AZURE_STORAGE_CONNECTION_STRING", "X_AMZ_SIGNATURE",
                                  "X-Goog-Signature", "BEARER", "X-Api-Key", "api-key"])
def test_secret_names_the_red_team_found_raw(name):
    m = SecretMasker()
    assert m.is_secret_name(name)
    assert V not in m.mask_value(name, V)


@pytest.mark.parametrize("name", ["JWT_ISSUER", "JWT_ALGORITHM", "TOKEN_VALUE_MAX", "CONNECTION_TIMEOUT",
                                  "SIGNATURE_ALGORITHM", "PASS_THROUGH", "KEY", "SGLANG_MAX_TOKEN_LEN"])
def test_names_that_only_look_like_them_are_not_secret(name):
    assert not SecretMasker().is_secret_name(name)


@pytest.mark.parametrize("text", [
    f"https://b.s3.amazonaws.com/o?X-Amz-Credential=AKID%2F1&X-Amz-Signature={V}&x=1",
    f"https://storage.googleapis.com/b/o?X-Goog-Signature={V}",
    f"https://acct.blob.core.windows.net/c/b?sv=2022&sig={V}&se=2026",
    f"https://maps.example.com/api?key={V}",
    f"sshpass -p {V} ssh host", f"sshpass -p{V} ssh host", f"redis-cli -a {V} ping",
    f"redis-cli -h db --pass {V} ping",
    f"--model m --key {V} --port 1", f"--model m --key={V} --port 1", f"--model m --bearer={V}",
    f"--connection-string {V}", f"--connection-string='Server=db;User Id=sa;Password={V};'",
    f'password => "{V}"', f"secret -> {V}", f"<password>{V}</password>", f"<api_key>{V}</api_key>",
])
def test_secret_shapes_in_free_text_and_arguments(text):
    m = SecretMasker()
    for out in (m.redact_text(text), m.mask_value("SGLANG_EXTRA", text)):
        assert V not in out, out


@pytest.mark.parametrize("key", ["X-Api-Key", "api-key", "x-auth-token", "client.secret"])
def test_dict_keys_with_dashes_or_dots_are_secret_names_in_objects(key):
    out = SecretMasker().redact_obj({"probes": {"e2e": {"headers": {key: V}}}})
    assert V not in str(out), out


def test_the_rules_keep_what_is_not_a_secret():
    m = SecretMasker()
    for text in ("restarted router only — only router changed", "key=value pairs", "--key-file /etc/k.pem",
                 "a -> b", "x => y", "<name>decode</name>", "docker run -p 8080:80 img", "sshd -p 22"):
        assert m.redact_text(text) == text, text


def test_the_reports_redactor_masks_dict_keys_with_dashes_too():
    from envbisect.report.redaction import Redactor

    out = Redactor(SecretMasker()).obj({"headers": {"X-Api-Key": V, "api-key": V}, "name": "decode"})
    assert V not in str(out) and out["name"] == "decode", out
