"""Hosts from an Ansible inventory, without depending on Ansible.

The inventory is the JSON that ``ansible-inventory -i X --list`` prints (a file, or ``-`` for
stdin). Anything else -- an INI or YAML inventory, a folder with group_vars, a script -- is
converted by running ``ansible-inventory`` when it is on PATH. A playbook host then says
``inventory = "gpu1"`` (a host, or a group with exactly one host), and gets what Ansible's ssh
connection would use, mapped like pytest-testinfra maps it:

==================================================  ===============================================
``ansible_host`` (``ansible_ssh_host``)              the name ssh connects to (and the ssh config is
                                                     applied to), default the inventory name
``ansible_port`` (``ansible_ssh_port``)              ``-o Port``
``ansible_user`` (``ansible_ssh_user``)              ``-o User``
``ansible_ssh_private_key_file`` /
``ansible_private_key_file``                         ``-o IdentityFile``
``ansible_ssh_common_args``, ``ansible_ssh_extra_args``
(and ``ansible_ssh_args``)                           parsed as ssh arguments: ``-o K=V``, ``-J hops``
                                                     (ProxyJump), ``-o ProxyCommand=...``, ``-p``,
                                                     ``-l``, ``-i``
``ansible_python_interpreter``                       the host's python, unless the playbook says
``ansible_connection``                               ``ssh``/``smart``/``paramiko`` (default) or
                                                     ``local``; anything else is refused
==================================================  ===============================================

A variable not set for the host falls back, as in Ansible, to its environment variable
(``ANSIBLE_REMOTE_USER``, ``ANSIBLE_REMOTE_PORT``, ``ANSIBLE_PRIVATE_KEY_FILE``,
``ANSIBLE_SSH_ARGS``, ``ANSIBLE_SSH_COMMON_ARGS``, ``ANSIBLE_SSH_EXTRA_ARGS``,
``ANSIBLE_PYTHON_INTERPRETER``) and then to ansible.cfg (``ANSIBLE_CONFIG``, ./ansible.cfg,
~/.ansible.cfg, /etc/ansible/ansible.cfg). These become `ssh -o` options in the order Ansible's ssh
plugin passes them, so the user's OpenSSH config still applies below them (first value wins).

Host vars come from ``_meta.hostvars`` (``ansible-inventory --list`` has already merged group vars
into them); a document whose groups carry ``vars`` (``--export``, or a dynamic inventory script's
output) has them merged the way Ansible does (``all`` first, deeper groups later, then the host's
own). A value envbisect uses that still holds a Jinja2 template (``{{ ... }}``) is an error naming
the variable: ansible-inventory does not render templates, and envbisect will not guess.
"""
from __future__ import annotations

import configparser
import dataclasses
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from envbisect.errors import ConnectionFailed, PlaybookError, UsageError
from envbisect.inputs.playbook import LOCAL, Playbook
from envbisect.hosts.sshconfig import check_names, parse_ssh_args, quote_value

log = logging.getLogger("envbisect.hosts.inventory")

ANSIBLE_INVENTORY = "ansible-inventory"
CONVERT_TIMEOUT_S = 120
SSH_CONNECTIONS = {"ssh", "smart", "paramiko", "paramiko_ssh", "ansible.builtin.ssh", "ansible.builtin.paramiko_ssh",
                   "ansible.legacy.ssh"}
LOCAL_CONNECTIONS = {"local", "ansible.builtin.local", "ansible.legacy.local"}


@dataclass(frozen=True)
class HostConnection:
    """How Ansible would reach one inventory host, as envbisect's transport takes it."""

    name: str                                  # the inventory host name
    ssh: str                                   # "local", or the destination ssh connects to (ansible_host)
    options: tuple[tuple[str, str], ...]       # `ssh -o KEY VALUE` options, in Ansible's order
    python: str | None                         # ansible_python_interpreter (None: not set, or "auto")


