#!/usr/bin/env bash
# install-deps.sh: install whatever the course needs that this machine lacks.
# Called by `make test`, `make demo` and `make bench` (and `make deps`).
#
# It checks the tools themselves, not package names, so MPI, OpenBLAS or Bats
# from an HPC module, a conda environment or another distribution count as
# present: a C compiler, mpicc (compiling an MPI program) and mpirun, bats with
# bats-support and bats-assert where tests/helpers.bash looks for them,
# cblas.h with an OpenBLAS to link (a tiny program is compiled and linked, as
# the Makefile would), and a python3 that imports matplotlib. Only what is
# missing is installed, with apt-get on Debian/Ubuntu (through sudo when not
# root); elsewhere it lists what is missing and stops.
set -euo pipefail

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cc="${CC:-cc}"
command -v "$cc" >/dev/null 2>&1 || cc=gcc

have_compiler() { command -v "$cc" >/dev/null 2>&1 && command -v make >/dev/null 2>&1; }

# compiles COMPILER FLAGS...: the C program on stdin compiles and links.
compiles() {
    local compiler="$1"
    shift
    cat >"$scratch/probe.c"
    "$compiler" "$scratch/probe.c" -o "$scratch/probe" "$@" >"$scratch/probe.log" 2>&1
}

have_mpicc() {
    command -v mpicc >/dev/null 2>&1 &&
        { ! have_compiler || compiles mpicc <<<'#include <mpi.h>
int main(int c, char **v) { MPI_Init(&c, &v); MPI_Finalize(); return 0; }'; }
}
have_mpirun() { command -v mpirun >/dev/null 2>&1; }

have_bats() { command -v bats >/dev/null 2>&1; }
# bats_library NAME: NAME/load.bash in one of the places tests/helpers.bash searches.
bats_library() {
    local dir
    for dir in /usr/lib/bats /usr/local/lib/bats /usr/lib/node_modules "${BATS_LIB_PATH:-}"; do
        [ -n "$dir" ] && [ -f "$dir/$1/load.bash" ] && return 0
    done
    return 1
}
have_bats_support() { bats_library bats-support; }
have_bats_assert() { bats_library bats-assert; }

have_openblas() {
    if have_compiler; then
        # The Makefile links -lopenblas, preferring Debian's OpenMP build.
        local dir
        dir="/usr/lib/$("$cc" -print-multiarch 2>/dev/null)/openblas-openmp"
        local flags=(-lopenblas -lm)
        [ -d "$dir" ] && flags=(-L"$dir" "${flags[@]}")
        compiles "$cc" "${flags[@]}" <<<'#include <cblas.h>
int main(void) { float a = 1, b = 2, c = 0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1);
    return c == 2 ? 0 : 1; }'
    else
        # No compiler to try it with: look for the header and the library.
        ls /usr/include/cblas.h /usr/include/*/cblas.h /usr/include/openblas/cblas.h >/dev/null 2>&1 &&
            ldconfig -p 2>/dev/null | grep -q 'libopenblas\.so'
    fi
}

have_matplotlib() {
    local python
    for python in python3 /usr/bin/python3; do
        "$python" -c "import matplotlib" >/dev/null 2>&1 && return 0
    done
    return 1
}

# Each requirement: the check, what it is, and the Debian packages that provide it.
requirements=(
    "have_compiler|a C compiler and make|build-essential"
    "have_mpicc|mpicc that compiles an MPI program (OpenMPI)|openmpi-bin libopenmpi-dev"
    "have_mpirun|mpirun (OpenMPI)|openmpi-bin"
    "have_openblas|cblas.h and an OpenBLAS library to link|libopenblas-dev libopenblas-openmp-dev"
    "have_bats|bats|bats"
    "have_bats_support|bats-support (in /usr/lib/bats, /usr/local/lib/bats or \$BATS_LIB_PATH)|bats-support"
    "have_bats_assert|bats-assert (in /usr/lib/bats, /usr/local/lib/bats or \$BATS_LIB_PATH)|bats-assert"
    "have_matplotlib|python3 with matplotlib|python3-matplotlib"
)

# check: fill missing_what and missing_packages (each package once).
check() {
    missing_what=()
    missing_packages=()
    local entry check what packages p
    for entry in "${requirements[@]}"; do
        IFS='|' read -r check what packages <<<"$entry"
        "$check" && continue
        missing_what+=("$what")
        for p in $packages; do
            [[ " ${missing_packages[*]} " == *" $p "* ]] || missing_packages+=("$p")
        done
    done
}

check
if [ ${#missing_what[@]} -eq 0 ]; then
    echo "install-deps: everything the course needs is present"
    exit 0
fi
printf 'install-deps: missing: %s\n' "${missing_what[@]}"

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: this is not a Debian/Ubuntu system (no apt-get); install the above and retry" >&2
    exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        sudo="sudo"
    else
        echo "install-deps: not root and no sudo; install the above (Debian packages:" \
            "${missing_packages[*]}) and retry" >&2
        exit 1
    fi
fi
echo "install-deps: installing ${missing_packages[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq || { echo "install-deps: apt-get update failed" >&2; exit 1; }
$sudo apt-get install -y -qq --no-install-recommends "${missing_packages[@]}" ||
    { echo "install-deps: apt-get install ${missing_packages[*]} failed" >&2; exit 1; }

check
if [ ${#missing_what[@]} -gt 0 ]; then
    printf 'install-deps: still missing after apt-get: %s\n' "${missing_what[@]}" >&2
    exit 1
fi
echo "install-deps: done"
