"""Host keys, checked as OpenSSH checks them: the known_hosts files the ssh config names (plain
lines, wildcards, negations, hashed names, @revoked), the refusal of an unknown or changed key, and
StrictHostKeyChecking=accept-new when the user asks for it (--accept-new-host-key).
"""
from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import paramiko

from envbisect.errors import ConnectionFailed, HostKeyError

log = logging.getLogger("envbisect.hosts.transport")  # the transports' one log


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class RefuseUnknown(paramiko.MissingHostKeyPolicy):
    """RejectPolicy that keeps the offered key so the refusal can show its fingerprint."""

    def __init__(self) -> None:
        self.offered: paramiko.PKey | None = None

    def missing_host_key(self, client, hostname, key):  # noqa: ANN001 - paramiko's signature
        self.offered = key
        raise paramiko.SSHException(f"unknown host key for {hostname}")


class AcceptNew(paramiko.MissingHostKeyPolicy):
    """OpenSSH's StrictHostKeyChecking=accept-new: trust an unknown key and record it (under the name
    ssh looks up: HostKeyAlias or [host]:port, in the first UserKnownHostsFile); a *changed* key is
    still refused by paramiko."""

    def __init__(self, known_hosts_file: str | None, name: str, hashed: bool = False):
        self.file, self.name, self.hashed = known_hosts_file, name, hashed

    def missing_host_key(self, client, hostname, key):  # noqa: ANN001
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.file is None:  # UserKnownHostsFile none: ssh accepts and cannot record either
            log.warning("accepted new host key for %s: %s (not recorded: UserKnownHostsFile is none)",
                        self.name, fingerprint(key))
            return
        path = Path(self.file)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with path.open("a") as f:
            recorded = paramiko.HostKeys.hash_host(self.name) if self.hashed else self.name
            f.write(f"{recorded} {key.get_name()} {key.get_base64()}\n")
        log.warning("accepted new host key for %s: %s (saved to %s)", self.name, fingerprint(key), path)


@dataclass(frozen=True)
class Revoked:
    patterns: tuple[str, ...]
    key: paramiko.PKey
    where: str  # FILE:LINE


def host_matches(patterns: tuple[str, ...], name: str) -> bool:
    """OpenSSH known_hosts host patterns: * and ? wildcards (brackets are literal: "[host]:port"),
    negations (!), hashed names (|1|...)."""
    hit = False
    for p in patterns:
        neg = p.startswith("!")
        p = p[1:] if neg else p
        if p.startswith("|1|"):
            m = paramiko.HostKeys.hash_host(name, p) == p
        else:
            glob = re.escape(p.lower()).replace(r"\*", ".*").replace(r"\?", ".")
            m = re.fullmatch(glob, name.lower()) is not None
        if m and neg:
            return False
        hit = hit or m
    return hit


def load_known_hosts(path: str) -> tuple[list[tuple[tuple[str, ...], paramiko.PKey]], list[Revoked]]:
    """Read an OpenSSH known_hosts file the way OpenSSH does, as far as paramiko can: plain lines
    are trusted (host patterns, key) pairs (matched with `host_matches`, so wildcards, negations
    and hashed names work as in ssh); ``@revoked`` lines are returned apart (such a key is refused, even
    when a plain line lists it too); ``@cert-authority`` lines are skipped with a warning (paramiko
    cannot check host certificates: the host's own key must be listed to connect). A line that
    cannot be parsed is skipped, like OpenSSH does (paramiko's own loader raises on marker lines)."""
    trusted: list[tuple[tuple[str, ...], paramiko.PKey]] = []
    revoked: list[Revoked] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            marker = None
            if line.startswith("@"):
                marker, _, line = line.partition(" ")
                line = line.strip()
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
            except Exception:  # noqa: BLE001 - InvalidHostKey, SSHException, bad base64: skipped like OpenSSH
                entry = None
            if marker == "@revoked":
                if entry is None:
                    log.warning("%s:%d: cannot read the @revoked key: line ignored", path, lineno)
                else:
                    revoked.append(Revoked(tuple(entry.hostnames), entry.key, f"{path}:{lineno}"))
            elif marker is not None:
                log.warning("%s:%d: %s lines are not supported (host certificates cannot be checked): line "
                            "ignored; the host's own key must be listed to connect", path, lineno, marker)
            elif entry is not None:
                trusted.append((tuple(entry.hostnames), entry.key))
    return trusted, revoked


def revoked_entry(revoked: Sequence[Revoked], hostname: str, key: paramiko.PKey) -> Revoked | None:
    return next((r for r in revoked if r.key == key and host_matches(r.patterns, hostname)), None)


class RefuseRevoked(paramiko.MissingHostKeyPolicy):
    """Before the real policy: a key marked @revoked for this host is refused, never accepted."""

    def __init__(self, inner: paramiko.MissingHostKeyPolicy, revoked: Sequence[Revoked], who: str, name: str):
        self.inner, self.revoked, self.who, self.name = inner, revoked, who, name

    def missing_host_key(self, client, hostname, key):  # noqa: ANN001
        r = revoked_entry(self.revoked, self.name, key)
        if r is not None:
            client.close()
            raise revoked_error(self.who, key, r)
        return self.inner.missing_host_key(client, hostname, key)


def revoked_error(who: str, key: paramiko.PKey, r: Revoked) -> HostKeyError:
    return HostKeyError(f"{who}: host key {key.get_name()} {fingerprint(key)} is marked @revoked in {r.where}; "
                        "refusing to connect")


@dataclass(frozen=True)
class KnownKeys:
    """What the known_hosts files say: trusted (host patterns, key, file) and revoked keys."""

    trusted: tuple[tuple[tuple[str, ...], paramiko.PKey, str], ...]
    revoked: tuple[Revoked, ...]

    def trust(self, client: paramiko.SSHClient, name: str, paramiko_name: str) -> dict[bytes, str]:
        """Give `client` the keys trusted for `name` (under `paramiko_name`, the name paramiko looks up);
        a revoked key is never trusted, even when a plain line lists it too. Returns key -> the file
        that lists it, for the message about a changed key."""
        source: dict[bytes, str] = {}
        for patterns, key, f in self.trusted:
            if host_matches(patterns, name) and revoked_entry(self.revoked, name, key) is None:
                client.get_host_keys().add(paramiko_name, key.get_name(), key)
                source.setdefault(key.asbytes(), f)
        return source


def read_known_hosts(files: Iterable[str]) -> KnownKeys:
    """Exactly the files ssh reads, in its order (each once): UserKnownHostsFile (default
    ~/.ssh/known_hosts, ~/.ssh/known_hosts2) *instead of* the default, then GlobalKnownHostsFile."""
    trusted: list[tuple[tuple[str, ...], paramiko.PKey, str]] = []
    revoked: list[Revoked] = []
    for f in dict.fromkeys(files):
        if os.path.isfile(f):
            try:
                tr, rv = load_known_hosts(f)
            except OSError as e:
                raise ConnectionFailed(f"{f}: cannot read known_hosts: {e.strerror or e}") from None
            trusted += [(patterns, key, f) for patterns, key in tr]
            revoked += rv
    return KnownKeys(tuple(trusted), tuple(revoked))

