#!/usr/bin/env bash
# Set up the environment (if needed) and run the envbisect demo.
#   scripts/demo.sh [envbisect demo args...]
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

SUDO=()
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
fi

apt_pkgs=()
command -v git >/dev/null 2>&1 || apt_pkgs+=(git)
command -v python3 >/dev/null 2>&1 || apt_pkgs+=(python3)
if [ ! -x .venv/bin/python ] && ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    apt_pkgs+=(python3-venv)
fi
if [ "${#apt_pkgs[@]}" -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ] && [ "${#SUDO[@]}" -eq 0 ]; then
        echo "demo.sh: need to install ${apt_pkgs[*]} but not root and no sudo" >&2
        exit 1
    fi
    echo "demo.sh: installing ${apt_pkgs[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update
    "${SUDO[@]}" apt-get install -y --no-install-recommends "${apt_pkgs[@]}"
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,sim]'

# the simulated engines carry the real files of one pinned SGLang release (envbisect/sim/installed.py), as a
# user's host does: cached outside the repo on the first run; without it the demo still runs, and its diff
# says that no sglang package was found
.venv/bin/python -c 'from envbisect.sim import sglang_release as r; r.fetch(r.SIM_RELEASE)' \
    || echo "demo.sh: the pinned SGLang release could not be cached" >&2

exec .venv/bin/envbisect demo "$@"
