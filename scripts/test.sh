#!/usr/bin/env bash
# Install what the test suite needs (on a fresh Debian machine) and run it.
#   scripts/test.sh [pytest args...]      e.g. scripts/test.sh -k sshd -x
#   scripts/test.sh -m unit               one group of tests (unit, local, sshd, sim: README "Tests")
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

# --- root / sudo -------------------------------------------------------------
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    fi
fi

# --- system packages (only when something is missing) -------------------------
apt_pkgs=()
[ -x /usr/sbin/sshd ] || apt_pkgs+=(openssh-server)
command -v ssh >/dev/null 2>&1 && command -v ssh-keygen >/dev/null 2>&1 || apt_pkgs+=(openssh-client)
command -v git >/dev/null 2>&1 || apt_pkgs+=(git)
command -v python3 >/dev/null 2>&1 || apt_pkgs+=(python3)
if [ ! -x .venv/bin/python ] && ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    apt_pkgs+=(python3-venv)
fi
# >>> chromium (browser tests) — add its check/package here later, e.g.:
# tests/test_bundle.py renders the HTML report in headless Chromium (required when CI is set); plus a
# font so that its screenshots are readable (apt-get runs with --no-install-recommends below)
command -v chromium >/dev/null 2>&1 || apt_pkgs+=(chromium fonts-dejavu-core)
# <<< chromium
# >>> alertmanager (tests/test_watch_sim.py: a real Alertmanager posts its webhook to `watch --listen`)
command -v prometheus-alertmanager >/dev/null 2>&1 || apt_pkgs+=(prometheus-alertmanager)
# <<< alertmanager
# >>> prometheus (metrics/promql probe tests: a real server scrapes the simulated deployment)
command -v prometheus >/dev/null 2>&1 || apt_pkgs+=(prometheus)
# <<< prometheus

if [ "${#apt_pkgs[@]}" -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ] && [ "${#SUDO[@]}" -eq 0 ]; then
        echo "test.sh: need to install ${apt_pkgs[*]} but not root and no sudo" >&2
        exit 1
    fi
    echo "test.sh: installing ${apt_pkgs[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update
    "${SUDO[@]}" apt-get install -y --no-install-recommends "${apt_pkgs[@]}"
fi

# --- Python env ----------------------------------------------------------------
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,sim]'

# >>> sglang wheels (tests/test_sglang_releases.py: the knob reader over the real SGLang releases)
# pip download --no-deps, one release per minor line and the newest 0.5.x; only the files the reader
# needs, cached outside the repo (~/.cache/envbisect/sglang, or ENVBISECT_SGLANG_CACHE): a second run
# downloads nothing. Under this script a release missing from the cache fails its test.
.venv/bin/python scripts/sglang_wheels.py || echo "test.sh: some SGLang releases could not be cached" >&2
export ENVBISECT_REQUIRE_SGLANG=1
# <<< sglang wheels

# --- run -----------------------------------------------------------------------
# The sshd fixtures fail (instead of skipping) when sshd is missing.
export ENVBISECT_REQUIRE_SSHD=1
rc=0
# Every test runs, the fault-injection suite (marker "slow") included, in parallel: the end-to-end
# cases mostly wait (restarts, health checks, simulated hangs timing out), so more workers than
# cores pays; ENVBISECT_TEST_WORKERS overrides (0: no xdist, serial). tests/conftest.py puts the
# longest tests first (tests/durations.json), and the tests are handed out one at a time
# (--maxschedchunk 1), so a worker that finishes takes the next longest and none of the long tests
# starts last. The tests of a file with an expensive module fixture go to one worker together
# (tests/conftest.py's scheduler, SHARED_MODULE_FIXTURES), where the file's first test stands in
# that order (--no-loadscope-reorder).
workers="${ENVBISECT_TEST_WORKERS:-5}"
xdist=(-n "$workers" --dist load --no-loadscope-reorder --maxschedchunk 1)
[ "$workers" = "0" ] && xdist=()
# The whole suite (no arguments): the tests that judge speed (marker "alone", tests/conftest.py) run
# after the others, one at a time, so that no other test's load is in their measurements. With
# arguments, one run as asked.
if [ "$#" -eq 0 ]; then
    .venv/bin/python -m pytest -q -p no:cacheprovider "${xdist[@]}" -m "not alone" || rc=$?
    rc_alone=0
    .venv/bin/python -m pytest -q -p no:cacheprovider -m alone || rc_alone=$?
    if [ "$rc" -eq 5 ] || [ "$rc_alone" -eq 5 ]; then
        echo "test.sh: pytest collected no tests in one of its runs (exit code 5) -- treating as failure" >&2
        exit 1
    fi
    [ "$rc" -ne 0 ] && exit "$rc"
    exit "$rc_alone"
fi
.venv/bin/python -m pytest -q -p no:cacheprovider "${xdist[@]}" "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests (exit code 5) -- treating as failure" >&2
    exit 1
fi
exit "$rc"
