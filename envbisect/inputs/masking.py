"""Mask secrets in env diffs, logs and bundles without hiding real deltas.

Pure, no I/O.  One masker (`Deployment.masker`) is the one redaction path of every output
(docs/safety.md, "Secrets and terminal output").  Entry points:

* :meth:`SecretMasker.mask_value` for one ``NAME=value`` (snapshot/diff output);
* :meth:`SecretMasker.redact_text` for free text (logs, JSON, bundles);
* :meth:`SecretMasker.redact_obj` for a JSON-like document (run records, ``--json``);
* :meth:`SecretMasker.learn_env` / :meth:`SecretMasker.learn_values`: raw values of
  secret-named variables seen in env files and process environments, replaced literally
  wherever they turn up later (a log line, a probe's answer) even without a recognisable shape.

And two text-hygiene helpers that are not about secrets: :func:`printable` (what may reach a
terminal: control characters and escape sequences made visible) and :func:`encodable` (text
that can be written as UTF-8: the bytes of a non-UTF-8 value shown as ``\\xNN``).

A masked value keeps a harmless hint (a well-known token prefix such as ``hf_``)
and the first 8 hex digits of a keyed hash of the value (HMAC-SHA256 with the
masker's key: the store's, see ``Store.mask_key``), so two outputs of one store
can show "this secret changed" without showing it::

    hf_••••(masked, sha256:1a2b3c4d)
    ••••(masked, sha256:5e6f7a8b)

Without the key, the 8 hex digits of a short password cannot be matched
against a dictionary (an unkeyed hash could, from a bundle). A masker given no
key uses one made for this process.

Most of this module is the table of secret name and value rules; the code itself is small.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
from collections import Counter
from fnmatch import fnmatchcase
from typing import Any, Iterable, Mapping

from envbisect.inputs.known_values import across_whitespace, cut_at_the_edges

__all__ = ["MASK", "SecretMasker", "mask_hash", "printable", "encodable", "strip_escapes"]

MASK = "••••"

# --------------------------------------------------------------------- names

# A name is secret if one of its words (split on non-alphanumerics and camelCase
# boundaries, upper-cased) is one of these.  Whole words only: TOKENS, AUTHOR,
# PASSTHROUGH, KEY, PATH, PATCH are not secret.  PAT is a personal access token
# (GITHUB_PAT); DSN carries a password (SENTRY_DSN, DATABASE_DSN).
_SECRET_WORDS = frozenset(
    {
        "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "PASSPHRASE",
        "CREDENTIALS", "CREDENTIAL", "CREDS", "CRED", "AUTH", "AUTHORIZATION", "APIKEY", "PAT", "DSN", "COOKIE",
        "JWT", "BEARER", "SIGNATURE",
    }
)
# One word that ends in a credential word (PGPASSWORD, SECRETKEY, APITOKEN): the word rules above see
# whole words only. A TOKEN or KEY needs its qualifier in the word (MAXTOKEN, HOTKEY are no secrets).
_COMPOUND_SECRET_RE = re.compile(r"[A-Z0-9]*(?:PASSWORD|PASSWD|SECRET|(?:API|ACCESS|PRIVATE|SECRET)KEY"
                                 r"|(?:API|AUTH|ACCESS|BEARER|REFRESH|SECRET)TOKEN)")
# A webhook's URL holds its token (SLACK_WEBHOOK, ALERT_WEBHOOK_URL); WEBHOOK_TIMEOUT is a knob.
_WEBHOOK_URL_WORDS = frozenset({"URL", "URI"})
# TOKEN next to one of these words is a count of language-model tokens, not a credential:
# SGLANG_MAX_TOKEN_LEN, TOKEN_LIMIT, NUM_TOKEN_BUDGET.
_TOKEN_QUANTITY = frozenset(
    {
        "LEN", "LENGTH", "LIMIT", "LIMITS", "COUNT", "NUM", "SIZE", "BUDGET", "MAX", "MIN",
        "TOTAL", "RATIO", "RATE", "CAPACITY", "PER", "THRESHOLD",
    }
)
# PASS and AUTH are credentials only as the last word (DB_PASS, PROXY_AUTH): SGLANG_NUM_PASS_LAYERS and
# AUTH_MODE are knobs.
# TOKEN and COOKIE likewise (HF_TOKEN, SESSION_COOKIE): SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE,
# SGLANG_SYNC_TOKEN_IDS_ACROSS_TP and COOKIE_DOMAIN are knobs.
# JWT, BEARER and SIGNATURE likewise (SERVICE_JWT, X_AMZ_SIGNATURE; not JWT_ISSUER, SIGNATURE_ALGORITHM).
_LAST_WORD_ONLY = frozenset({"PASS", "AUTH", "TOKEN", "COOKIE", "JWT", "BEARER", "SIGNATURE"})
# ... or followed by one last word that says it is the secret itself: AUTH_TOKEN_VALUE, API_TOKEN_STRING.
_THE_SECRET_ITSELF = frozenset({"VALUE", "VAL", "STRING", "STR", "DATA", "RAW", "B64", "BASE64", "HEX", "TEXT"})
# Two words that spell one secret word (X_PASS_WORD, DB_PASS_PHRASE), or name a string that holds a
# password as a DSN does (AZURE_STORAGE_CONNECTION_STRING).
_SECRET_PAIRS = frozenset({("PASS", "WORD"), ("PASS", "PHRASE"), ("PASS", "WD"), ("CONNECTION", "STRING"),
                           ("CONN", "STR"), ("CONN", "STRING")})
# Names secret only where they are: a flag (`--key V`, `--key=V`) and a URL's query (`?key=V`, an
# Azure SAS's `&sig=V`).
_FLAG_SECRETS = frozenset({"KEY"})
_QUERY_SECRETS = frozenset({"KEY", "SIG"})
# A secret word followed by one of these names something about the secret, not the secret itself:
# HF_TOKEN_CACHE, POSTGRES_PASSWORD_FILE, SECRET_NAME, TOKEN_URL.
_ABOUT_A_SECRET = frozenset(
    {
        "CACHE", "DIR", "PATH", "FILE", "URL", "URI", "ENDPOINT", "TYPE", "MODE", "ENABLED", "ENABLE",
        "DISABLED", "REQUIRED", "TTL", "EXPIRY", "EXPIRES", "LIFETIME", "TIMEOUT", "NAME", "HEADER", "KIND",
        "PROVIDER", "METHOD", "LOCATION",
    }
)
# ... or contains one of these adjacent pairs (KEY alone is not secret).
_KEY_QUALIFIERS = frozenset({"API", "ACCESS", "PRIVATE", "SECRET", "ENCRYPTION", "SIGNING", "HMAC", "MASTER"})
_KEY_WORDS = frozenset({"KEY", "KEYS"})
# ... or ends in KEY after any other word (OPENAI_KEY, SSH_KEY), unless that word makes it a lookup key.
_LOOKUP_KEY = frozenset(
    {
        "PUBLIC", "PUB", "CACHE", "SORT", "PARTITION", "ROUTING", "PRIMARY", "FOREIGN", "SHARD", "LOOKUP",
        "GROUP", "INDEX", "DICT", "MAP", "QUEUE", "METRIC", "LABEL", "HASH", "RANDOM", "SEED", "GRAPH",
    }
)
# PWD is a password only as part of a longer name (MYSQL_PWD, DB_PWD); PWD and
# OLDPWD are working directories.  SSH_AUTH_SOCK is a socket path.
_NEVER_SECRET = frozenset({"PWD", "OLDPWD", "SSH_AUTH_SOCK"})

_CAMEL_RE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SPLIT_RE = re.compile(r"[^A-Za-z0-9]+")


def _words(name: str) -> list[str]:
    out: list[str] = []
    for part in _SPLIT_RE.split(name):
        out.extend(w.upper() for w in _CAMEL_RE.split(part) if w)
    return out


# -------------------------------------------------------------- value shapes

# Each pattern has a ``hint`` group: a public prefix that is safe to show.
_SHAPES: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p, flags)
    for p, flags in (
        # PEM private key block; an unterminated one is masked through its body.
        (
            r"(?P<hint>-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----)"
            r"(?:.*?-----END[A-Z0-9 ]*PRIVATE KEY-----|(?:[A-Za-z0-9+/=\s]|\\[nr])*)",
            re.DOTALL,
        ),
        (r"(?<![A-Za-z0-9])(?P<hint>hf_)[A-Za-z0-9]{20,}", 0),
        (r"(?<![A-Za-z0-9_-])(?P<hint>sk-)[A-Za-z0-9_-]{20,}", 0),
        (
            r"(?<![A-Za-z0-9_])(?:(?P<hint>gh[pousr]_)[A-Za-z0-9]{20,}"
            r"|(?P<hint2>github_pat_)[A-Za-z0-9_]{20,})",
            0,
        ),
        (r"(?<![A-Za-z0-9])(?P<hint>AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Za-z])", 0),
        (
            r"(?<![A-Za-z0-9_-])(?P<hint>eyJ)[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}"
            r"\.[A-Za-z0-9_-]*",
            0,
        ),
        (r"(?<![A-Za-z0-9])(?P<hint>xox[abposr]-)[A-Za-z0-9-]{10,}", 0),
        (r"(?<![A-Za-z0-9_])(?P<hint>glpat-)[A-Za-z0-9_-]{20,}", 0),
        # Stripe secret and restricted keys
        (r"(?<![A-Za-z0-9])(?P<hint>[sr]k_(?:live|test)_)[A-Za-z0-9]{10,}", 0),
        # webhook URLs: the path is the credential
        (r"(?P<hint>https?://hooks\.slack\.com/(?:services|workflows|triggers)/)[A-Za-z0-9_/-]{8,}", 0),
        (r"(?P<hint>https?://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/)[0-9]+/[A-Za-z0-9_-]{20,}", 0),
        # "Bearer <token>" anywhere (the token only; "Bearer" is the hint-less context)
        (r"(?<![A-Za-z0-9])(?i:bearer)[ \t]+(?P<value>[A-Za-z0-9._~+/-]{8,}=*)", 0),
    )
)


def _shape_spans(text: str) -> Iterable[tuple[int, int]]:
    for pat in _SHAPES:
        for m in pat.finditer(text):
            if "value" in pat.groupindex:
                yield m.span("value")
            else:
                yield m.span()


def _hint(value: str) -> str:
    for pat in _SHAPES:
        if "hint" not in pat.groupindex:
            continue
        m = pat.match(value)
        if m:
            return m.group("hint") or m.groupdict().get("hint2") or ""
    return ""


_PROCESS_KEY = os.urandom(32)  # the key of a masker given none: its hashes mean something in this process only


def mask_hash(value: str, key: bytes | None = None) -> str:
    """First 8 hex digits of HMAC-SHA256(key, ``value``) (UTF-8; lone surrogates kept)."""
    return hmac.new(key or _PROCESS_KEY, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:8]


def _mask(value: str, key: bytes | None) -> str:
    return f"{_hint(value)}{MASK}(masked, sha256:{mask_hash(value, key)})"


# What _mask produces: never masked again, so redaction is idempotent and text
# built from mask_value() output can safely go through redact_text().
_ALREADY_MASKED_RE = re.compile(
    r"(?:-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----|hf_|sk-|gh[pousr]_|github_pat_|AKIA|ASIA"
    r"|eyJ|xox[abposr]-|glpat-|[sr]k_(?:live|test)_|https?://hooks\.slack\.com/(?:services|workflows|triggers)/"
    r"|https?://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/)?"
    + re.escape(MASK) + r"\(masked, sha256:[0-9a-f]{8}\)"
)


def _subtract(
    spans: list[tuple[int, int, bool]], holes: list[tuple[int, int]], text: str
) -> list[tuple[int, int, bool]]:
    """Cut the ``holes`` out of ``spans``; drop pieces that are blank."""
    out = []
    for s, e, q in spans:
        pieces = [(s, e)]
        for hs, he in holes:
            if he <= s or hs >= e:
                continue
            nxt = []
            for ps, pe in pieces:
                if hs > ps:
                    nxt.append((ps, min(pe, hs)))
                if he < pe:
                    nxt.append((max(ps, he), pe))
            pieces = nxt
        out.extend((ps, pe, q) for ps, pe in pieces if text[ps:pe].strip())
    return out


# ---------------------------------------------------------- NAME/VALUE forms

_NAME = r"(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)"
_DQ = r'"(?P<dq>(?:[^"\\\n]|\\.)*)"'
_SQ = r"'(?P<sq>[^'\n]*)'"

# (name+separator regex, value regex matched right after it, kind)
_KV_FORMS: tuple[tuple[re.Pattern[str], re.Pattern[str], str], ...] = (
    # "NAME": "VALUE" / 'NAME': 'VALUE' / "NAME": 123  (JSON, Python repr)
    (
        re.compile(r"(?P<q>[\"'])(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)(?P=q)\s*:\s*"),
        re.compile(
            r'"(?P<dq>(?:[^"\\]|\\.)*)"'
            r"|'(?P<sq>(?:[^'\\]|\\.)*)'"
            r"|(?P<scalar>[^\s,}\]\"']+)"
        ),
        "json",
    ),
    # NAME=VALUE, export NAME="VALUE", --name=VALUE, name = value (ini)
    (
        re.compile(rf"(?<![A-Za-z0-9_.]){_NAME}[ \t]*=(?!=[ \t]|>)[ \t]*"),
        re.compile(rf"{_DQ}|{_SQ}|(?P<bare>[^\s\"']+)|[\"'](?P<rest>[^\r\n]+)"),
        "assign",
    ),
    # NAME: VALUE (YAML, HTTP headers, log "key: value"); value runs to end of line
    # (or to the end of an enclosing JSON string / a "\n" escape).
    (
        re.compile(rf"(?<![A-Za-z0-9_.\-/~]){_NAME}[ \t]*:(?![:/])[ \t]*"),
        re.compile(
            rf"{_DQ}|{_SQ}"
            r"|(?P<line>[^\r\n]*?\S)"
            r"(?=[ \t]*(?:[\r\n]|\Z|\"[ \t]*(?:[,}\]:\r\n]|\Z)|\\[nr]))"
        ),
        "colon",
    ),
    # --name VALUE / -name VALUE (command lines); VALUE must not look like a flag
    (
        re.compile(rf"(?<![A-Za-z0-9_.\-])--?{_NAME}[ \t]+"),
        re.compile(rf"{_DQ}|{_SQ}|(?P<bare>[^\s\"'\-][^\s\"']*)"),
        "flag",
    ),
    # NAME => VALUE, NAME -> VALUE (Perl, Ruby, PHP, log arrows)
    (
        re.compile(rf"(?<![A-Za-z0-9_.\-]){_NAME}[ \t]*[=-]>[ \t]*"),
        re.compile(rf"{_DQ}|{_SQ}|(?P<bare>[^\s\"',;)]+)"),
        "arrow",
    ),
    # <NAME>VALUE</NAME> (XML)
    (re.compile(rf"<{_NAME}>"), re.compile(r"(?P<bare>[^<\r\n]+)"), "xml"),
)

# An HTTP credential after its scheme ("Authorization: Basic <cred>"): the credential is one word, so
# only it is masked and the rest of the line (a delta id, the next field of a drift line) stays.
_AUTH_SCHEME_RE = re.compile(r"(?i:basic|bearer|token|negotiate|ntlm|apikey|api-key|bot)[ \t]+(?P<cred>[^\s\"',;]+)")
# A value that a first pass masked already (mask_value of a whole value, then the line redacted again)
_MASKED_AT_START_RE = re.compile(
    r"(?:[A-Za-z_-]+[ \t]+)?(?P<cred>\S*?" + re.escape(MASK) + r"\(masked, sha256:[0-9a-f]{8}\))"
)

# NAME: VALUE inside a quoted string ('Authorization: Bearer x' on a curl line):
# the value stops at the closing quote.
_COLON_IN_QUOTES = {
    "'": re.compile(r"(?P<line>[^\r\n']*[^\s'])"),
    '"': re.compile(
        r'(?P<line>(?:[^\r\n"\\]|\\(?![nr]).)*?\S)(?=[ \t]*(?:"|\\[nr]|[\r\n]|\Z))'
    ),
}

# scheme://user:PASSWORD@host -- the password runs to the first "@" after which a host follows (no
# further "@" before the path), so a password that contains "@" (user:p@ss@host) or "/" (app:a/b@db) is
# masked whole, and a user may contain "@" (ops@corp:pw@db). A port followed by a path is no password.
_URL_CRED_RE = re.compile(
    r"://[^/\s:\"'<>]*:(?!\d+(?:[/?#\s\"'<>]|\Z))(?P<pw>[^\s\"'<>]+?)@(?=[^/\s@\"'<>]*(?:[/\s?#\"'<>]|\Z))"
)
# scheme://TOKEN@host: a long, random-looking user is a token (https://<token>@github.com/o/r)
_URL_TOKEN_USER_RE = re.compile(r"://(?P<tok>[A-Za-z0-9._~+-]{20,})@(?=[^/\s@\"'<>]*(?:[/\s?#:\"'<>]|\Z))")
# curl -u user:PASSWORD, --user=user:PASSWORD, --proxy-user, -U (a numeric one is a uid:gid, docker -u)
_USER_PW_FLAG_RE = re.compile(
    r"(?<![A-Za-z0-9_-])(?:-u|-U|--user|--proxy-user)(?:[ \t]+|=|(?=[^\s-]))[\"']?[^\s:\"']*:"
    r"(?!\d+(?:[\s\"']|\Z))(?P<pw>[^\s\"']+)"
)
# mysql/mysqldump/mysqladmin/mariadb -pPASSWORD (the password glued to -p; `-p NAME` is a database)
_MYSQL_PW_RE = re.compile(
    r"(?<![A-Za-z0-9_/-])(?:mysql\w*|mariadb\w*)\b[^\n;|&]*?[ \t]-p[\"']?(?P<pw>[^\s\"']+)"
)
# sshpass -p PASSWORD (or -pPASSWORD), redis-cli -a PASSWORD
_CMD_PW_RE = re.compile(
    r"(?<![A-Za-z0-9_/-])(?:sshpass\b[^\n;|&]*?[ \t]-p[ \t]*|redis-cli\b[^\n;|&]*?[ \t]-a[ \t]+)[\"']?(?P<pw>[^\s\"']+)"
)
# .netrc: machine HOST [login U] [account A] password PASSWORD (on one line or several)
# -- also inside a quoted or escaped shell value (NETRC="machine h login u password p", as an env file's
# content holds it): the password stops before a closing quote, and keeps a quote inside it.
_NETRC_RE = re.compile(
    r"(?:^|(?<=[\s\"'=]))(?:machine\\?\s+[^\s\"']+|default)(?:\\?\s+(?:login|account|port)\\?\s+[^\s\"']+)*"
    r"\\?\s+password\\?\s+(?P<pw>[^\s\"'\\]+(?:[\"'\\][^\s\"'\\]+)*)"
)

# A bare run of 40+ hex digits as the whole value of a variable is an API token or HMAC key
# (40-hex GitHub classic tokens, Sentry/Datadog keys) -- unless the name says it is a commit or
# a digest, which envbisect must keep showing (git deltas are HEADs).
# Exactly 32 hex digits (with letters and digits) is an API key (Datadog, New Relic...); a commit is 40
# and stays visible anywhere a name does not call it a token. 40 characters of base64 with upper case,
# lower case and digits is an AWS secret access key; longer ones (with base64 padding) are keys of the same
# kind (Azure storage keys, HMAC secrets), so the rule takes 40 and more.
_HEX_TOKEN_RE = re.compile(r"[0-9a-fA-F]{40,}|(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{32}")
_AWS_SECRET_RE = re.compile(r"(?=.*[A-Z])(?=.*[a-z])(?=.*[0-9])(?![0-9a-fA-F]{40})[A-Za-z0-9/+]{40,}={0,2}")
_DIGEST_WORDS = frozenset(
    {"COMMIT", "SHA", "SHA1", "SHA256", "SHA512", "REV", "REVISION", "HASH", "DIGEST", "HEAD",
     "CHECKSUM", "REF", "VERSION", "BUILD", "ID", "MD5", "UUID", "GUID"}
)
_ENV_NAME_RE = re.compile(r"[A-Z_][A-Z0-9_]*")

# Learned raw values shorter than this, plain numbers and these literals are not replaced
# literally (they would match everywhere); they are still masked as NAME=VALUE. Neither is a value
# that reads like a word or a name (a lower-case slug without a piece mixing 2+ letters and 2+ digits,
# shorter than 16), a path, or one with little entropy: "decode" learned as a secret would be masked
# in every path and service name.
_MIN_RAW_SECRET = 8
_MIN_SLUG_SECRET = 16
_MIN_ENTROPY_BITS = 2.5
_SLUG_RE = re.compile(r"[a-z0-9._-]+")
_MIXED_PIECE_RE = re.compile(r"(?=(?:[^0-9._-]*[0-9]){2})(?=(?:[^a-z._-]*[a-z]){2})[a-z0-9]+")
_PATH_RE = re.compile(r"~?/\S*")
TRIVIAL_VALUES = frozenset({"true", "false", "none", "null", "yes", "no", "on", "off", "unset", "empty"})
NUMBER_RE = re.compile(r"[+-]?\d+(?:\.\d+)?")
VAR_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
KEY_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")  # a JSON/YAML key or header name (X-Api-Key, db.password)

_JSON_LITERALS = frozenset({"null", "true", "false"})


def _entropy(s: str) -> float:
    """Shannon entropy in bits per character."""
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values()) if n else 0.0


def _worth_learning(v: str) -> bool:
    """Whether a raw secret value is distinctive enough to be replaced literally in any text."""
    v = v.strip()
    if len(v) < _MIN_RAW_SECRET or v.lower() in TRIVIAL_VALUES or NUMBER_RE.fullmatch(v):
        return False
    if _ALREADY_MASKED_RE.fullmatch(v) or _PATH_RE.fullmatch(v) or _entropy(v) < _MIN_ENTROPY_BITS:
        return False
    if _SLUG_RE.fullmatch(v) and len(v) < _MIN_SLUG_SECRET:
        return any(_MIXED_PIECE_RE.fullmatch(p) for p in re.split(r"[._-]", v))
    return True


def _random_user(tok: str) -> bool:
    return bool(re.search(r"[0-9]", tok)) and bool(re.search(r"[A-Za-z]", tok)) and _entropy(tok) >= 3.5


class SecretMasker:
    """Decides what is secret and masks it.

    ``extra_names``: more secret variable names (case-insensitive; exact or
    fnmatch globs such as ``*_PASS``).  ``extra_values``: literal strings to
    redact wherever they appear (empty/blank ones are ignored).
    """

    def __init__(self, extra_names: Iterable[str] = (), extra_values: Iterable[str] = (), *,
                 key: bytes | None = None):
        self.key = key  # of the hash a masked value shows (None: this process's own)
        self._extra_names = tuple(n.strip().upper() for n in extra_names if n and n.strip())
        vals = {v for v in extra_values if v and v.strip()}
        self._extra_values = tuple(sorted(vals, key=len, reverse=True))
        self._name_cache: dict[str, bool] = {}
        self._learned: set[str] = set()

    # ------------------------------------------------------------- learning

    def learn_values(self, values: Iterable[str | None]) -> None:
        """Raw secret values to replace literally wherever they appear from now on.  Values shorter
        than 8 characters, plain numbers, paths, words and names (``decode``, ``sglang-decode``) and
        values of low entropy are skipped (they would match everywhere); they are still masked as
        ``NAME=VALUE``."""
        new = {v for v in values if isinstance(v, str) and _worth_learning(v)}
        if new - self._learned:
            self._learned |= new
            self._extra_values = tuple(sorted(set(self._extra_values) | new, key=len, reverse=True))

    def content_digest(self, sha256_hex: str) -> str:
        """What stands for the unkeyed sha256 of raw content wherever the content goes out masked:
        HMAC-SHA256 under this masker's key, so two outputs of one store still show which contents
        are alike, and nobody can hash a guess (a masked line filled in from a dictionary) to match."""
        return hmac.new(self.key or _PROCESS_KEY, b"content " + sha256_hex.encode(), hashlib.sha256).hexdigest()

    def learn_env(self, items: Iterable[tuple[str, str | None]]) -> None:
        """Learn the secrets among ``(name, value)`` pairs (an env file's assignments, a process
        environment): the whole value of a secret-named variable, else the secret-shaped parts of
        the value (a token, a URL's password).  Known values are found again even where a shape
        rule cannot see them, e.g. cut by a truncated log tail."""
        self.learn_values(v for k, val in items for v in self.secret_parts(k, val))

    def learn_text(self, text: str) -> None:
        """Learn every value ``redact_text`` masks in ``text`` by its shape or its key (a watched
        file's ``password: X``, ``"token": "X"``, ``--api-key X``): found again wherever it is printed."""
        if text:
            self.learn_values(text[s:e] for s, e, _ in self._spans(text, known=False))

    def secret_parts(self, name: str, value: str | None) -> list[str]:
        """What of ``value`` (of variable ``name``) is secret: the whole value of a secret-named
        variable or of a token-shaped one, else the parts redact_text would mask (tokens, URL
        passwords, ``--api-key X``, ``curl -u u:pw``, a netrc password)."""
        if not value or not isinstance(value, str):
            return []
        if self.is_secret_name(name) or self._hex_token(name, value.strip()):
            return [value]
        return [value[s:e] for s, e, _ in self._spans(value, known=False)]

    @property
    def known_values(self) -> tuple[str, ...]:
        """The literal values replaced everywhere (playbook [secrets].values and learned ones)."""
        return self._extra_values

    # ------------------------------------------------------------ predicates

    def is_secret_name(self, name: str) -> bool:
        hit = self._name_cache.get(name)
        if hit is None:
            if len(self._name_cache) > 4096:
                self._name_cache.clear()
            hit = self._name_cache[name] = self._is_secret_name(name)
        return hit

    def _is_secret_name(self, name: str) -> bool:
        up = name.strip().upper()
        if not up:
            return False
        for pat in self._extra_names:
            if up == pat or fnmatchcase(up, pat):
                return True
        if up in _NEVER_SECRET:
            return False
        words = _words(name.strip())
        for i, w in enumerate(words):
            if w not in _SECRET_WORDS:
                continue
            nxt = words[i + 1:i + 2]
            if w == "TOKEN" and _TOKEN_QUANTITY.intersection(words[max(0, i - 1):i] + nxt):
                continue  # MAX_TOKEN_LEN: a count of tokens
            if w in _LAST_WORD_ONLY and nxt and not (len(words) == i + 2 and nxt[0] in _THE_SECRET_ITSELF):
                continue
            if _ABOUT_A_SECRET.intersection(nxt):
                continue
            return True
        if _SECRET_PAIRS.intersection(zip(words, words[1:])):
            return True
        if "PWD" in words and len(words) > 1 or len(words) > 1 and words[-1] == "PW":
            return True  # MYSQL_PWD, ADMIN_PW
        if any(_COMPOUND_SECRET_RE.fullmatch(w) and not _ABOUT_A_SECRET.intersection(words[i + 1:i + 2])
               for i, w in enumerate(words)):
            return True
        if "WEBHOOK" in words and (words[-1] == "WEBHOOK" or _WEBHOOK_URL_WORDS.intersection(words)):
            return True
        if any(a == "AUTH" and b == "CONFIG" for a, b in zip(words, words[1:])):
            return True  # DOCKER_AUTH_CONFIG: registry credentials
        if len(words) > 1 and words[-1] == "KEY" and words[-2] not in _LOOKUP_KEY:
            return True
        return any(
            a in _KEY_QUALIFIERS and b in _KEY_WORDS for a, b in zip(words, words[1:])
        )

    def is_secret_value(self, value: str) -> bool:
        if not value:
            return False
        if any(v in value for v in self._extra_values):
            return True
        return any(pat.search(value) for pat in _SHAPES)

    def _hex_token(self, name: str, value: str) -> bool:
        """A whole value of 40+ or exactly 32 hex digits, or an AWS-secret-like 40 characters of
        base64, under a name that does not say commit/digest/id."""
        if not (_HEX_TOKEN_RE.fullmatch(value) or _AWS_SECRET_RE.fullmatch(value)):
            return False
        return not _DIGEST_WORDS.intersection(_words(name))

    # --------------------------------------------------------------- masking

    def mask_value(self, name: str, value: str | None) -> str | None:
        """``value`` with secrets masked.

        Secret name: the whole value is masked.  Otherwise only the secret parts
        of the value are (``--port 1 --api-key sk-…`` keeps ``--port 1``), so a
        value without secrets comes back unchanged.  ``None`` and ``""`` are
        returned as is (an unset/empty secret reveals nothing).
        """
        if value is None or value == "" or _ALREADY_MASKED_RE.fullmatch(value):
            return value
        if self.is_secret_name(name) or self._hex_token(name, value.strip()):
            return _mask(value, self.key)
        return self.redact_text(value)

    def redact_text(self, text: str) -> str:
        """Mask every secret-shaped value, every extra value, the password of
        ``scheme://user:pw@``, and the value of ``NAME=VALUE`` / ``"NAME": "VALUE"`` /
        ``NAME: VALUE`` / ``--name VALUE`` where NAME is a secret name."""
        if not text:
            return text
        spans = self._spans(text)
        if not spans:
            return text
        holes = [m.span() for m in _ALREADY_MASKED_RE.finditer(text)]
        if holes:
            spans = _subtract(spans, holes, text)
        spans.sort()
        merged: list[list] = []
        for s, e, q in spans:
            if s >= e:
                continue
            if merged and s < merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
                merged[-1][2] = merged[-1][2] or q
            else:
                merged.append([s, e, q])

        out: list[str] = []
        last = 0
        for s, e, q in merged:
            out.append(text[last:s])
            masked = _mask(text[s:e], self.key)
            out.append(f'"{masked}"' if q else masked)
            last = e
        out.append(text[last:])
        return "".join(out)

    def _spans(self, text: str, *, known: bool = True) -> list[tuple[int, int, bool]]:
        """(start, end, needs JSON quotes) of every secret in ``text``; ``known``: the literal known
        values too."""
        spans: list[tuple[int, int, bool]] = []
        for s, e in _shape_spans(text):
            spans.append((s, e, False))
        for v in self._extra_values if known else ():
            i = text.find(v)
            while i != -1:
                spans.append((i, i + len(v), False))
                i = text.find(v, i + len(v))
            spans.extend((s, e, False) for s, e in cut_at_the_edges(text, v))
        if known and self._extra_values and any(c.isspace() for c in text):
            spans.extend((s, e, False) for s, e in across_whitespace(text, self._extra_values))
        for rx in (_URL_CRED_RE, _USER_PW_FLAG_RE, _NETRC_RE, _MYSQL_PW_RE, _CMD_PW_RE):
            for m in rx.finditer(text):
                spans.append((*m.span("pw"), False))
        for m in _URL_TOKEN_USER_RE.finditer(text):
            if _random_user(m.group("tok")):
                spans.append((*m.span("tok"), False))
        for name_re, value_re, kind in _KV_FORMS:
            pos = 0
            while True:
                m = name_re.search(text, pos)
                if m is None:
                    break
                if not self._secret_here(text, m, kind):
                    if kind == "assign" and _ENV_NAME_RE.fullmatch(m.group("name")):
                        v = value_re.match(text, m.end())
                        if v is not None:
                            group = next(g for g, val in v.groupdict().items() if val is not None)
                            if self._hex_token(m.group("name"), v.group(group)):
                                spans.append((*v.span(group), False))
                    pos = m.end("name")
                    continue
                if kind == "colon" and m.start() and text[m.start() - 1] in _COLON_IN_QUOTES:
                    v = _COLON_IN_QUOTES[text[m.start() - 1]].match(text, m.end())
                else:
                    v = value_re.match(text, m.end())
                if v is None:
                    pos = m.end()
                    continue
                pos = max(v.end(), m.end() + 1)
                group = next(g for g, val in v.groupdict().items() if val is not None)
                s, e = v.span(group)
                if kind == "colon" and group == "line":
                    one = _AUTH_SCHEME_RE.match(text, s, e) or _MASKED_AT_START_RE.match(text, s, e)
                    if one is not None:
                        s, e = one.span("cred")
                        pos = max(e, m.end() + 1)
                if s == e:
                    continue
                if group == "scalar":
                    if v.group(group) in _JSON_LITERALS:
                        continue
                    spans.append((s, e, True))
                else:
                    spans.append((s, e, False))
        return spans

    def _secret_here(self, text: str, m: re.Match[str], kind: str) -> bool:
        """Whether the name of a NAME/VALUE form is a secret's, there: a secret name anywhere, and
        `key` as a flag or `key`/`sig` in a URL's query."""
        name = m.group("name")
        if self.is_secret_name(name):
            return True
        before = text[m.start() - 1] if m.start() else ""
        if kind == "flag" or (kind == "assign" and before == "-"):
            return name.upper() in _FLAG_SECRETS
        return kind == "assign" and before in ("?", "&") and name.upper() in _QUERY_SECRETS

    def redact_obj(self, o: Any, key: str | None = None) -> Any:
        """A JSON-like value with every string (dict keys too) redacted; a string under a
        secret-named key (``"HF_TOKEN": "…"``, as in a process environment) is masked whole.  Only
        keys shaped like a variable name count: ``"decode:HF_TOKEN"`` is a delta id.  Numbers and
        literals are kept (a secret-named number is masked: ``"PIN_PASSWORD": 1234``)."""
        if isinstance(o, str):
            if key is not None and (self.is_secret_name(key)
                                    or (_ENV_NAME_RE.fullmatch(key) and self._hex_token(key, o.strip()))):
                return self.mask_value(key, self.redact_text(o))
            return self.redact_text(o)
        if isinstance(o, Mapping):
            return {self.redact_text(str(k)): self.redact_obj(v, str(k) if KEY_NAME_RE.fullmatch(str(k)) else None)
                    for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [self.redact_obj(v, key) for v in o]
        if key is not None and isinstance(o, (int, float)) and not isinstance(o, bool) and self.is_secret_name(key):
            return _mask(str(o), self.key)
        return o

    def redact_json(self, o: Any, *, indent: int | None = 1, **kw: Any) -> str:
        """``json.dumps`` of :meth:`redact_obj` (the form every run record is written in)."""
        return json.dumps(self.redact_obj(o), indent=indent, default=str, **kw)


# ------------------------------------------------------------ text hygiene

# Terminal escape sequences: CSI (colours, cursor), OSC (titles, hyperlinks, clipboard), DCS/APC/
# PM/SOS strings, and two-byte escapes.
_ESCAPE_SEQ_RE = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]?|[\]P^_X][^\x07\x1b]*(?:\x07|\x1b\\)?|[ -/]*[0-~]?)"
)
# What a terminal acts on: C0 controls (tab and newline handled by the caller), DEL, C1 controls,
# bidirectional overrides/isolates (text that reads differently than it is), lone surrogates
# (the bytes of a non-UTF-8 value, decoded with surrogateescape).
_UNSAFE_CHAR_RE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)

