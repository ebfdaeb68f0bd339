"""A snapshot of N hosts is one message per host to its persistent agent (hosts/session.py), every
request sent before any answer is awaited, and the answers read by one thread: no thread per host,
no second parse of an answer. Over real sshds (two servers, several connections to each), with the
agent's own protocol exercised as a host that does not follow it would."""
from __future__ import annotations

import sys
import threading

import pytest

from envbisect.errors import RemoteError
from envbisect.hosts.collector import collect_host, take_snapshot
from envbisect.hosts.agent_calls import run_agent, run_agent_on_each
from envbisect.hosts.transport import SSHTransport, Transport
from envbisect.inputs.playbook import Host, load_playbook
from hosttree import HostTree, make_tree
from sshd import write_ssh_config

N_HOSTS = 5


def playbook_text(hosts: list[tuple[str, str, HostTree]], python: str = sys.executable) -> str:
    """One node per (name, ssh alias, tree): its three services, its repo and its watched folder."""
    lines = ['[deployment]', 'name = "batch"', ""]
    for name, alias, _tree in hosts:
        lines += [f"[hosts.{name}]", f'ssh = "{alias}"', f'python = "{python}"', ""]
    order = []
    for name, _alias, tree in hosts:
        for i, svc in enumerate(("prefill", "decode", "router")):
            order.append(f"{svc}-{name}")
            lines += [f"[services.{svc}-{name}]", f'host = "{name}"', f'env_file = "{tree.env(svc)}"',
                      'start = "true"', 'stop = "true"', f'health = "http://127.0.0.1:{i + 1}/health"', ""]
    lines += ["[restart]", "order = [" + ", ".join(f'"{s}"' for s in order) + "]", ""]
    for name, _alias, tree in hosts:
        lines += ["[[repos]]", f'host = "{name}"', f'path = "{tree.repo}"', ""]
    lines += ["[watch.hosts]"] + [f'{name} = ["{tree.watch}"]' for name, _a, tree in hosts] + [""]
    return "\n".join(lines)


@pytest.fixture
def fleet(sshd, sshd2, tmp_path):
    """N_HOSTS hosts, alternately behind two real sshds, each its own connection, agent and tree."""
    cfg = write_ssh_config(tmp_path / "ssh_config", [sshd, sshd2])
    hosts = [(f"node{i}", (sshd, sshd2)[i % 2].alias, make_tree(tmp_path / f"host{i}", n_watched=6))
             for i in range(N_HOSTS)]
    path = tmp_path / "pb.toml"
    path.write_text(playbook_text(hosts))
    pb = load_playbook(path)
    transports: dict[str, Transport] = {
        name: SSHTransport(Host(name, alias, sys.executable), ssh_config=str(cfg), attempts=1)
        for name, alias, _t in hosts}
    yield pb, transports, cfg
    for t in transports.values():
        t.close()


def test_a_snapshot_of_n_hosts_is_one_round_trip_per_host_and_no_thread_per_host(fleet, monkeypatch):
    pb, transports, _cfg = fleet
    take_snapshot(pb, transports)  # starts the agents and gives them the collector's source
    before = {h: t.round_trips for h, t in transports.items()}
    started: list[threading.Thread] = []
    start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (started.append(self), start(self))[1])
    snap = take_snapshot(pb, transports)
    monkeypatch.undo()
    assert {h: t.round_trips - before[h] for h, t in transports.items()} == {h: 1 for h in transports}
    assert started == [], "a thread was started per host"
    assert all(t._session.started == 1 for t in transports.values())  # one agent per connection
    # the same state a host's own collection finds, for every host
    for h, t in transports.items():
        alone = collect_host(pb, h, t)
        got = snap.hosts[h]
        assert got.files.keys() == alone.files.keys() and len(got.files) >= 3 + 6
        assert {p: f.content for p, f in got.files.items()} == {p: f.content for p, f in alone.files.items()}
        assert {p: r.head for p, r in got.repos.items()} == {p: r.head for p, r in alone.repos.items()}
    # every answer its own host's: each tree's env files are only in its host's state
    for h in transports:
        own = {s.env_file for s in pb.services_on(h)}
        assert own <= snap.hosts[h].files.keys()
        assert not any(own & snap.hosts[o].files.keys() for o in transports if o != h)


