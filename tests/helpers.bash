# helpers.bash: loaded by every .bats file (load helpers).
# Finds bats-support / bats-assert, names the repository's paths, and wraps
# mpirun with the flags a root CI container needs, out of the learner's way.

# library_files LIB: sets library_files to the files LIB/load.bash sources,
# in order, when that is all it does (bats-support's and bats-assert's do
# only that); status 1 when it does anything else.
library_files() {
    local line pattern='^source "\$\(dirname "\$\{BASH_SOURCE\[0\]\}"\)/([^"$`]+)"$'
    library_files=()
    while IFS= read -r line || [ -n "$line" ]; do
        [[ -z "${line// /}" || "$line" == \#* ]] && continue
        [[ "$line" =~ $pattern ]] || return 1
        library_files+=("$1/${BASH_REMATCH[1]}")
    done <"$1/load.bash"
}

# Every test sources this file afresh, and the two load.bash files name each
# of their 15 files through a $(dirname ...) subshell: 20-60 ms a test, 10-30 s
# over the suite. The same files are sourced here without the subshells, in
# the same order; a load.bash that does more is loaded as it is.
for dir in /usr/lib/bats /usr/local/lib/bats /usr/lib/node_modules "${BATS_LIB_PATH:-}"; do
    if [ -f "$dir/bats-support/load.bash" ] && [ -f "$dir/bats-assert/load.bash" ]; then
        for library in "$dir/bats-support" "$dir/bats-assert"; do
            if library_files "$library"; then
                for file in "${library_files[@]}"; do source "$file"; done
            else
                load "$library/load.bash"
            fi
        done
        break
    fi
done
unset -v library file library_files

# The repository root: the nearest directory above this test holding the Makefile.
REPO="$(cd "$BATS_TEST_DIRNAME" && pwd)"
while [ ! -f "$REPO/Makefile" ] && [ "$REPO" != / ]; do REPO="$(dirname "$REPO")"; done
BUILD="$REPO/build"
TRAIN01="$REPO/01_single_gpu/train"
TRAIN02="$REPO/02_data_parallel/train"
TRAIN03="$REPO/03_model_parallel/train"
TRAIN04="$REPO/04_pipeline/train"
TRAIN05="$REPO/05_zero/train"
TRAIN06="$REPO/06_offload/train"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
# spinning OpenMP threads steal the cores that other ranks (and other tests) need
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"

bats_require_minimum_version 1.5.0 # run --separate-stderr

# A sanitized build (make SANITIZE=1) is tested with every report fatal: ASan
# and UBSan stop the program with a non-zero status, LeakSanitizer reports
# leaks at exit except those of the libraries in lsan.supp. The full unwinder
# (fast_unwind_on_malloc=0) follows allocations through Open MPI, which keeps
# no frame pointers, into the library the suppressions name.
if compgen -G "$BUILD/.flavour-*-san" >/dev/null; then
    export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:fast_unwind_on_malloc=0"
    export LSAN_OPTIONS="suppressions=$REPO/tests/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
fi

# Every MPI process start (a rank under mpirun, or a trainer of 02-06 run
# alone) has Open MPI load its PSM and PSM2 transports, for Omni-Path and
# InfiniPath adapters, only to find no such adapter and close them again: a
# quarter of a second, some hundreds of times in the suite. They belong to
# the cm messaging layer, which is chosen only where such an adapter (or
# libfabric's, ofi, which Debian's openmpi-mca-params.conf leaves out) is
# present; the ranks here talk through ob1 and shared memory either way. So
# the tests leave them out, unless told otherwise.
export OMPI_MCA_mtl="${OMPI_MCA_mtl:-^ofi,psm,psm2}"

# mpirun as root in containers needs explicit permission, and more ranks than
# cores needs --oversubscribe.
mpirun_np() {
    local np="$1"
    shift
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        mpirun --oversubscribe -np "$np" "$@"
}

# assert_refusals NP PROGRAM FLAGS: each line of stdin, "ARGS|TEXT", run as
# PROGRAM FLAGS ARGS on NP ranks, exits 2 with one line on stderr starting
# "error:" and holding TEXT; refusals_checked counts the lines run.
assert_refusals() {
    local np="$1" program="$2" flags="$3" bad expected
    refusals_checked=0
    while IFS='|' read -r bad expected; do
        run --separate-stderr bash -c "$(declare -f mpirun_np); OMP_NUM_THREADS=1 mpirun_np $np '$program' $flags $bad" \
            </dev/null # mpirun would read the rest of the list
        refusals_checked=$((refusals_checked + 1))
        assert_equal "$status" 2
        assert_equal "$(printf '%s\n' "$stderr" | grep -c '^error:')" 1
        [[ "$stderr" == *"$expected"* ]] || { echo "$bad: $stderr"; return 1; }
    done
}

# csv_column FILE NAME: column NAME of a CSV file, one value per line (header
# skipped): the scripts' own reader, common/scripts/lib.sh's column (and median).
. "$REPO/common/scripts/lib.sh"
csv_column() { column "$@"; }

# assert_losses_match REF_DIR RUN_DIR STEPS: the run's steps.csv has STEPS
# losses, each within 1e-4 (relative) of the reference run's: the central
# invariant, as the chapters' tests check it.
assert_losses_match() { assert_column_match loss "$@"; }

# assert_column_match COLUMN REF_DIR RUN_DIR STEPS: the same for any column of
# steps.csv (grad_norm: the gradients agree too). STEPS rows, each a pair of
# numbers, or it fails: an empty or missing file is a failure, not a pass.
assert_column_match() {
    local column="$1" ref="$2" run="$3" steps="$4"
    run paste -d, <(csv_column "$ref/steps.csv" "$column") <(csv_column "$run/steps.csv" "$column")
    assert_equal "$(echo "$output" | grep -c '[0-9],[0-9]')" "$steps"
    echo "$output" | awk -F, '{ r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > 1e-4) { print "step " NR ": " $0; bad = 1 } }
                              END { exit bad }'
}

# assert_losses_within REF_DIR RUN_DIR STEPS TOL: the same with a relative
# tolerance of TOL (16-bit runs against 01 in the same precision: 1e-2), the
# worst difference printed.
assert_losses_within() {
    local ref="$1" run="$2" steps="$3" tol="$4"
    run paste -d, <(csv_column "$ref/steps.csv" loss) <(csv_column "$run/steps.csv" loss)
    assert_equal "$(echo "$output" | grep -c '[0-9],[0-9]')" "$steps"
    echo "$output" | awk -F, -v tol="$tol" '{ r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > worst) worst = r
                                               if (r > tol) { print "step " NR ": " $0; bad = 1 } }
                                             END { print "worst relative difference " worst; exit bad }'
}

# The Python that has matplotlib (Debian's python3-matplotlib lives in
# /usr/bin/python3); plain python3 when none has it.
plot_python() {
    local candidate
    for candidate in python3 /usr/bin/python3; do
        if "$candidate" -c 'import matplotlib' 2>/dev/null; then
            echo "$candidate"
            return
        fi
    done
    echo python3
}

# A scratch directory per test, removed by bats.
scratch() { echo "$BATS_TEST_TMPDIR"; }

# Skip (or, under `make test-gpu`, fail) when no GPU is usable.
require_gpu() {
    if ! "$BUILD/tests/gpu_probe" >/dev/null 2>&1; then
        if [ -n "${REQUIRE_GPU:-}" ]; then
            echo "no usable GPU (make test-gpu requires one)" >&2
            return 1
        fi
        skip "no GPU visible"
    fi
}
