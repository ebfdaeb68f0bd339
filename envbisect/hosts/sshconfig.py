"""The OpenSSH client configuration, read the way `ssh` reads it (OpenSSH 9.x readconf.c / ssh.c).

`resolve(host, config=...)` answers what `ssh -G [-F CONFIG] [-o K=V ...] HOST` would: which
HostName, User, Port, IdentityFile..., after every Host and Match block that applies. What it
honours, as ssh does:

- *first obtained value wins*: command-line options (`options=`, i.e. ``-o``, ``-l``, ``-p``), then
  the config file(s) from top to bottom (``IdentityFile`` accumulates; ``UserKnownHostsFile`` and
  ``GlobalKnownHostsFile`` take all the values of their first line);
- ``Include`` anywhere (glob patterns, sorted; a relative path is relative to ``~/.ssh`` in a user
  config, ``/etc/ssh`` in the system one; an Include in a block that does not apply is parsed only;
  a Match in an included file does not leak into the including file; 16 levels at most);
- ``Host`` patterns (``*``, ``?``, ``!negation`` -- a negated match cancels the whole line) and
  ``Match`` with ``all``, ``host``, ``originalhost``, ``user``, ``localuser``, ``exec``, ``final``,
  ``canonical``, ``tagged`` (and ``!`` before any of them); ``Match final`` re-reads the config
  with the final host name, like ssh;
- ``ProxyJump a,b`` (every hop ``[user@]host[:port]`` or ``ssh://...``), exclusive with
  ``ProxyCommand`` (whichever comes first), ``none`` for either;
- tokens: ``HostName`` ``%h``; ``ProxyCommand`` ``%h %p %r %n %k %%``; ``IdentityFile``,
  ``UserKnownHostsFile`` and ``IdentityAgent`` ``~`` then ``%d %u %h %r %p %n %l %L %i %k %C %%``
  and ``${ENV}``.

``~`` and ``%d`` are ``$HOME`` (ssh uses the home directory of the passwd entry; they are the same
unless HOME was changed). Keywords envbisect has no use for are accepted and ignored (so a config
written for a newer OpenSSH still works); a syntax error is one line naming the file and line.

Size (788 lines): OpenSSH's config grammar (Host/Match/Include, tokens, first value wins, ProxyJump) resolved as `ssh -G` resolves it: one grammar, one module.
"""
from __future__ import annotations

import glob
import hashlib
import logging
import os
import pwd
import re
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from envbisect.errors import ConnectionFailed, UsageError

log = logging.getLogger("envbisect.hosts.sshconfig")

SYSTEM_CONFIG = "/etc/ssh/ssh_config"
SYSTEM_DIR = "/etc/ssh"
MAX_INCLUDE_DEPTH = 16  # READCONF_MAX_DEPTH
DEFAULT_IDENTITY_FILES = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ecdsa_sk", "~/.ssh/id_ed25519",
                          "~/.ssh/id_ed25519_sk", "~/.ssh/id_xmss", "~/.ssh/id_dsa")
DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")

# keyword classes (lowercase, as readconf.c matches them)
_ACCUMULATE = {"identityfile", "certificatefile", "localforward", "remoteforward", "dynamicforward", "sendenv"}
_FIRST_LINE_ARRAY = {"userknownhostsfile", "globalknownhostsfile", "canonicaldomains",
                     "canonicalizepermittedcnames", "logverbose", "channeltimeout", "setenv"}
_RAW_COMMAND = {"proxycommand", "knownhostscommand", "localcommand", "remotecommand"}
_FLAGS = {"identitiesonly", "batchmode"}  # yes/no flags envbisect reads (checked like ssh checks them)
_CMDLINE_FORBIDDEN = {"host", "match", "include"}
_TRUE = {"yes", "true"}
_FALSE = {"no", "false"}


def _fail(where: str, problem: str) -> ConnectionFailed:
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


# --- the reader -------------------------------------------------------------------------------

