#!/usr/bin/env bats
# build.bats: the flavours of the build. The suite runs on the default build
# (CUDA when nvcc is found); a learner without the CUDA toolkit gets the
# CPU-only flavour, whose sources (#ifdef USE_CUDA left out) must compile with
# -Werror too. Compiled into a scratch build directory, so the programs the
# other tests run are untouched.

load ../helpers

@test "the CPU-only flavour (make CUDA=0) compiles with -Werror, as on a machine without CUDA" {
    build="$(scratch)/cpu"
    targets=("$build/libcommon.a")
    for source in "$REPO"/0[1-6]_*/*.c "$REPO"/tests/*.c; do
        [ -f "$source" ] || continue
        relative="${source#"$REPO"/}"
        targets+=("$build/${relative%.c}.o")
    done
    # SANITIZE= : the plain flavour a learner gets, also under `make SANITIZE=1 test`
    run make --no-print-directory -C "$REPO" CUDA=0 SANITIZE= BUILD="$build" -j2 "${targets[@]}"
    assert_success
    refute_output --partial -- "-DUSE_CUDA" # no source was compiled for the CUDA backend
    [ -f "$build/.flavour-cpu" ]
}
