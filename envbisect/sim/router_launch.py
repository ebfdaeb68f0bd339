"""Start the real sglang-router (its Rust core, through its own Python API) with the arguments its
`sglang-router launch` command takes, and nothing else.

The package's CLI imports its Python debugging balancer (`mini_lb`, FastAPI) on every launch, 0.6 s
of CPU before the router binds; a simulated deployment co-restarts its router hundreds of times, on
a 2-core machine. This launcher is what `sglang_router.launch_router` does for the Rust router:
the same argument parser (`RouterArgs.add_cli_args`), validation, process title and start.
`build(..., router_cli=True)` (or SIM_ROUTER_CLI=1) starts the router through the package's CLI
instead.

usage: python router_launch.py launch [ROUTER ARGS]
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> None:
    import setproctitle
    from sglang_router.router import Router
    from sglang_router.router_args import RouterArgs

    if argv[:1] == ["launch"]:
        argv = argv[1:]
    parser = argparse.ArgumentParser(prog="sglang-router launch")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    args = RouterArgs.from_cli_args(parser.parse_args(argv), use_router_prefix=False)
    setproctitle.setproctitle("sglang::router")
    args._validate_router_args()
    Router.from_args(args).start()


if __name__ == "__main__":
    main(sys.argv[1:])