@dataclass
class _Options:
    """What has been obtained so far (the `Options` struct): first value wins."""

    values: dict[str, list[str]] = field(default_factory=dict)   # keyword -> argv (or [raw] for commands)
    where: dict[str, str] = field(default_factory=dict)           # keyword -> "FILE line N" / "command line"
    identity_files: list[str] = field(default_factory=list)
    certificate_files: list[str] = field(default_factory=list)
    jump: str | None = None     # raw ProxyJump value, "none" included
    proxy_command: str | None = None
    want_final: bool = False

    def first(self, key: str) -> str | None:
        v = self.values.get(key)
        return v[0] if v else None


@dataclass
class _Ctx:
    host: str            # what Host patterns are matched against
    original_host: str   # the name as given (%n, Match originalhost)
    final: bool
    user_conf: bool      # relative Include -> ~/.ssh (else /etc/ssh)


class _Reader:
    def __init__(self, opts: _Options, ctx: _Ctx, local: str):
        self.o, self.ctx, self.local = opts, ctx, local

    # one file ------------------------------------------------------------------------------
    def read_file(self, path: str, *, active: list[bool], depth: int, never_match: bool, check_perm: bool) -> bool:
        """False when the file does not exist (ENOENT), like read_config_file_depth()."""
        if depth > MAX_INCLUDE_DEPTH:
            raise _fail(path, f"too many recursive configuration includes (more than {MAX_INCLUDE_DEPTH})")
        try:
            with open(path, "rb") as f:
                if check_perm:
                    st = os.fstat(f.fileno())
                    if (st.st_uid not in (0, os.getuid())) or st.st_mode & 0o022:
                        raise _fail(path, "bad owner or permissions (ssh refuses a config file that others can "
                                          "write: chmod go-w)")
                data = f.read()
        except FileNotFoundError:
            return False
        except IsADirectoryError:
            return True
        except OSError as e:
            raise _fail(path, f"cannot read ssh config: {e.strerror or e}") from None
        text = data.decode("utf-8", "surrogateescape")
        for lineno, line in enumerate(text.split("\n"), 1):
            self.line(line, f"{path} line {lineno}", active=active, depth=depth, never_match=never_match)
        return True

    # one line (process_config_line_depth) --------------------------------------------------
    def line(self, line: str, where: str, *, active: list[bool] | None, depth: int = 0, never_match: bool = False) -> None:
        kw = split_keyword(line)
        if kw is None:
            return
        keyword, rest = kw
        cmdline = active is None
        if cmdline:
            active = [True]
            if keyword in _CMDLINE_FORBIDDEN:
                raise _fail(where, f"{keyword.capitalize()} is not allowed as a command-line option")
        if not rest:
            raise _fail(where, f"no argument after keyword {keyword!r}")
        try:
            argv = argv_split(rest)
        except ValueError:
            raise _fail(where, "invalid quotes") from None
        o, on = self.o, active[0]

        if keyword == "host":
            active[0] = False
            if never_match:
                return
            for arg in argv:
                neg = arg.startswith("!")
                if match_pattern(self.ctx.host, arg[1:] if neg else arg):
                    if neg:
                        active[0] = False
                        break
                    active[0] = True
            return
        if keyword == "match":
            result = self.match(rest, where)
            active[0] = False if never_match else result
            return
        if keyword == "include":
            self.include(argv, where, active=active, depth=depth, never_match=never_match)
            return
        if keyword in _RAW_COMMAND:
            if keyword == "proxycommand":
                if on and o.proxy_command is None and o.jump is None:
                    o.proxy_command = rest
                    o.where["proxycommand"] = where
            elif on and keyword not in o.values:
                o.values[keyword], o.where[keyword] = [rest], where
            return
        if keyword == "proxyjump":
            value = rest.split("#", 1)[0].rstrip()
            if value.lower() != "none":
                try:
                    parse_jumps(value)
                except ValueError as e:
                    raise _fail(where, f"invalid ProxyJump {value!r}: {e}") from None
            if on and o.proxy_command is None and o.jump is None:
                o.jump = "none" if value.lower() == "none" else value
                o.where["proxyjump"] = where
            return
        if not argv:
            raise _fail(where, f"no argument after keyword {keyword!r}")
        if keyword == "identityfile" or keyword == "certificatefile":
            files = o.identity_files if keyword == "identityfile" else o.certificate_files
            if on and argv[0] not in files:
                files.append(argv[0])
                o.where.setdefault(keyword, where)
            return
        if keyword in _ACCUMULATE:
            if on:
                o.values.setdefault(keyword, []).extend(argv)
            return
        if keyword in _FIRST_LINE_ARRAY:
            if any(a.lower() == "none" for a in argv) and (len(argv) > 1) and keyword.endswith("knownhostsfile"):
                raise _fail(where, f"{keyword}: \"none\" must appear alone")
            if on and keyword not in o.values:
                o.values[keyword], o.where[keyword] = list(argv), where
            return
        value = argv[0]
        if keyword == "port":
            if not value.isdigit() or not 0 < int(value) < 65536:
                raise _fail(where, f"bad port {value!r}")
        elif keyword in ("connecttimeout", "serveraliveinterval", "connectionattempts") and value != "none":
            if convtime(value) < 0:
                raise _fail(where, f"invalid time value {value!r} for {keyword}")
        elif keyword in _FLAGS and value.lower() not in _TRUE | _FALSE:
            raise _fail(where, f"{keyword}: unsupported option {value!r} (yes or no)")
        if keyword == "connecttimeout" and value == "none":
            return  # "none" stores -1, i.e. unset: a later line may still set it (readconf.c)
        if on and keyword not in o.values:
            o.values[keyword], o.where[keyword] = list(argv), where
            if keyword == "canonicalizehostname" and value.lower() not in _FALSE:
                o.want_final = True

    # Include -----------------------------------------------------------------------------------
    def include(self, argv: Sequence[str], where: str, *, active: list[bool], depth: int, never_match: bool) -> None:
        for arg in argv:
            if arg.startswith("~") and not self.ctx.user_conf:
                raise _fail(where, f"bad include path {arg} (~ only in a user config)")
            if not arg.startswith(("/", "~")):
                path = ("~/.ssh/" if self.ctx.user_conf else SYSTEM_DIR + "/") + arg
            else:
                path = arg
            pattern = tilde_expand(path)
            matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
            outer = active[0]
            for m in matches:
                log.debug("%s: including %s%s", where, m, "" if outer else " (parse only)")
                self.read_file(m, active=active, depth=depth + 1, never_match=never_match or not outer,
                               check_perm=True)
                active[0] = outer  # a Match in an included file must not change this file's state

    # Match (match_cfg_line) --------------------------------------------------------------------
    def match(self, rest: str, where: str) -> bool:
        o, ctx = self.o, self.ctx
        port = o.first("port") or "22"
        ruser = o.first("user") or self.local
        if ctx.final:
            host = o.first("hostname") or ctx.host
        elif o.first("hostname") is not None:
            host = percent_expand(o.first("hostname"), {"h": ctx.original_host}, f"{where}: HostName")
        else:
            host = ctx.original_host
        words = strdelim_words(rest)
        if "#" in [w[:1] for w in words]:
            words = words[:[w[:1] for w in words].index("#")]  # a word starting with # ends the line
        result, attributes, i = True, 0, 0
        while i < len(words):
            attr = words[i]
            i += 1
            neg = attr.startswith("!")
            name = (attr[1:] if neg else attr).lower()
            if name == "all":
                if attributes > 1 or i < len(words):
                    raise _fail(where, f"'{attr}' cannot be combined with other Match attributes")
                return result and not neg
            attributes += 1
            if name in ("canonical", "final"):
                if name == "final":
                    o.want_final = True
                if ctx.final == neg:
                    result = False
                continue
            if i >= len(words):
                raise _fail(where, f"missing Match criteria for {attr}")
            arg = words[i]
            i += 1
            if name == "host":
                r = match_pattern_list(host.lower(), arg, True) == 1
            elif name == "originalhost":
                r = match_pattern_list(ctx.original_host.lower(), arg, True) == 1
            elif name == "user":
                r = match_pattern_list(ruser, arg) == 1
            elif name == "localuser":
                r = match_pattern_list(self.local, arg) == 1
            elif name == "tagged":
                tag = o.first("tag") or ""
                r = match_pattern_list(tag, arg) == 1
            elif name == "exec":
                if not result:
                    continue  # a failed earlier criterion skips the command, like ssh
                r = self.exec_criterion(arg, host, port, ruser, where)
            else:
                raise _fail(where, f"unsupported Match attribute {attr!r} (envbisect knows all, host, "
                                   "originalhost, user, localuser, exec, final, canonical, tagged)")
            if r == neg:
                result = False
        if attributes == 0:
            raise _fail(where, "one or more attributes required for Match")
        return result

    def exec_criterion(self, command: str, host: str, port: str, ruser: str, where: str) -> bool:
        this = socket.gethostname()
        alias = self.o.first("hostkeyalias") or host
        cmd = percent_expand(command, {
            "C": _connection_hash(this, host, port, ruser), "L": this.split(".")[0], "d": home(), "h": host,
            "k": alias, "l": this, "n": self.ctx.original_host, "p": port, "r": ruser, "u": self.local,
            "i": str(os.getuid()),
        }, f"{where}: Match exec")
        shell = os.environ.get("SHELL") or "/bin/sh"
        try:
            p = subprocess.run([shell, "-c", cmd], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise _fail(where, f"Match exec {cmd!r}: {e}") from None
        return p.returncode == 0


def _connection_hash(thishost: str, host: str, port: str, user: str) -> str:
    return hashlib.sha1(f"{thishost}{host}{port}{user}".encode()).hexdigest()


def _is_addr(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        return True
    except OSError:
        return False


# --- the answer -------------------------------------------------------------------------------

@dataclass(frozen=True)
class SSHConfig:
    """The resolved configuration of one destination (what ``ssh -G`` prints, and what envbisect
    connects with). Paths are expanded; ``raw`` keeps every value as obtained."""

    host_arg: str                    # the destination as given (%n)
    hostname: str                    # %h: HostName with %h expanded, lowercased unless an address
    port: int
    user: str
    identity_files: tuple[str, ...]  # expanded; ssh's default list when the config names none; "none" dropped
    identity_files_raw: tuple[str, ...]  # as ssh -G prints them (defaults included)
    identities_only: bool
    identity_agent: str | None       # None = $SSH_AUTH_SOCK; "none" = no agent
    user_known_hosts: tuple[str, ...]    # expanded; () for "none"
    global_known_hosts: tuple[str, ...]  # expanded; () for "none"
    host_key_alias: str | None       # lowercased
    proxy_jump: tuple[Jump, ...]     # hops, nearest first; () for none
    proxy_command: str | None        # as written (tokens not expanded); None for none / with ProxyJump
    connect_timeout: int | None      # seconds; None = not set
    strict_host_key_checking: str | None
    batch_mode: bool
    raw: Mapping[str, tuple[str, ...]]
    where: Mapping[str, str]          # keyword -> "FILE line N" that gave its value

    @property
    def known_hosts_name(self) -> str:
        """The name looked up in (and written to) known_hosts: HostKeyAlias, else host or [host]:port."""
        if self.host_key_alias:
            return self.host_key_alias
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def expanded_proxy_command(self) -> str | None:
        if self.proxy_command is None:
            return None
        return percent_expand(self.proxy_command, {
            "h": self.hostname, "p": str(self.port), "r": self.user, "n": self.host_arg,
            "k": self.host_key_alias or self.host_arg,
        }, f"{self.where.get('proxycommand', 'ProxyCommand')}: ProxyCommand")

    def ssh_g(self) -> dict[str, list[str]]:
        """The lines ``ssh -G`` prints for the keys envbisect uses, as {keyword: [values]}."""
        out: dict[str, list[str]] = {
            "user": [self.user], "hostname": [self.hostname], "port": [str(self.port)],
            "identitiesonly": ["yes" if self.identities_only else "no"],
            "batchmode": ["yes" if self.batch_mode else "no"],
            "identityfile": list(self.identity_files_raw),
            "connecttimeout": [str(self.connect_timeout) if self.connect_timeout is not None else "none"],
            "globalknownhostsfile": [" ".join(self.raw.get("globalknownhostsfile", DEFAULT_GLOBAL_KNOWN_HOSTS))],
            "userknownhostsfile": [" ".join(self.user_known_hosts) if self.user_known_hosts else "none"],
        }
        if self.host_key_alias:
            out["hostkeyalias"] = [self.host_key_alias]
        if self.proxy_jump:  # ssh -G: the earlier hops as written, the last one as parsed
            raw = (self.raw.get("proxyjump") or ("",))[0]
            extra = raw.split("#", 1)[0].rstrip().rsplit(",", 1)[0] if "," in raw else ""
            out["proxyjump"] = [(extra + "," if extra else "") + self.proxy_jump[-1].spec]
        elif self.proxy_command:
            out["proxycommand"] = [self.proxy_command]
        if self.identity_agent:
            out["identityagent"] = [self.identity_agent]
        return out


def default_config_files() -> list[tuple[str, bool]]:
    """(path, is_user_config) read when no -F is given: ~/.ssh/config, then /etc/ssh/ssh_config."""
    return [(os.path.join(home(), ".ssh", "config"), True), (SYSTEM_CONFIG, False)]


def resolve(host: str, *, config: str | os.PathLike | None = None, options: Iterable[tuple[str, str]] = (),
            user: str | None = None, port: int | None = None, system_config: bool = True) -> SSHConfig:
    """What ``ssh -G [-F config] [-o K=V for options] [-l user] [-p port] host`` resolves to.

    ``config``: one file, like ``-F`` (the system config is then not read); None reads
    ``~/.ssh/config`` and (with ``system_config``) ``/etc/ssh/ssh_config``. ``options``: command-line
    options (``-o``), which come before any file. ``user``/``port``: from ``user@host`` or
    ``-l``/``-p``."""
    local = local_user()
    if config is not None:
        cfg = tilde_expand(os.fspath(config))
        if not os.path.exists(cfg):
            raise ConnectionFailed(f"{cfg}: no such ssh config")
        files = [(cfg, True)]
    else:
        files = [f for f in default_config_files() if system_config or f[1]]

    def read(final: bool, opts: _Options, match_host: str) -> None:
        ctx = _Ctx(host=match_host, original_host=host, final=final, user_conf=True)
        reader = _Reader(opts, ctx, local)
        for path, user_conf in files:
            ctx.user_conf = user_conf
            # ~/.ssh/config is permission-checked; a -F file and the system file are not
            reader.read_file(path, active=[True], depth=0, never_match=False,
                             check_perm=user_conf and config is None)

    check_names(host, user)
    opts = _Options()
    cmd = _Reader(opts, _Ctx(host, host, False, True), local)
    if user:
        opts.values["user"], opts.where["user"] = [user], "command line"
    if port:
        opts.values["port"], opts.where["port"] = [str(port)], "command line"
    for k, v in options:
        cmd.line(f"{k} {v}", "command line", active=None)
    check_names(None, opts.first("user"), "-o User")
    read(False, opts, host)

    hostname = host
    if opts.first("hostname") is not None:
        hostname = percent_expand(opts.first("hostname"), {"h": host}, f"{opts.where['hostname']}: HostName")
    if not _is_addr(hostname):
        hostname = hostname.lower()
    if opts.first("canonicalizehostname") not in (None, "no", "false"):
        log.warning("CanonicalizeHostname is not supported by envbisect: %s is used as given", hostname)
    if opts.want_final:
        opts.values["hostname"] = [hostname]
        read(True, opts, hostname)
        hostname = opts.first("hostname") or hostname
    return _finish(host, hostname, opts, local)


def quote_value(v: str) -> str:
    """A value as one config word (for building ``-o KEY VALUE`` options from typed values)."""
    if v and not any(c in v for c in " \t\"'#\\"):
        return v
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _finish(host_arg: str, hostname: str, o: _Options, local: str) -> SSHConfig:
    port = int(o.first("port") or 22)
    user = o.first("user") or local
    alias = (o.first("hostkeyalias") or "").lower() or None
    this = socket.gethostname()
    tokens = {
        "C": _connection_hash(this, hostname, str(port), user), "L": this.split(".")[0], "i": str(os.getuid()),
        "k": alias or host_arg, "l": this, "n": host_arg, "p": str(port), "d": home(), "h": hostname,
        "r": user, "u": local,
    }

    def expand(path: str, key: str) -> str:
        return percent_expand(tilde_expand(path), tokens, f"{o.where.get(key, key)}: {key}", dollar=True)

    raw_ids = tuple(o.identity_files) or DEFAULT_IDENTITY_FILES
    identity_files = tuple(expand(f, "IdentityFile") for f in raw_ids if f.lower() != "none")
    ukh = o.values.get("userknownhostsfile") or list(DEFAULT_USER_KNOWN_HOSTS)
    user_known = () if ukh[0].lower() == "none" else tuple(expand(f, "UserKnownHostsFile") for f in ukh)
    gkh = o.values.get("globalknownhostsfile") or list(DEFAULT_GLOBAL_KNOWN_HOSTS)
    global_known = () if gkh[0].lower() == "none" else tuple(tilde_expand(f) for f in gkh)
    agent = o.first("identityagent")
    if agent is not None and agent.lower() != "none" and agent != "SSH_AUTH_SOCK":
        agent = expand(agent, "IdentityAgent")
    jumps: tuple[Jump, ...] = ()
    if o.jump is not None and o.jump.lower() != "none":
        jumps = parse_jumps(o.jump)
        last = jumps[-1]
        if last.host == hostname and (last.port or 22) == port and (last.user or user) == user:
            raise ConnectionFailed(f"{o.where.get('proxyjump', 'ProxyJump')}: jumphost loop via {last.host}")
    proxy = o.proxy_command if o.proxy_command and o.proxy_command.lower() != "none" else None
    if proxy == "-":
        raise ConnectionFailed(f"{o.where.get('proxycommand')}: ProxyCommand - (descriptor passing) is not supported")
    ct = o.first("connecttimeout")
    return SSHConfig(
        host_arg=host_arg, hostname=hostname, port=port, user=user,
        identity_files=identity_files, identity_files_raw=raw_ids,
        identities_only=(o.first("identitiesonly") or "no").lower() in _TRUE,
        identity_agent=agent, user_known_hosts=user_known, global_known_hosts=global_known,
        host_key_alias=alias, proxy_jump=jumps, proxy_command=None if jumps else proxy,
        connect_timeout=convtime(ct) if ct else None,
        strict_host_key_checking=o.first("stricthostkeychecking"),
        batch_mode=(o.first("batchmode") or "no").lower() in _TRUE,
        raw={**{k: tuple(v) for k, v in o.values.items()}, "identityfile": tuple(o.identity_files),
             **({"proxyjump": (o.jump,)} if o.jump else {}),
             **({"proxycommand": (o.proxy_command,)} if o.proxy_command else {})},
        where=dict(o.where),
    )


def parse_ssh_args(text: str | Sequence[str], where: str) -> list[tuple[str, str]]:
    """ssh command-line arguments (Ansible's ``ansible_ssh_common_args``/``ansible_ssh_extra_args``)
    as the options they set, in order: ``-o K=V`` / ``-oK=V`` / ``-o "K V"``, ``-J hops``, ``-p``,
    ``-l``, ``-i``. Flags that change nothing envbisect does (``-C``, ``-4``, ``-A``...) are
    ignored; ``-F`` is refused (pass --ssh-config instead)."""
    import shlex

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


def describe(resolved: SSHConfig) -> dict[str, Any]:
    """A small dict for -vv logs."""
    return {"hostname": resolved.hostname, "port": resolved.port, "user": resolved.user,
            "proxyjump": [j.spec for j in resolved.proxy_jump], "proxycommand": resolved.proxy_command,
            "known_hosts": resolved.user_known_hosts, "hostkeyalias": resolved.host_key_alias}