@dataclass(frozen=True)
class Inventory:
    source: str                                 # the file given, or "stdin" (for messages)
    groups: Mapping[str, Mapping[str, Any]]     # name -> {"hosts": [...], "children": [...], "vars": {...}}
    hostvars: Mapping[str, Mapping[str, Any]]   # _meta.hostvars

    # membership --------------------------------------------------------------------------------
    def all_hosts(self) -> list[str]:
        seen = dict.fromkeys(self.hostvars)
        for g in self.groups.values():
            seen.update(dict.fromkeys(g.get("hosts", ())))
        return sorted(seen)

    def group_hosts(self, group: str) -> list[str]:
        """Every host of a group, its children's included (``all``: every host)."""
        if group == "all":
            return self.all_hosts()
        out: dict[str, None] = {}
        stack, seen = [group], set()
        while stack:
            g = stack.pop()
            if g in seen or g not in self.groups:
                continue
            seen.add(g)
            out.update(dict.fromkeys(self.groups[g].get("hosts", ())))
            stack.extend(self.groups[g].get("children", ()))
        return sorted(out)

    def is_host(self, name: str) -> bool:
        return name in self.hostvars or any(name in g.get("hosts", ()) for g in self.groups.values())

    def resolve(self, name: str) -> list[str]:
        """The hosts a playbook's ``inventory = NAME`` means: the host NAME, and/or the hosts of group NAME."""
        hosts = dict.fromkeys([name] if self.is_host(name) else [])
        if name in self.groups or name == "all":
            hosts.update(dict.fromkeys(self.group_hosts(name)))
        return list(hosts)

    # variables ---------------------------------------------------------------------------------
    def _depths(self) -> dict[str, int]:
        depth = {"all": 0}
        frontier = ["all"]
        while frontier:
            nxt = []
            for g in frontier:
                for c in self.groups.get(g, {}).get("children", ()):
                    if depth.get(c, -1) < depth[g] + 1 and depth[g] < 64:
                        depth[c] = depth[g] + 1
                        nxt.append(c)
            frontier = nxt
        for g in self.groups:
            depth.setdefault(g, 1)  # not under "all" in the document: Ansible puts it there
        return depth

    def groups_of(self, host: str) -> list[str]:
        direct = [g for g, v in self.groups.items() if host in v.get("hosts", ())]
        parents: dict[str, list[str]] = {}
        for g, v in self.groups.items():
            for c in v.get("children", ()):
                parents.setdefault(c, []).append(g)
        out, stack = set(), list(direct)
        while stack:
            g = stack.pop()
            if g not in out:
                out.add(g)
                stack.extend(parents.get(g, ()))
        out.add("all")
        return list(out)

    def variables(self, host: str) -> dict[str, Any]:
        """Group vars (all, then by depth and name, like Ansible's sort_groups), then host vars."""
        merged: dict[str, Any] = {}
        if any("vars" in g for g in self.groups.values()):
            depth = self._depths()
            for g in sorted(self.groups_of(host), key=lambda g: (depth.get(g, 1), g)):
                merged.update(self.groups.get(g, {}).get("vars") or {})
        merged.update(self.hostvars.get(host) or {})
        return merged

    def connection(self, host: str, *, ansible_cfg: configparser.ConfigParser | None = None) -> HostConnection:
        v = self.variables(host)
        cfg = ansible_cfg if ansible_cfg is not None else read_ansible_cfg()
        where = f"{self.source}: host {host}"

        def get(names: tuple[str, ...], env: str | None = None, ini: tuple[str, str] | None = None) -> tuple[str, Any]:
            """The first of ``names`` set for the host (the ansible_ssh_* spelling wins, as in
            Ansible), else the environment variable, else ansible.cfg: (what gave it, value)."""
            for n in names:
                if n in v and v[n] is not None:
                    value = v[n]
                    if isinstance(value, str) and ("{{" in value or "{%" in value):
                        raise UsageError(
                            f"{where}: {n} = {_short(value)} is still a Jinja2 template; ansible-inventory does not "
                            f"render templates and envbisect will not guess: give {n} a literal value for this host "
                            "(or ssh = ... in the playbook)")
                    return n, value
            if env and os.environ.get(env):
                return env, os.environ[env]
            if ini and cfg.has_option(*ini):
                return f"ansible.cfg [{ini[0]}] {ini[1]}", cfg.get(*ini)
            return "", None

        conn_name, conn = get(("ansible_connection",), "ANSIBLE_TRANSPORT", ("defaults", "transport"))
        conn = str(conn or "ssh")
        _, python = get(("ansible_python_interpreter",), "ANSIBLE_PYTHON_INTERPRETER",
                        ("defaults", "interpreter_python"))
        python = None if python is None or str(python).startswith("auto") else str(python)
        if conn in LOCAL_CONNECTIONS:
            return HostConnection(host, LOCAL, (), python)
        if conn not in SSH_CONNECTIONS:
            raise UsageError(f"{where}: {conn_name or 'ansible_connection'} = {conn!r} is not supported (envbisect "
                             "connects over SSH: ssh, smart, paramiko or local)")
        if get(("ansible_password", "ansible_ssh_pass", "ansible_ssh_password"))[1] is not None:
            log.warning("%s: a password is set; envbisect authenticates with keys and ssh-agent only", where)
        address_name, address = get(("ansible_ssh_host", "ansible_host"))
        address = str(address) if address is not None else host
        if not address:
            raise UsageError(f"{where}: ansible_host {address!r} is not a host name or address")
        check_names(address, None, where, what_host=address_name or "inventory host name")
        opts: list[tuple[str, str]] = []
        args_name, args = get(("ansible_ssh_args",), "ANSIBLE_SSH_ARGS", ("ssh_connection", "ssh_args"))
        opts += _ssh_args(args, f"{where}: {args_name}")
        port_name, port = get(("ansible_ssh_port", "ansible_port"), "ANSIBLE_REMOTE_PORT", ("defaults", "remote_port"))
        if port is not None:
            if isinstance(port, bool) or not str(port).isdigit() or not 0 < int(port) < 65536:
                raise UsageError(f"{where}: {port_name} = {port!r} is not a port number")
            opts.append(("Port", str(int(port))))
        _, key = get(("ansible_ssh_private_key_file", "ansible_private_key_file"), "ANSIBLE_PRIVATE_KEY_FILE",
                     ("defaults", "private_key_file"))
        if key is not None:
            opts.append(("IdentityFile", quote_value(os.path.expanduser(str(key)))))
        user_name, user = get(("ansible_ssh_user", "ansible_user"), "ANSIBLE_REMOTE_USER", ("defaults", "remote_user"))
        if user is not None:
            if not str(user) or any(c.isspace() for c in str(user)):
                raise UsageError(f"{where}: {user_name} = {user!r} is not a user name")
            check_names(None, str(user), where, what_user=user_name)
            opts.append(("User", quote_value(str(user))))
        for names, env, ini in (
                (("ansible_ssh_common_args",), "ANSIBLE_SSH_COMMON_ARGS", ("ssh_connection", "ssh_common_args")),
                (("ansible_ssh_extra_args",), "ANSIBLE_SSH_EXTRA_ARGS", ("ssh_connection", "ssh_extra_args"))):
            name, value = get(names, env, ini)
            opts += _ssh_args(value, f"{where}: {name}")
        return HostConnection(host, address, tuple(opts), python)