_UNSAFE_ONE_LINE_RE = re.compile("[\t\n" + _UNSAFE_CHAR_RE.pattern[1:])


def _escape_char(c: str) -> str:
    o = ord(c)
    if 0xDC80 <= o <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{o - 0xDC00:02x}"
    if o < 0x100:
        return {"\r": "\\r", "\t": "\\t", "\n": "\\n"}.get(c, f"\\x{o:02x}")
    return f"\\u{o:04x}"


def printable(text: str, *, keep_newlines: bool = True) -> str:
    """``text`` safe for a terminal: every escape sequence, control character (``\\x1b``, ``\\r``,
    ``\\x07``, C1), bidi override and undecodable byte is shown as a visible ``\\xNN``/``\\uNNNN``
    instead of being acted on.  Newlines (and tabs) are kept unless ``keep_newlines`` is false;
    a value shown on one line should pass ``keep_newlines=False``."""
    if not text:
        return text
    pattern = _UNSAFE_CHAR_RE if keep_newlines else _UNSAFE_ONE_LINE_RE
    return pattern.sub(lambda m: _escape_char(m.group()), text)


def strip_escapes(text: str) -> str:
    """``text`` without terminal escape sequences (for records: a colour code between NAME and
    ``=VALUE`` would hide the pair from the masker)."""
    return _ESCAPE_SEQ_RE.sub("", text) if text and "\x1b" in text else text


def encodable(text: str) -> str:
    """``text`` that encodes as UTF-8: lone surrogates (undecodable bytes of a value read with
    ``surrogateescape``) become visible ``\\xNN`` escapes."""
    if not text:
        return text
    return re.sub("[\ud800-\udfff]", lambda m: _escape_char(m.group()), text)
