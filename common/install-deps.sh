#!/usr/bin/env bash
# install-deps.sh: install whatever the course needs that this machine lacks.
# Called by `make test`, `make demo` and `make bench` (and `make deps`). On
# Debian/Ubuntu it uses apt-get (through sudo when not root) and says what it
# installs; elsewhere it lists what is missing and stops.
set -euo pipefail

packages=(build-essential libopenblas-dev libopenblas-openmp-dev openmpi-bin libopenmpi-dev
          bats bats-assert bats-support python3-matplotlib)

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
    for p in "${packages[@]}"; do
        status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
        [[ "$status" == "install ok installed" ]] || missing+=("$p")
    done
else
    # Not a Debian system: check for the tools themselves.
    command -v cc >/dev/null || missing+=("a C compiler")
    command -v mpicc >/dev/null || missing+=("OpenMPI (mpicc, mpirun)")
    command -v bats >/dev/null || missing+=("bats with bats-assert and bats-support")
    ls /usr/include/cblas.h /usr/include/*/cblas.h /usr/include/openblas/cblas.h >/dev/null 2>&1 ||
        missing+=("OpenBLAS (cblas.h)")
    if [ ${#missing[@]} -gt 0 ]; then
        echo "install-deps: this is not a Debian/Ubuntu system; please install: ${missing[*]}" >&2
        exit 1
    fi
    exit 0
fi

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all packages present"
    exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        sudo="sudo"
    else
        echo "install-deps: missing ${missing[*]}, and not root without sudo; install them and retry" >&2
        exit 1
    fi
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