def _short(value: str, n: int = 80) -> str:
    return repr(value if len(value) <= n else value[:n] + "...")


def _ssh_args(value: Any, where: str) -> list[tuple[str, str]]:
    if value is None or value == "":
        return []
    if not isinstance(value, (str, list)):
        raise UsageError(f"{where}: must be a string of ssh arguments, got {type(value).__name__}")
    try:
        return parse_ssh_args(value if isinstance(value, str) else [str(x) for x in value], where)
    except ConnectionFailed as e:  # bad input, not a connection problem
        raise UsageError(str(e)) from None


def read_ansible_cfg() -> configparser.ConfigParser:
    """ansible.cfg as Ansible finds it: $ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg, /etc/ansible/ansible.cfg.

    Its ssh_args may hold a ProxyCommand, a command run on this machine: like Ansible, ./ansible.cfg is
    skipped (with a warning) when the working directory is world-writable, where anyone could have put it."""
    cfg = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";",), strict=False)
    env = os.environ.get("ANSIBLE_CONFIG")
    candidates = [env] if env else []
    if env and os.path.isdir(env):
        candidates = [os.path.join(env, "ansible.cfg")]
    if _cwd_world_writable():
        if os.path.isfile("ansible.cfg") and not any(os.path.isfile(c) for c in candidates):
            log.warning("envbisect is being run in a world writable directory (%s), ignoring it as an ansible.cfg "
                        "source (as Ansible does)", os.getcwd())
    else:
        candidates.append("ansible.cfg")
    candidates += [os.path.expanduser("~/.ansible.cfg"), "/etc/ansible/ansible.cfg"]
    for c in candidates:
        if c and os.path.isfile(c):
            try:
                cfg.read(c, encoding="utf-8")
            except (configparser.Error, OSError, UnicodeDecodeError) as e:
                raise UsageError(f"{c}: cannot read ansible.cfg: {str(e).splitlines()[0]}") from None
            log.debug("ansible.cfg: %s", c)
            break
    return cfg


