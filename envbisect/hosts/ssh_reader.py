"""Reading OpenSSH client config files the way readconf.c does: Host and Match blocks, Include
(glob patterns, nesting, a Match inside an included file kept inside it), and the first obtained
value of each keyword winning (``IdentityFile`` accumulating, the known-hosts files taking the
whole of their first line). `ConfigReader` fills one `Options`; `sshconfig.resolve` drives it and
turns the result into an `SSHConfig`.
"""
from __future__ import annotations

import glob
import logging
import os
import socket
import subprocess
from dataclasses import dataclass, field
from typing import Sequence

from envbisect.hosts.ssh_grammar import (argv_split, connection_hash, convtime, fail, home, match_pattern,
                                         match_pattern_list, parse_jumps, percent_expand, split_keyword,
                                         strdelim_words, tilde_expand)

log = logging.getLogger("envbisect.hosts.sshconfig")

SYSTEM_DIR = "/etc/ssh"
MAX_INCLUDE_DEPTH = 16  # READCONF_MAX_DEPTH

# keyword classes (lowercase, as readconf.c matches them)
_ACCUMULATE = {"identityfile", "certificatefile", "localforward", "remoteforward", "dynamicforward", "sendenv"}
_FIRST_LINE_ARRAY = {"userknownhostsfile", "globalknownhostsfile", "canonicaldomains",
                     "canonicalizepermittedcnames", "logverbose", "channeltimeout", "setenv"}
_RAW_COMMAND = {"proxycommand", "knownhostscommand", "localcommand", "remotecommand"}
_FLAGS = {"identitiesonly", "batchmode"}  # yes/no flags envbisect reads (checked like ssh checks them)
_CMDLINE_FORBIDDEN = {"host", "match", "include"}
TRUE = {"yes", "true"}
FALSE = {"no", "false"}



@dataclass
class Options:
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
class Context:
    host: str            # what Host patterns are matched against
    original_host: str   # the name as given (%n, Match originalhost)
    final: bool
    user_conf: bool      # relative Include -> ~/.ssh (else /etc/ssh)


