"""SSH round trips and wall time of `snapshot` for 1, 4 and 16 hosts, each a real sshd on 127.0.0.1.

Every host is the reference host of the tests (tests/hosttree.py): 3 serve-env files, 1 deployed
git repo, 20 watched files, behind its own sshd (tests/sshd.py).  Connections are opened outside
the timing (a snapshot reuses the deployment's connections); each figure is the median of
``repeats`` snapshots.  Targets: at most 3 SSH round trips per host per snapshot; 16 hosts take at
most 2x the wall time of one.

All sshd instances and their hosts share this machine's cores, so with 16 hosts the remote side
(16 collectors started at once, 16 sshd processes) competes for the same CPUs as the controller;
the table prints the controller's own CPU time per snapshot too, to tell the two apart.

    python bench/bench_snapshot.py            # 1, 4, 16 hosts
    python bench/bench_snapshot.py --hosts 1,4
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from envbisect.runs.deployment import ConnectOptions, Deployment  # noqa: E402
from envbisect.inputs.playbook import load_playbook  # noqa: E402
from envbisect.state.store import Store  # noqa: E402
from hosttree import make_tree  # noqa: E402
from sshd import start_sshd, write_ssh_config  # noqa: E402

MAX_RT_PER_HOST = 3
MAX_RATIO_16 = 2.0


def machine_busy_s() -> float:
    """CPU-seconds every process on this machine has spent so far (all cores; /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def multi_host_playbook(path: Path, hosts: list[tuple[str, str, object]]) -> Path:
    """A playbook with one node per (name, ssh alias, HostTree): prefill/decode/router on each."""
    lines = ['[deployment]', f'name = "bench-snap-{len(hosts)}"', ""]
    for name, alias, _tree in hosts:
        lines += [f"[hosts.{name}]", f'ssh = "{alias}"', f'python = "{sys.executable}"', ""]
    order = []
    for name, _alias, tree in hosts:
        for i, svc in enumerate(("prefill", "decode", "router")):
            sname = f"{svc}-{name}"
            order.append(sname)
            lines += [f"[services.{sname}]", f'host = "{name}"', f'env_file = "{tree.env(svc)}"', 'start = "true"',
                      'stop = "true"', f'health = "http://127.0.0.1:{i + 1}/health"', ""]
    lines += ["[restart]", "order = [" + ", ".join(f'"{s}"' for s in order) + "]", ""]
    for name, _alias, tree in hosts:
        lines += ["[[repos]]", f'host = "{name}"', f'path = "{tree.repo}"', ""]
    lines += ["[watch.hosts]"] + [f'{name} = ["{tree.watch}"]' for name, _a, tree in hosts] + [""]
    path.write_text("\n".join(lines))
    return path


def measure(host_counts=(1, 4, 16), repeats: int = 5, log=print) -> dict:  # noqa: ANN001
    results = []
    with tempfile.TemporaryDirectory(prefix="envbisect-bench-snap-") as d:
        d = Path(d)
        servers = []
        try:
            top = max(host_counts)
            for i in range(top):
                servers.append(start_sshd(d / f"sshd{i}", alias=f"benchhost{i}"))
            cfg = write_ssh_config(d / "ssh_config", servers)
            trees = [make_tree(d / f"host{i}", n_watched=20) for i in range(top)]
            for count in host_counts:
                hosts = [(f"node{i}", servers[i].alias, trees[i]) for i in range(count)]
                pb = load_playbook(multi_host_playbook(d / f"pb-{count}.toml", hosts))
                walls, cpus, busy, trips = [], [], [], []
                with Deployment(pb, Store(d / f"store-{count}"), ConnectOptions(ssh_config=str(cfg))) as dep:
                    dep.transports  # connect outside the timing
                    dep.snapshot("warm-up", save=False)
                    for r in range(repeats):
                        before = dep.round_trips()
                        b0, c0, t0 = machine_busy_s(), time.process_time(), time.perf_counter()
                        dep.snapshot(f"s{r}")
                        walls.append(time.perf_counter() - t0)
                        cpus.append(time.process_time() - c0)
                        busy.append(machine_busy_s() - b0)
                        after = dep.round_trips()
                        trips.append(max(after[h] - before[h] for h in after))
                row = {"hosts": count, "wall_s": statistics.median(walls), "wall_all_s": walls,
                       "controller_cpu_s": statistics.median(cpus), "machine_cpu_s": statistics.median(busy),
                       "round_trips_per_host": max(trips)}
                results.append(row)
                log(f"  snapshot of {count:>2} host(s): {row['wall_s']:.3f} s, "
                    f"{row['round_trips_per_host']} round trip(s) per host")
        finally:
            for s in servers:
                s.stop()
    one = next((r["wall_s"] for r in results if r["hosts"] == 1), None)
    for r in results:
        r["ratio_to_one"] = r["wall_s"] / one if one else None
    return {"repeats": repeats, "cpus": os.cpu_count(), "rows": results}


def table(res: dict) -> str:
    out = [f"{'hosts':>5} {'RTs/host':>8} {'wall s':>8} {'x 1 host':>8} {'controller CPU s':>16} "
           f"{'machine CPU s':>13} {'cores busy':>10}"]
    for r in res["rows"]:
        ratio = f"{r['ratio_to_one']:.2f}" if r["ratio_to_one"] is not None else "-"
        out.append(f"{r['hosts']:>5} {r['round_trips_per_host']:>8} {r['wall_s']:>8.3f} {ratio:>8} "
                   f"{r['controller_cpu_s']:>16.3f} {r['machine_cpu_s']:>13.2f} "
                   f"{r['machine_cpu_s'] / r['wall_s']:>10.2f}")
    out.append(f"median of {res['repeats']} snapshots; every sshd and host tree on this machine ({res['cpus']} cores); "
               "machine CPU: all processes (sshd, collectors, git, bash, anything else running)")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="1,4,16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = measure(tuple(int(x) for x in args.hosts.split(",")), args.repeats)
    print(json.dumps(res, indent=2) if args.json else table(res))


if __name__ == "__main__":
    main()