def _cwd_world_writable() -> bool:
    try:
        return bool(os.stat(".").st_mode & stat.S_IWOTH)
    except OSError:
        return True  # a working directory that cannot be looked at is not one to read commands from


# --- loading ----------------------------------------------------------------------------------

_stdin_cache: dict[str, Any] = {}


def parse_inventory_json(doc: Any, source: str) -> Inventory:
    """The document of ``ansible-inventory --list`` (or a dynamic inventory script), checked."""
    if not isinstance(doc, dict):
        raise UsageError(f"{source}: not an ansible-inventory --list document (a JSON object of groups and _meta)")
    meta = doc.get("_meta")
    meta = {} if meta is None else meta
    hostvars = meta.get("hostvars", {}) if isinstance(meta, dict) else None
    hostvars = {} if hostvars is None and isinstance(meta, dict) else hostvars
    if not isinstance(hostvars, dict) or not all(isinstance(v, dict) for v in hostvars.values()):
        raise UsageError(f"{source}: _meta.hostvars must map each host to its variables")
    groups: dict[str, dict[str, Any]] = {}
    for name, g in doc.items():
        if name == "_meta":
            continue
        if isinstance(g, list):  # script shorthand: "group": ["host", ...]
            g = {"hosts": g}
        if not isinstance(g, dict):
            raise UsageError(f"{source}: group {name!r} must be an object with hosts/children/vars")
        hosts, children, gvars = g.get("hosts") or [], g.get("children") or [], g.get("vars") or {}
        if isinstance(hosts, dict):  # YAML-like {"host": {...}}
            hosts = list(hosts)
        if not (isinstance(hosts, list) and all(isinstance(h, str) for h in hosts)):
            raise UsageError(f"{source}: group {name!r}: hosts must be a list of host names")
        if not (isinstance(children, list) and all(isinstance(c, str) for c in children)):
            raise UsageError(f"{source}: group {name!r}: children must be a list of group names")
        if not isinstance(gvars, dict):
            raise UsageError(f"{source}: group {name!r}: vars must be an object")
        groups[name] = {"hosts": hosts, "children": children, **({"vars": gvars} if gvars else {})}
    return Inventory(source, groups, hostvars)


def load_inventory(source: str | Path) -> Inventory:
    """An inventory from a file (the JSON of ``ansible-inventory --list``, or anything
    ``ansible-inventory`` reads when it is on PATH) or ``-`` (that JSON on stdin)."""
    src = str(source)
    if src == "-":
        if "doc" not in _stdin_cache:  # stdin can be read once; several Deployments may ask
            text = sys.stdin.read()
            try:
                _stdin_cache["doc"] = json.loads(text)
            except ValueError:
                raise UsageError("--inventory -: stdin is not JSON; pipe the output of "
                                 "`ansible-inventory -i INVENTORY --list` into it, or give the inventory's path"
                                 ) from None
        return parse_inventory_json(_stdin_cache["doc"], "stdin")
    path = Path(os.path.expanduser(src))
    if not path.exists():
        raise UsageError(f"{src}: no such inventory")
    if path.is_file():
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise UsageError(f"{src}: cannot read the inventory: {e.strerror or e}") from None
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            doc = None
        if doc is not None:  # JSON: it must be an ansible-inventory --list document
            return parse_inventory_json(doc, src)
    return parse_inventory_json(convert(path, src), src)