def test_a_host_that_fails_is_named_and_the_others_keep_their_agents(fleet, sshd):
    pb, transports, cfg = fleet
    take_snapshot(pb, transports)
    broken = SSHTransport(Host("node3", sshd.alias, "/nonexistent/python3"), ssh_config=str(cfg), attempts=1)
    good = transports["node3"]
    transports["node3"] = broken
    try:
        with pytest.raises(RemoteError, match=r"^node3: snapshot collector failed \(/nonexistent/python3\)"):
            take_snapshot(pb, transports)
    finally:
        transports["node3"] = good
        broken.close()
    snap = take_snapshot(pb, transports)  # the answers the failure left unread do not confuse the next one
    assert set(snap.hosts) == set(transports)
    assert all(t._session.started == 1 for t in transports.values())


def test_answers_read_by_another_caller_reach_theirs(fleet):
    """A request in flight while another thread's request on the same connection is answered (the
    lock's heartbeat during a snapshot): each caller gets its own answer, whoever read it."""
    _pb, transports, _cfg = fleet
    t = transports["node0"]
    slow = t.send_agent_script("slow.py", "import time, sys\ntime.sleep(0.3)\nsys.stdout.write('slow')\n", timeout=30)
    quick = run_agent(t, "hostops.py", {"ops": [{"op": "alive", "pid_files": []}]}, what="host operation")
    assert quick["results"] == [{}]
    assert slow.result().stdout == b"slow"
    assert t._session.started == 1


def test_the_same_requests_on_each_host_at_once(fleet):
    _pb, transports, _cfg = fleet
    script_requests = {h: {"ops": [{"op": "alive", "pid_files": []}]} for h in transports}
    answers = run_agent_on_each(transports, "hostops.py", script_requests, what="host operation")
    assert {h: a["results"] for h, a in answers.items()} == {h: [{}] for h in transports}


# a host that does not follow the protocol: a script that writes into the agent's own answer stream
_PROTO_OUT = ("f = sys._getframe()\nwhile 'proto_out' not in f.f_locals:\n    f = f.f_back\n"
              "out = f.f_locals['proto_out']\n")


@pytest.mark.parametrize("written, error", [
    ("b'{' * (2 << 20)", r"with a header over 64 KiB: refused \(the session is closed\)"),
    ("b'not json\\n'", r"with something that is not its protocol: b'not json': refused"),
    ('b\'{"id": 0, "stdout": %d}\\n\'' % (1 << 40), r"with an answer over 128 MiB: refused"),
    ('b\'{"id": 0, "stdout": -5}\\n\'', r"with something that is not its protocol: b'{\"id\": 0, \"stdout\": -5}'"),
])
def test_an_answer_outside_the_protocol_is_one_clear_error_and_the_next_request_starts_afresh(fleet, written, error):
    _pb, transports, _cfg = fleet
    t = transports["node1"]
    assert t.run_agent_script("ok.py", "print('fine')\n", timeout=30).ok
    script = "import sys\n" + _PROTO_OUT + f"out.write({written})\n"
    with pytest.raises(RemoteError, match="node1: the agent answered bad.py " + error):
        t.run_agent_script("bad.py", script, timeout=30)
    r = t.run_agent_script("ok.py", "print('fine')\n", timeout=30)
    assert r.ok and r.stdout == b"fine\n" and t._session.started == 2


def test_stdin_and_stdout_bytes_pass_unchanged(fleet):
    """Raw in both directions: what a script reads and prints is what was sent and what comes back,
    JSON-looking text and non-ASCII included."""
    _pb, transports, _cfg = fleet
    t = transports["node2"]
    data = '{"a": "\\"quoted\\"\\n", "b": "é ✓"}\n'.encode() * 1000
    r = t.run_agent_script("echo.py", "import sys\nsys.stdout.write(sys.stdin.read())\n", stdin=data, timeout=30)
    assert r.ok and r.stdout == data
