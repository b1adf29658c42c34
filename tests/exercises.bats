#!/usr/bin/env bats
# The exercise round trip: `make exercises` writes a student copy with the
# marked solutions stubbed out (the CUDA twins too), as a git repository; in
# it exactly the stubbed exercises' graders fail, and those that stop at
# another exercise's stub say so; putting the reference back makes them pass.

load helpers

# Every grader's id (tests/grade/ID.bats), and the points they are worth in all.
grader_ids() { for g in "$REPO"/tests/grade/*.bats; do basename "$g" .bats; done; }
total_points() { awk -F': *' '/^# points:/ { s += $2 } END { print s }' "$REPO"/tests/grade/*.bats; }
points_of() { awk -F': *' '/^# points:/ { print $2 }' "$REPO/tests/grade/$1.bats"; }

# Two student copies, built once for the whole file (CPU only, to keep it quick):
#   all/   every exercise stubbed
#   one/   only 02.1 (the ring all-reduce) stubbed
setup_file() {
    export COPIES="$BATS_FILE_TMPDIR"
    make -C "$REPO" --no-print-directory exercises DEST="$COPIES/all" >/dev/null
    make -C "$REPO" --no-print-directory exercises DEST="$COPIES/one" ONLY=02.1 >/dev/null
    for copy in all one; do
        make -C "$COPIES/$copy" --no-print-directory -j2 CUDA=0 OPT=-O1 all >"$COPIES/$copy.build.log" 2>&1 ||
            { cat "$COPIES/$copy.build.log" >&3; return 1; }
    done
}

@test "the reference solution gets full marks" {
    run "$REPO/common/grade.sh"
    assert_success
    assert_output --regexp "total +$(total_points)/$(total_points)"
}

@test "a student copy replaces every marked solution by a stub" {
    # one stubbed exercise per grader
    assert_equal "$(cat "$COPIES/all/.student" | tr '\n' ' ')" "$(grader_ids | tr '\n' ' ')"
    assert_equal "$(head -5 "$COPIES/all/.student" | tr '\n' ' ')" "01.1 01.2 01.3 02.1 02.2 "
    grep -q '^03\.1$' "$COPIES/all/.student" && grep -q '^03\.2$' "$COPIES/all/.student"
    grep -q '^05\.1$' "$COPIES/all/.student" && grep -q '^05\.3$' "$COPIES/all/.student"
    run grep -c 'exercise_not_implemented("0[1235]\.[123]"' "$COPIES/all/common/kernels_cpu.c" \
        "$COPIES/all/common/model.c" "$COPIES/all/common/ring.c" "$COPIES/all/02_data_parallel/buckets.c" \
        "$COPIES/all/03_model_parallel/tensor_parallel.c" "$COPIES/all/common/param_table.c" \
        "$COPIES/all/05_zero/zero.c"
    assert_output --partial "kernels_cpu.c:2"
    assert_output --partial "model.c:1"
    assert_output --partial "ring.c:1"
    assert_output --partial "buckets.c:1"
    assert_output --partial "tensor_parallel.c:4"
    assert_output --partial "param_table.c:3"
    assert_output --partial "zero.c:3" # 05.2 queues the reduce-scatter and adds its slice; 05.3
    # 06.2: the thread's start and join in offload.c, the schedule in 06's train.c
    run grep -c 'exercise_not_implemented("06\.2"' "$COPIES/all/06_offload/offload.c" "$COPIES/all/06_offload/train.c"
    assert_output --partial "offload.c:2"
    assert_output --partial "train.c:1"
    # the solutions themselves are gone
    run grep -c "sqrtf(vhat)" "$COPIES/all/common/kernels_cpu.c"
    assert_output "0"
    run grep -c "EXERCISE 01.1 END" "$COPIES/all/common/kernels_cpu.c"
    assert_output "0"
}

@test "a student copy stubs the CUDA twins of exercises 01.1 and 01.2 too" {
    cuda="$COPIES/all/common/kernels_cuda.cu"
    run grep -c 'exercise_not_implemented("01\.[12]"' "$cuda"
    assert_output "2"
    # the kernels and their launches are gone; the comment left in their place says what goes there
    run grep -cE "layernorm_backward_dinp_kernel|adamw_update_kernel|sqrtf\(vhat\)|mean_dxhat_xhat" "$cuda"
    assert_output "0"
    run grep -cE "EXERCISE 01\.[12] (BEGIN|END)" "$cuda"
    assert_output "0"
    grep -q "^/\* EXERCISE 01.1: layernorm backward. Your kernels and helpers go here" "$cuda"
    grep -q "^/\* EXERCISE 01.2: the AdamW update. Your kernels and helpers go here" "$cuda"
}

@test "the stubbed CUDA backend of a student copy compiles with nvcc (no GPU needed)" {
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    [ -x "$nvcc" ] || skip "nvcc not found"
    # a build directory of its own, so the CPU-only build of the copy stays as it is
    run make -C "$COPIES/all" --no-print-directory CUDA=1 NVCC_ARCHS=90 BUILD="$BATS_TEST_TMPDIR/cuda" \
        "$BATS_TEST_TMPDIR/cuda/common/kernels_cuda.cu.o"
    assert_success
}

@test "a student copy is a git repository with one commit and nothing to commit, even after building" {
    run git -C "$COPIES/all" log --format=%s
    assert_success
    assert_output "Student copy: exercises stubbed out"
    run git -C "$COPIES/all" status --porcelain
    assert_success
    assert_output ""
}

@test "git diff in a student copy shows the learner's work" {
    make -C "$REPO" --no-print-directory exercises DEST="$BATS_TEST_TMPDIR/copy" ONLY=04.1 >/dev/null
    cp "$REPO/04_pipeline/schedule.c" "$BATS_TEST_TMPDIR/copy/04_pipeline/schedule.c"
    run git -C "$BATS_TEST_TMPDIR/copy" diff --name-only
    assert_output "04_pipeline/schedule.c"
}

@test "a stub fails clearly at run time, naming the exercise and where to read" {
    run --separate-stderr "$COPIES/all/build/tests/test_kernels" adamw
    assert_failure
    [[ "$stderr" == *"exercise 01.2 not implemented: see course.md, exercise 01.2"* ]]
}

@test "with every exercise stubbed, every grader fails and the score is 0" {
    run "$COPIES/all/common/grade.sh"
    assert_failure
    for id in $(grader_ids); do
        assert_output --regexp "${id/./\\.} .* FAIL"
    done
    assert_output --regexp "total +0/$(total_points)"
}

@test "with only 02.1 stubbed, exactly its grader fails" {
    run "$COPIES/one/common/grade.sh"
    assert_failure
    for id in $(grader_ids); do
        if [ "$id" = 02.1 ]; then
            assert_output --regexp '02\.1 .* FAIL'
        else
            assert_output --regexp "${id/./\\.} .* pass"
        fi
    done
    assert_output --regexp "total +$(($(total_points) - $(points_of 02.1)))/$(total_points)"
}

@test "with only 01.2 stubbed, the graders that run the trainers say they depend on 01.2" {
    # 02.2, 04.2, 05.2 and 05.3 grade whole training runs, whose optimizer step is 01.2's AdamW
    make -C "$REPO" --no-print-directory exercises DEST="$BATS_TEST_TMPDIR/adamw" ONLY=01.2 >/dev/null
    cp "$BATS_TEST_TMPDIR/adamw/common/kernels_cpu.c" "$COPIES/one/common/kernels_cpu.c"
    cp "$REPO/common/ring.c" "$COPIES/one/common/ring.c"
    make -C "$COPIES/one" --no-print-directory -j2 CUDA=0 OPT=-O1 all >/dev/null 2>&1
    run "$COPIES/one/common/grade.sh"
    cp "$REPO/common/kernels_cpu.c" "$COPIES/one/common/kernels_cpu.c" # the reference, for the next tests
    assert_failure
    for id in $(grader_ids); do
        case $id in
        01.2) assert_output --regexp '01\.2 .* FAIL \(see runs/grade/01\.2\.log\)' ;;
        02.2 | 04.2 | 05.2 | 05.3) assert_output --regexp "${id/./\\.} .* FAIL \(depends on 01\.2, not implemented yet" ;;
        *) assert_output --regexp "${id/./\\.} .* pass" ;;
        esac
    done
    lost=$(($(points_of 01.2) + $(points_of 02.2) + $(points_of 04.2) + $(points_of 05.2) + $(points_of 05.3)))
    assert_output --regexp "total +$(($(total_points) - lost))/$(total_points)"
    assert_output --partial 'stopped at another exercise'"'"'s stub: do that exercise first'
}

@test "filling the stub back in with the reference makes its grader pass" {
    cp "$REPO/common/ring.c" "$COPIES/one/common/ring.c"
    make -C "$COPIES/one" --no-print-directory -j2 CUDA=0 OPT=-O1 all >/dev/null 2>&1
    run "$COPIES/one/common/grade.sh"
    assert_success
    assert_output --regexp "total +$(total_points)/$(total_points)"
}

@test "a plausible wrong answer fails its grader: Adam without bias correction" {
    cp "$REPO/common/kernels_cpu.c" "$COPIES/one/common/kernels_cpu.c"
    sed -i 's|float mhat = mi / bias1, vhat = vi / bias2;|float mhat = mi, vhat = vi;|' \
        "$COPIES/one/common/kernels_cpu.c"
    grep -q "float mhat = mi, vhat = vi;" "$COPIES/one/common/kernels_cpu.c"
    make -C "$COPIES/one" --no-print-directory -j2 CUDA=0 OPT=-O1 all >/dev/null 2>&1
    run "$COPIES/one/common/grade.sh"
    assert_failure
    assert_output --regexp '01\.2 .* FAIL'
}

@test "a plausible wrong answer fails its grader: a loss-scale count that an overflow does not restart" {
    # the first "clean_steps = 0" is the overflow branch's
    sed -i '0,/ls->clean_steps = 0;/{/ls->clean_steps = 0;/d}' "$COPIES/one/common/mixed.c"
    [ "$(grep -c 'ls->clean_steps = 0;' "$COPIES/one/common/mixed.c")" = 1 ]
    make -C "$COPIES/one" --no-print-directory -j2 CUDA=0 OPT=-O1 all >/dev/null 2>&1
    run "$COPIES/one/common/grade.sh"
    assert_failure
    assert_output --regexp '05\.4 .* FAIL \(see'
}

@test "make exercises refuses an unknown exercise and a non-empty destination" {
    run make -C "$REPO" --no-print-directory exercises DEST="$BATS_TEST_TMPDIR/x" ONLY=09.9
    assert_failure
    assert_output --partial "unknown exercise(s) 09.9"
    mkdir -p "$BATS_TEST_TMPDIR/full" && touch "$BATS_TEST_TMPDIR/full/file"
    run make -C "$REPO" --no-print-directory exercises DEST="$BATS_TEST_TMPDIR/full"
    assert_failure
    assert_output --partial "is not an empty directory"
}