def convert(path: Path, src: str) -> Any:
    """Run ``ansible-inventory -i PATH --list`` (an unparsable inventory is an error, not an empty one)."""
    exe = shutil.which(ANSIBLE_INVENTORY)
    if exe is None:
        raise UsageError(
            f"{src}: not the JSON of `ansible-inventory --list`, and {ANSIBLE_INVENTORY} is not on PATH to convert "
            f"it: install ansible-core (pip install ansible-core), or pass the JSON: "
            f"ansible-inventory -i {src} --list > inventory.json")
    env = {**os.environ, "ANSIBLE_VERBOSITY": "0", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0",
           "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True", "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "True",
           "ANSIBLE_DEPRECATION_WARNINGS": "False", "ANSIBLE_LOCALHOST_WARNING": "False"}
    try:
        p = subprocess.run([exe, "-i", str(path), "--list"], stdin=subprocess.DEVNULL, capture_output=True,
                           env=env, timeout=CONVERT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UsageError(f"{src}: ansible-inventory did not finish within {CONVERT_TIMEOUT_S}s") from None
    except OSError as e:
        raise UsageError(f"{src}: cannot run {exe}: {e.strerror or e}") from None
    if p.returncode != 0:
        lines = [ln.strip() for ln in p.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
        said = next((ln for ln in lines if "ERROR" in ln), lines[-1] if lines else f"exit status {p.returncode}")
        said = said.replace("[ERROR]: ", "").replace("ERROR! ", "")
        why = next((ln for ln in lines if ln.startswith("Failed to parse inventory:")), None)
        raise UsageError(f"{src}: ansible-inventory could not read it: {said}" + (f" ({why})" if why else ""))
    try:
        return json.loads(p.stdout.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise UsageError(f"{src}: ansible-inventory did not print JSON") from None


# --- binding a playbook's hosts ---------------------------------------------------------------

def inventory_source(playbook: Playbook, given: str | None) -> str | None:
    """--inventory, else the playbook's [inventory] file (relative to the playbook's folder)."""
    if given:
        return given
    if playbook.inventory_file:
        p = Path(os.path.expanduser(playbook.inventory_file))
        return str(p if p.is_absolute() else playbook.path.parent / p)
    return None


def bind_inventory(playbook: Playbook, inventory: str | None = None, *, loaded: Inventory | None = None,
                   within: str | None = None) -> Playbook:
    """The playbook with every ``[hosts.NAME]`` that says ``inventory = ...`` (or no ``ssh``) bound
    to its inventory host. ``inventory``: --inventory (beats the playbook's [inventory] file);
    ``loaded``: an inventory already read; ``within``: a replica's group -- a host entry then
    means the one host that is both in its ``inventory = ...`` and in that group."""
    wanted = [h for h in playbook.hosts.values() if h.inventory is not None and not h.ssh]
    if not wanted:
        if inventory:
            log.info("--inventory %s: no [hosts.NAME] of %s uses it (each says ssh = ...)", inventory, playbook.path)
        return playbook
    src = inventory_source(playbook, inventory) if loaded is None else loaded.source
    if src is None:
        h = wanted[0]
        raise PlaybookError(playbook.path, f"hosts.{h.name}",
                            f"has no ssh, and there is no inventory to find {h.inventory!r} in: give ssh = ..., or an "
                            "Ansible inventory with --inventory FILE or [inventory] file = ...")
    inv = loaded if loaded is not None else load_inventory(src)
    cfg = read_ansible_cfg()
    hosts = dict(playbook.hosts)
    for h in wanted:
        key = f"hosts.{h.name}.inventory"
        names = inv.resolve(h.inventory)
        if within is not None:
            names = [n for n in names if n in set(inv.group_hosts(within))]
            if len(names) != 1:
                found = f"{len(names)} ({', '.join(names[:8])})" if names else "none"
                raise PlaybookError(playbook.path, key,
                                    f"replica group {within!r} of {inv.source} must hold exactly one host of "
                                    f"{h.inventory!r}; it holds {found}")
        if not names:
            if h.inventory in inv.groups:
                raise PlaybookError(playbook.path, key, f"group {h.inventory!r} of {inv.source} has no hosts")
            known = sorted(g for g in inv.groups if g != "all") + inv.all_hosts()
            shown = ", ".join(known[:12]) + (f", ... ({len(known)} in all)" if len(known) > 12 else "")
            raise PlaybookError(playbook.path, key, f"{h.inventory!r} is no host or group of {inv.source} "
                                                    f"(it has: {shown or 'nothing'})")
        if len(names) > 1:
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            raise PlaybookError(playbook.path, key,
                                f"group {h.inventory!r} of {inv.source} has {len(names)} hosts ({shown}); a "
                                "[hosts.NAME] entry is one host: name one of them, or a group with exactly one host")
        c = inv.connection(names[0], ansible_cfg=cfg)
        log.debug("hosts.%s: inventory host %s: ssh %s, options %s", h.name, c.name, c.ssh, c.options)
        hosts[h.name] = dataclasses.replace(h, ssh=c.ssh, python=h.python or c.python or "python3",
                                            inventory=h.inventory, ssh_options=c.options)
    return dataclasses.replace(playbook, hosts=hosts)


# --- replicas from inventory groups ---------------------------------------------------------------

_VARIABLE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def replica_playbook(template: Mapping[str, Any], path: Path, inv: Inventory, group: str) -> Playbook:
    """One replica of a fleet described by inventory groups: the template playbook (a parsed TOML
    document) with every ``{{ var }}`` in its strings replaced by the replica's value, its
    deployment named ``<name>-<group>`` (its own lock and journal), and each ``[hosts.NAME]``
    bound to the one host of ``group`` that its ``inventory = ...`` names.

    A variable's value is what every host of the group has for it (group vars, as
    ansible-inventory merges them into each host); a value that differs between the group's hosts,
    is missing, or is itself a template is an error naming it, as is anything but a plain
    ``{{ name }}`` (envbisect renders no Jinja2 filters or expressions and will not guess)."""
    if group not in inv.groups:
        known = ", ".join(sorted(g for g in inv.groups if g not in ("all", "ungrouped"))[:12]) or "none"
        raise UsageError(f"{inv.source}: no group {group!r} for replica {group} (its groups: {known})")
    members = inv.group_hosts(group)
    if not members:
        raise UsageError(f"{inv.source}: replica group {group!r} has no hosts")

    def value_of(name: str, where: str) -> str:
        seen = {h: inv.variables(h).get(name) for h in members}
        missing = [h for h, v in seen.items() if v is None]
        if missing:
            raise PlaybookError(path, where, f"{{{{ {name} }}}}: not set for host {missing[0]} of replica group "
                                             f"{group!r} in {inv.source}")
        values = {json.dumps(v, sort_keys=True) for v in seen.values()}
        if len(values) > 1:
            raise PlaybookError(path, where, f"{{{{ {name} }}}} differs between the hosts of replica group {group!r} "
                                             f"({', '.join(sorted(values))[:200]}): a replica's variable is one value")
        v = next(iter(seen.values()))
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise PlaybookError(path, where, f"{{{{ {name} }}}} is {type(v).__name__} in {inv.source}, "
                                             "not a string or number")
        if isinstance(v, str) and ("{{" in v or "{%" in v):
            raise PlaybookError(path, where,
                                f"{{{{ {name} }}}} = {_short(v)} is still a Jinja2 template in {inv.source}")
        return str(v)

    def render(node: Any, where: str) -> Any:
        if isinstance(node, str):
            out = _VARIABLE.sub(lambda m: value_of(m.group(1), where), node)
            if "{{" in _VARIABLE.sub("", node) or "{%" in node:
                raise PlaybookError(path, where, f"{_short(node)}: only {{{{ variable }}}} is understood here "
                                                 "(no filters or expressions)")
            return out
        if isinstance(node, dict):
            return {k: render(v, f"{where}.{k}" if where else k) for k, v in node.items()}
        if isinstance(node, list):
            return [render(v, f"{where}[{i}]") for i, v in enumerate(node)]
        return node

    from envbisect.inputs.playbook import parse_playbook

    pb = parse_playbook(render(dict(template), ""), path)
    fixed = [h.name for h in pb.hosts.values() if h.ssh]
    if fixed:
        raise PlaybookError(path, f"hosts.{fixed[0]}", "says ssh = ...: in a fleet of inventory groups every host "
                                                       "comes from its replica's group (inventory = \"ROLE\")")
    pb = dataclasses.replace(pb, name=f"{pb.name}-{group}")
    return bind_inventory(pb, loaded=inv, within=group)
