"""SSH round trips and wall time of `snapshot` and `diff` against a real sshd on 127.0.0.1.

The host: 3 serve-env files, 1 deployed git repo, 20 watched files (the issue's reference host).
Target: a snapshot costs at most 3 SSH round trips per host. Prints figures; asserts nothing.

    python bench/bench_snapshot.py
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from envbisect.deployment import ConnectOptions, Deployment  # noqa: E402
from envbisect.playbook import load_playbook  # noqa: E402
from envbisect.store import Store  # noqa: E402
from hosttree import DECODE, make_tree  # noqa: E402
from sshd import start_sshd  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        server = start_sshd(d / "sshd")
        try:
            tree = make_tree(d / "host", n_watched=20)
            pb = load_playbook(tree.playbook(server.alias))
            rows = []
            for via, cfg in (("local", None), ("ssh", str(server.ssh_config))):
                pbx = load_playbook(tree.playbook("local")) if via == "local" else pb
                snaps, diffs = [], []
                trips = {}
                for i in range(5):
                    with Deployment(pbx, Store(d / f"store-{via}"), ConnectOptions(ssh_config=cfg)) as dep:
                        dep.transports  # connect outside the timing
                        t0 = time.perf_counter()
                        dep.snapshot(f"s{i}")
                        snaps.append(time.perf_counter() - t0)
                        trips["snapshot"] = dep.round_trips()["node1"]
                        tree.edit("decode", DECODE + f"export SGLANG_X={i}\n")
                        t0 = time.perf_counter()
                        dep.diff(against=f"s{i}")
                        diffs.append(time.perf_counter() - t0)
                        trips["diff"] = dep.round_trips()["node1"] - trips["snapshot"]
                rows.append((via, trips["snapshot"], trips["diff"], statistics.median(snaps), statistics.median(diffs)))
                tree.edit("decode", DECODE)
        finally:
            server.stop()
    print("host: 3 env files, 1 repo, 20 watched files; median of 5")
    print(f"{'transport':10} {'snapshot RTs':>13} {'diff RTs':>9} {'snapshot s':>11} {'diff s':>8}  target")
    for via, s_rt, d_rt, s_t, d_t in rows:
        ok = "OK" if s_rt <= 3 else "MISS"
        print(f"{via:10} {s_rt:>13} {d_rt:>9} {s_t:>11.3f} {d_t:>8.3f}  <= 3 RTs per snapshot: {ok}")


if __name__ == "__main__":
    main()
