"""The words of an OpenSSH client configuration, as OpenSSH 9.x reads them (misc.c, match.c, ssh.c):
a line's keyword and arguments, Match's criteria, ``*``/``?`` patterns, times, ``%`` tokens and
``${ENV}``, ``~``, the host and user names refused as ssh refuses them, ProxyJump hops, ssh's own
command-line arguments, and quoting a value back into one word.

`ssh_reader.py` reads a config's lines with these (Host, Match, Include, first value wins) and
`sshconfig.py` resolves a destination as ``ssh -G`` does.
"""
from __future__ import annotations

import hashlib
import logging
import os
import pwd
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from envbisect.errors import ConnectionFailed, UsageError

log = logging.getLogger("envbisect.hosts.sshconfig")


def fail(where: str, problem: str) -> ConnectionFailed:
    """The one-line error of a config line (`where` is "FILE line N" or "command line")."""
    return ConnectionFailed(f"{where}: {problem}" if where else problem)


# --- lexical helpers (misc.c) -----------------------------------------------------------------

_WS = " \t\r\n"


def split_keyword(line: str) -> tuple[str, str] | None:
    """(keyword lowercased, the rest of the line) like strdelim(): the keyword ends at whitespace or
    one ``=``; None for a blank or comment line."""
    line = line.rstrip(_WS + "\f").lstrip(_WS)
    if not line or line.startswith("#"):
        return None
    m = re.match(r'([^ \t\r\n="]+)[ \t\r\n]*(?:=[ \t\r\n]*)?(.*)\Z', line, re.S)
    if m is None:  # a line starting with '=' or a quote
        return line.lower(), ""
    return m.group(1).lower(), m.group(2)


def argv_split(s: str, *, terminate_on_comment: bool = True) -> list[str]:
    """misc.c argv_split(): whitespace-separated words, "double" and 'single' quotes, backslash
    escapes of quotes, backslash and (unquoted) space; a word starting with # ends the line."""
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        if s[i] in " \t":
            i += 1
            continue
        if terminate_on_comment and s[i] == "#":
            break
        quote = ""
        arg: list[str] = []
        while i < n:
            c = s[i]
            if c == "\\" and i + 1 < n and (s[i + 1] in "'\"\\" or (not quote and s[i + 1] == " ")):
                arg.append(s[i + 1])
                i += 2
                continue
            if not quote and c in " \t":
                break
            if not quote and c in "\"'":
                quote = c
            elif quote and c == quote:
                quote = ""
            else:
                arg.append(c)
            i += 1
        if quote:
            raise ValueError("invalid quotes")
        out.append("".join(arg))
    return out


def strdelim_words(s: str) -> list[str]:
    """The words misc.c strdelim() returns one by one (how Match reads its criteria): split at
    whitespace or one ``=``, "double quotes" group; stops at the first empty word or a bad quote."""
    out: list[str] = []
    rest: str | None = s
    while rest:
        m = re.search(r'[ \t\r\n"=]', rest)
        if m is None:
            out.append(rest)
            break
        i = m.start()
        if rest[i] == '"':
            t = rest[:i] + rest[i + 1:]
            q = t.find('"', i)
            if q < 0:
                break
            out.append(t[:q])
            rest = t[q + 1:].lstrip(_WS)
            continue
        word, eq = rest[:i], rest[i] == "="
        rest = rest[i + 1:].lstrip(_WS)
        if rest.startswith("=") and not eq:
            rest = rest[1:].lstrip(_WS)
        if not word:
            break
        out.append(word)
    return out


