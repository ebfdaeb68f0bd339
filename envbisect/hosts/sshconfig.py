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

The words of a config line (patterns, tokens, ProxyJump hops, names) are `ssh_grammar.py`'s, the
reading of files and blocks (Host, Match, Include) `ssh_reader.py`'s; this module resolves a
destination with them and re-exports their public names.
"""
from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from envbisect.errors import ConnectionFailed
from envbisect.hosts.ssh_grammar import (Jump, argv_split, check_names, connection_hash, convtime, home, local_user,
                                         match_pattern, match_pattern_list, parse_jump_hop, parse_jumps,
                                         parse_ssh_args, percent_expand, quote_value, split_keyword,
                                         strdelim_words, tilde_expand, valid_hostname, valid_user)
from envbisect.hosts.ssh_reader import MAX_INCLUDE_DEPTH, SYSTEM_DIR, TRUE, ConfigReader, Context, Options

__all__ = [
    "SSHConfig", "resolve", "describe", "default_config_files", "Jump", "parse_jumps", "parse_jump_hop",
    "parse_ssh_args", "quote_value", "check_names", "valid_hostname", "valid_user", "argv_split",
    "split_keyword", "strdelim_words", "match_pattern", "match_pattern_list", "convtime", "percent_expand",
    "tilde_expand", "home", "local_user", "MAX_INCLUDE_DEPTH", "SYSTEM_DIR", "SYSTEM_CONFIG",
]

log = logging.getLogger("envbisect.hosts.sshconfig")

SYSTEM_CONFIG = "/etc/ssh/ssh_config"
DEFAULT_IDENTITY_FILES = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ecdsa_sk", "~/.ssh/id_ed25519",
                          "~/.ssh/id_ed25519_sk", "~/.ssh/id_xmss", "~/.ssh/id_dsa")
DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")


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

    def read(final: bool, opts: Options, match_host: str) -> None:
        ctx = Context(host=match_host, original_host=host, final=final, user_conf=True)
        reader = ConfigReader(opts, ctx, local)
        for path, user_conf in files:
            ctx.user_conf = user_conf
            # ~/.ssh/config is permission-checked; a -F file and the system file are not
            reader.read_file(path, active=[True], depth=0, never_match=False,
                             check_perm=user_conf and config is None)

    check_names(host, user)
    opts = Options()
    cmd = ConfigReader(opts, Context(host, host, False, True), local)
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


def _finish(host_arg: str, hostname: str, o: Options, local: str) -> SSHConfig:
    port = int(o.first("port") or 22)
    user = o.first("user") or local
    alias = (o.first("hostkeyalias") or "").lower() or None
    this = socket.gethostname()
    tokens = {
        "C": connection_hash(this, hostname, str(port), user), "L": this.split(".")[0], "i": str(os.getuid()),
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
        identities_only=(o.first("identitiesonly") or "no").lower() in TRUE,
        identity_agent=agent, user_known_hosts=user_known, global_known_hosts=global_known,
        host_key_alias=alias, proxy_jump=jumps, proxy_command=None if jumps else proxy,
        connect_timeout=convtime(ct) if ct else None,
        strict_host_key_checking=o.first("stricthostkeychecking"),
        batch_mode=(o.first("batchmode") or "no").lower() in TRUE,
        raw={**{k: tuple(v) for k, v in o.values.items()}, "identityfile": tuple(o.identity_files),
             **({"proxyjump": (o.jump,)} if o.jump else {}),
             **({"proxycommand": (o.proxy_command,)} if o.proxy_command else {})},
        where=dict(o.where),
    )


def describe(resolved: SSHConfig) -> dict[str, Any]:
    """A small dict for -vv logs."""
    return {"hostname": resolved.hostname, "port": resolved.port, "user": resolved.user,
            "proxyjump": [j.spec for j in resolved.proxy_jump], "proxycommand": resolved.proxy_command,
            "known_hosts": resolved.user_known_hosts, "hostkeyalias": resolved.host_key_alias}