class ConfigReader:
    def __init__(self, opts: Options, ctx: Context, local: str):
        self.o, self.ctx, self.local = opts, ctx, local

    # one file ------------------------------------------------------------------------------
    def read_file(self, path: str, *, active: list[bool], depth: int, never_match: bool, check_perm: bool) -> bool:
        """False when the file does not exist (ENOENT), like read_config_file_depth()."""
        if depth > MAX_INCLUDE_DEPTH:
            raise fail(path, f"too many recursive configuration includes (more than {MAX_INCLUDE_DEPTH})")
        try:
            with open(path, "rb") as f:
                if check_perm:
                    st = os.fstat(f.fileno())
                    if (st.st_uid not in (0, os.getuid())) or st.st_mode & 0o022:
                        raise fail(path, "bad owner or permissions (ssh refuses a config file that others can "
                                          "write: chmod go-w)")
                data = f.read()
        except FileNotFoundError:
            return False
        except IsADirectoryError:
            return True
        except OSError as e:
            raise fail(path, f"cannot read ssh config: {e.strerror or e}") from None
        text = data.decode("utf-8", "surrogateescape")
        for lineno, line in enumerate(text.split("\n"), 1):
            self.line(line, f"{path} line {lineno}", active=active, depth=depth, never_match=never_match)
        return True

    # one line (process_config_line_depth) --------------------------------------------------
    def line(self, line: str, where: str, *, active: list[bool] | None, depth: int = 0,
             never_match: bool = False) -> None:
        kw = split_keyword(line)
        if kw is None:
            return
        keyword, rest = kw
        cmdline = active is None
        if cmdline:
            active = [True]
            if keyword in _CMDLINE_FORBIDDEN:
                raise fail(where, f"{keyword.capitalize()} is not allowed as a command-line option")
        if not rest:
            raise fail(where, f"no argument after keyword {keyword!r}")
        try:
            argv = argv_split(rest)
        except ValueError:
            raise fail(where, "invalid quotes") from None
        if keyword == "host":
            self.host(argv, active=active, never_match=never_match)
        elif keyword == "match":
            result = self.match(rest, where)
            active[0] = False if never_match else result
        elif keyword == "include":
            self.include(argv, where, active=active, depth=depth, never_match=never_match)
        elif keyword in _RAW_COMMAND or keyword == "proxyjump":
            self.command(keyword, rest, where, on=active[0])
        elif not argv:
            raise fail(where, f"no argument after keyword {keyword!r}")
        else:
            self.value(keyword, argv, where, on=active[0])

    def host(self, argv: Sequence[str], *, active: list[bool], never_match: bool) -> None:
        """A Host line: whether the lines below it apply (a negated match cancels the whole line)."""
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

    def command(self, keyword: str, rest: str, where: str, *, on: bool) -> None:
        """A keyword whose value is the raw rest of the line (ProxyCommand and the other commands), or
        ProxyJump; ProxyCommand and ProxyJump exclude each other, whichever comes first."""
        o = self.o
        if keyword == "proxyjump":
            value = rest.split("#", 1)[0].rstrip()
            if value.lower() != "none":
                try:
                    parse_jumps(value)
                except ValueError as e:
                    raise fail(where, f"invalid ProxyJump {value!r}: {e}") from None
            if on and o.proxy_command is None and o.jump is None:
                o.jump = "none" if value.lower() == "none" else value
                o.where["proxyjump"] = where
        elif keyword == "proxycommand":
            if on and o.proxy_command is None and o.jump is None:
                o.proxy_command = rest
                o.where["proxycommand"] = where
        elif on and keyword not in o.values:
            o.values[keyword], o.where[keyword] = [rest], where

    def value(self, keyword: str, argv: Sequence[str], where: str, *, on: bool) -> None:
        """Any other keyword: checked like ssh checks it, kept when it is the first value obtained."""
        o = self.o
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
                raise fail(where, f"{keyword}: \"none\" must appear alone")
            if on and keyword not in o.values:
                o.values[keyword], o.where[keyword] = list(argv), where
            return
        value = argv[0]
        if keyword == "port":
            if not value.isdigit() or not 0 < int(value) < 65536:
                raise fail(where, f"bad port {value!r}")
        elif keyword in ("connecttimeout", "serveraliveinterval", "connectionattempts") and value != "none":
            if convtime(value) < 0:
                raise fail(where, f"invalid time value {value!r} for {keyword}")
        elif keyword in _FLAGS and value.lower() not in TRUE | FALSE:
            raise fail(where, f"{keyword}: unsupported option {value!r} (yes or no)")
        if keyword == "connecttimeout" and value == "none":
            return  # "none" stores -1, i.e. unset: a later line may still set it (readconf.c)
        if on and keyword not in o.values:
            o.values[keyword], o.where[keyword] = list(argv), where
            if keyword == "canonicalizehostname" and value.lower() not in FALSE:
                o.want_final = True

    # Include -----------------------------------------------------------------------------------
    def include(self, argv: Sequence[str], where: str, *, active: list[bool], depth: int, never_match: bool) -> None:
        for arg in argv:
            if arg.startswith("~") and not self.ctx.user_conf:
                raise fail(where, f"bad include path {arg} (~ only in a user config)")
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
                    raise fail(where, f"'{attr}' cannot be combined with other Match attributes")
                return result and not neg
            attributes += 1
            if name in ("canonical", "final"):
                if name == "final":
                    o.want_final = True
                if ctx.final == neg:
                    result = False
                continue
            if i >= len(words):
                raise fail(where, f"missing Match criteria for {attr}")
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
                raise fail(where, f"unsupported Match attribute {attr!r} (envbisect knows all, host, "
                                   "originalhost, user, localuser, exec, final, canonical, tagged)")
            if r == neg:
                result = False
        if attributes == 0:
            raise fail(where, "one or more attributes required for Match")
        return result

    def exec_criterion(self, command: str, host: str, port: str, ruser: str, where: str) -> bool:
        this = socket.gethostname()
        alias = self.o.first("hostkeyalias") or host
        cmd = percent_expand(command, {
            "C": connection_hash(this, host, port, ruser), "L": this.split(".")[0], "d": home(), "h": host,
            "k": alias, "l": this, "n": self.ctx.original_host, "p": port, "r": ruser, "u": self.local,
            "i": str(os.getuid()),
        }, f"{where}: Match exec")
        shell = os.environ.get("SHELL") or "/bin/sh"
        try:
            p = subprocess.run([shell, "-c", cmd], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise fail(where, f"Match exec {cmd!r}: {e}") from None
        return p.returncode == 0