def match_pattern(s: str, pattern: str) -> bool:
    """match.c match_pattern(): ``*`` and ``?`` only (brackets are literal), case-sensitive."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, s, re.S) is not None


def match_pattern_list(s: str, patterns: str, dolower: bool = False) -> int:
    """match.c match_pattern_list(): comma-separated, ``!`` negates: 1 match, 0 none, -1 negated match."""
    got = 0
    for sub in patterns.split(","):
        neg = sub.startswith("!")
        if neg:
            sub = sub[1:]
        if dolower:
            sub = sub.lower()
        if match_pattern(s, sub):
            if neg:
                return -1
            got = 1
    return got


def convtime(s: str) -> int:
    """misc.c convtime(): ``90``, ``1m30s``, ``2h``...; -1 when invalid."""
    if not s or not re.fullmatch(r"(\d+[sSmMhHdDwW]?)+", s):
        return -1
    mult = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    return sum(int(n) * mult[u.lower()] for n, u in re.findall(r"(\d+)([sSmMhHdDwW]?)", s))


def percent_expand(s: str, tokens: Mapping[str, str], what: str, *, dollar: bool = False) -> str:
    """misc.c percent_expand / percent_dollar_expand: ``%x`` from ``tokens``, ``%%``, and with
    ``dollar`` ``${VAR}`` from the environment; anything else is an error (ssh refuses it too)."""
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if dollar and s.startswith("${", i):
            end = s.find("}", i + 2)
            if end < 0:
                raise ConnectionFailed(f"{what}: environment variable {s[i:]!r} has no closing '}}'")
            var = s[i + 2:end]
            if not var:
                raise ConnectionFailed(f"{what}: zero-length environment variable ${{}}")
            if var not in os.environ:
                raise ConnectionFailed(f"{what}: env var ${{{var}}} has no value")
            out.append(os.environ[var])
            i = end + 1
            continue
        if c != "%":
            out.append(c)
            i += 1
            continue
        if i + 1 >= n:
            raise ConnectionFailed(f"{what}: invalid format: a lone % at the end of {s!r}")
        t = s[i + 1]
        if t == "%":
            out.append("%")
        elif t in tokens:
            out.append(tokens[t])
        else:
            raise ConnectionFailed(f"{what}: unknown token %{t} in {s!r} (known: %% "
                                   + " ".join(f"%{k}" for k in sorted(tokens)) + ")")
        i += 2
    return "".join(out)


def home() -> str:
    return str(Path.home())


def tilde_expand(path: str) -> str:
    """``~`` and ``~/x`` (``$HOME``), ``~user/x`` (that user's home)."""
    if not path.startswith("~"):
        return path
    head, sep, tail = path[1:].partition("/")
    if head:
        try:
            base = pwd.getpwnam(head).pw_dir
        except KeyError:
            raise ConnectionFailed(f"{path}: no such user {head!r}") from None
    else:
        base = home()
    tail = tail.lstrip("/")
    return base.rstrip("/") + "/" + tail if tail or sep else base


def local_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # pragma: no cover - a uid without a passwd entry
        import getpass

        return getpass.getuser()


# --- names that reach a shell (ssh.c valid_hostname / valid_ruser) ------------------------------

# %h, %r and %n are put unquoted into the shell command of a ProxyCommand or a Match exec, as ssh puts
# them. OpenSSH 9.6 (CVE-2023-51385) refuses these characters in a host or user name given on the command
# line; a name from a playbook or an inventory is such a name. The ssh config itself is trusted, as by ssh.
_HOST_REFUSED = frozenset("'`\"$\\;&<>|(){},")
_USER_REFUSED = frozenset("'`\";&<>|(){}")


def valid_hostname(s: str) -> bool:
    return not s.startswith("-") and not any(c in _HOST_REFUSED or c.isspace() or not c.isprintable() for c in s)


def valid_user(s: str) -> bool:
    """A space is allowed in a user name (not before a '-'); a control character, a trailing backslash are not."""
    if s.startswith("-") or s.endswith("\\"):
        return False
    return not any(c in _USER_REFUSED or not c.isprintable() or (c == " " and s[i + 1:i + 2] == "-")
                   for i, c in enumerate(s))


def check_names(host: str | None, user: str | None, where: str = "", *, what_host: str = "ssh host name",
                what_user: str = "ssh user name") -> None:
    """Refuse a host or user name that would carry shell syntax into %h/%r, before any config is read."""
    prefix = f"{where}: " if where else ""
    for what, name, ok in ((what_host, host, valid_hostname), (what_user, user, valid_user)):
        if name is not None and not ok(name):
            raise UsageError(f"{prefix}{what} {name!r} contains invalid characters (shell syntax, whitespace or a "
                             "leading '-'): refused as OpenSSH refuses it (CVE-2023-51385)")


def connection_hash(thishost: str, host: str, port: str, user: str) -> str:
    """%C: the hash ssh names a connection by."""
    return hashlib.sha1(f"{thishost}{host}{port}{user}".encode()).hexdigest()


# --- ProxyJump --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Jump:
    """One ProxyJump hop: ``[user@]host[:port]`` (a user or port given here beats the hop's own
    config, like the ``-l``/``-p`` ssh passes to the hop)."""

    host: str
    user: str | None = None
    port: int | None = None

    @property
    def spec(self) -> str:
        numeric = ":" in self.host or self.host.replace(".", "").isdigit()
        h = f"[{self.host}]" if numeric else self.host
        return f"{self.user + '@' if self.user else ''}{h}{':' + str(self.port) if self.port else ''}"


def parse_jump_hop(text: str) -> Jump:
    """``[user@]host[:port]``, ``[user@][v6addr][:port]`` or ``ssh://[user@]host[:port]``."""
    s = text.strip()
    if s.lower().startswith("ssh://"):
        s = s[6:].rstrip("/")
        if "/" in s:
            raise ValueError(f"a path is not allowed in {text!r}")
    user = None
    if "@" in s:
        user, s = s.rsplit("@", 1)
        if not user:
            raise ValueError(f"empty user in {text!r}")
    port: int | None = None
    if s.startswith("["):
        end = s.find("]")
        if end < 0:
            raise ValueError(f"unbalanced brackets in {text!r}")
        host, rest = s[1:end], s[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"bad host {text!r}")
            port = _port(rest[1:], text)
    elif s.count(":") == 1:
        host, p = s.split(":")
        port = _port(p, text)
    else:
        host = s
    if not host:
        raise ValueError(f"empty host in {text!r}")
    return Jump(host, user, port)


def _port(p: str, text: str) -> int:
    if not p.isdigit() or not 0 < int(p) < 65536:
        raise ValueError(f"bad port {p!r} in {text!r}")
    return int(p)


def parse_jumps(value: str) -> tuple[Jump, ...]:
    return tuple(parse_jump_hop(h) for h in value.split(","))


def quote_value(v: str) -> str:
    """A value as one config word (for building ``-o KEY VALUE`` options from typed values)."""
    if v and not any(c in v for c in " \t\"'#\\"):
        return v
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_ssh_args(text: str | Sequence[str], where: str) -> list[tuple[str, str]]:
    """ssh command-line arguments (Ansible's ``ansible_ssh_common_args``/``ansible_ssh_extra_args``)
    as the options they set, in order: ``-o K=V`` / ``-oK=V`` / ``-o "K V"``, ``-J hops``, ``-p``,
    ``-l``, ``-i``. Flags that change nothing envbisect does (``-C``, ``-4``, ``-A``...) are
    ignored; ``-F`` is refused (pass --ssh-config instead)."""
    try:
        words = shlex.split(text) if isinstance(text, str) else list(text)
    except ValueError as e:
        raise ConnectionFailed(f"{where}: cannot split {text!r}: {e}") from None
    with_arg = set("BbcDEeFIiJLlmOopQRSWw")
    opts: list[tuple[str, str]] = []
    i = 0
    while i < len(words):
        w = words[i]
        i += 1
        if not w.startswith("-") or len(w) < 2:
            raise ConnectionFailed(f"{where}: unexpected argument {w!r} (only options such as -o K=V or -J host)")
        j = 1
        while j < len(w):
            flag = w[j]
            if flag in with_arg:
                val = w[j + 1:]
                if not val:
                    if i >= len(words):
                        raise ConnectionFailed(f"{where}: -{flag} needs an argument")
                    val = words[i]
                    i += 1
                if flag == "o":
                    kv = split_keyword(val)
                    if kv is None or not kv[1]:
                        raise ConnectionFailed(f"{where}: -o {val!r} is not KEY=VALUE")
                    opts.append(kv)
                elif flag == "J":
                    opts.append(("proxyjump", val))
                elif flag == "p":
                    opts.append(("port", val))
                elif flag == "l":
                    opts.append(("user", val))
                elif flag == "i":
                    opts.append(("identityfile", val))
                elif flag == "F":
                    raise ConnectionFailed(f"{where}: -F {val} is not supported here; pass --ssh-config {val}")
                else:
                    log.debug("%s: ssh option -%s %s ignored", where, flag, val)
                break
            log.debug("%s: ssh flag -%s ignored", where, flag)
            j += 1
    return opts


