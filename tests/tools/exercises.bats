#!/usr/bin/env bats
# The exercise round trip: `make exercises` writes a student copy with the
# marked solutions stubbed out (the CUDA twins too), as a git repository; in
# it exactly the stubbed exercises' graders fail, and those that stop at
# another exercise's stub say so; putting the reference back makes them pass;
# no other copy of an answer survives in the copy (the leak tests); and
# course.md's dependency lines are the measured ones. This file spells out
# reference lines to break them, so it stays out of student copies
# (exercises.py, FULL_COPY_ONLY).

load ../helpers

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
    run "$REPO/common/scripts/grade.sh"
    assert_success
    assert_output --regexp "total +$(total_points)/$(total_points)"
}

@test "a student copy replaces every marked solution by a stub" {
    # one stubbed exercise per grader
    assert_equal "$(cat "$COPIES/all/.student" | tr '\n' ' ')" "$(grader_ids | tr '\n' ' ')"
    assert_equal "$(head -6 "$COPIES/all/.student" | tr '\n' ' ')" "01.1 01.2 01.3 01.4 02.1 02.2 "
    grep -q '^03\.1$' "$COPIES/all/.student" && grep -q '^03\.2$' "$COPIES/all/.student"
    grep -q '^05\.1$' "$COPIES/all/.student" && grep -q '^05\.3$' "$COPIES/all/.student"
    run grep -c 'exercise_not_implemented("0[1235]\.[123]"' "$COPIES/all/common/kernels/kernels_cpu.c" \
        "$COPIES/all/common/model/model.c" "$COPIES/all/02_data_parallel/ring.c" "$COPIES/all/02_data_parallel/buckets.c" \
        "$COPIES/all/03_model_parallel/tensor_parallel.c" "$COPIES/all/common/model/param_table.c" \
        "$COPIES/all/05_zero/zero.c"
    assert_output --partial "kernels_cpu.c:1"
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
    # 01.2: every AdamW of the course calls kernel_math.h's adamw_element, which is the stub
    run grep -c 'exercise_not_implemented("01\.2"' "$COPIES/all/common/kernels/kernel_math.h"
    assert_output "1"
    # the solutions themselves are gone
    run grep -c "sqrtf(vhat)" "$COPIES/all/common/kernels/kernels_cpu.c" "$COPIES/all/common/kernels/kernel_math.h"
    assert_output --partial "kernels_cpu.c:0"
    assert_output --partial "kernel_math.h:0"
    run grep -c "EXERCISE 01.1 END" "$COPIES/all/common/kernels/kernels_cpu.c"
    assert_output "0"
}

@test "a student copy stubs the CUDA twin of exercise 01.1 too, and 01.2's kernel calls the learner's element" {
    cuda="$COPIES/all/common/kernels/kernels_cuda.cu"
    run grep -c 'exercise_not_implemented("01\.1"' "$cuda"
    assert_output "1"
    # the kernels and their launches are gone; the comment left in their place says what goes there
    run grep -cE "layernorm_backward_dinp_kernel|sqrtf\(vhat\)|mean_dxhat_xhat" "$cuda"
    assert_output "0"
    run grep -cE "EXERCISE 01\.[12] (BEGIN|END)" "$cuda"
    assert_output "0"
    grep -q "^/\* EXERCISE 01.1: layernorm backward. Your kernels and helpers go here" "$cuda"
    # one AdamW element for both backends: the GPU's kernel runs the learner's adamw_element
    grep -q "adamw_element(&params\[i\]" "$cuda"
}

@test "the stubbed CUDA backend of a student copy compiles with nvcc (no GPU needed)" {
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    [ -x "$nvcc" ] || skip "nvcc not found"
    # a build directory of its own, so the CPU-only build of the copy stays as it is
    run make -C "$COPIES/all" --no-print-directory -j2 CUDA=1 NVCC_ARCHS=90 BUILD="$BATS_TEST_TMPDIR/cuda" \
        "$BATS_TEST_TMPDIR/cuda/common/kernels/kernels_cuda.cu.o" "$BATS_TEST_TMPDIR/cuda/common/kernels/attention_cuda.cu.o"
    assert_success
}

@test "the first make grade after make compiles nothing: it grades the build make made" {
    # make's intermediates (the test programs' objects) deleted after the first build were compiled again
    run make -C "$COPIES/all" --no-print-directory -n CUDA=0 OPT=-O1 grade
    assert_success
    assert_output --partial "common/scripts/grade.sh"
    refute_output --regexp "(^| )-(c|o) "
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

@test "with every exercise stubbed, every grader fails at a stub and the score is 0" {
    run "$COPIES/all/common/scripts/grade.sh"
    assert_failure
    # each row: its own stub ("not implemented"), or another's with every exercise it needs
    # (course.md's dependency lines); no crash, no other failure
    for id in $(grader_ids); do
        needs=$(sed -n "s/^- ${id/./\\.}: do \(.*\) first (its grader.*/\1/p" "$REPO/course.md" |
            grep -oE '[0-9]+\.[0-9]+' | paste -sd, - | sed 's/,/, /g')
        if [ -n "$needs" ]; then
            assert_output --regexp "${id/./\\.} .* FAIL \(depends on ${needs//./\\.}; stopped at [0-9., ]+, not implemented yet"
        else
            assert_output --regexp "${id/./\\.} .* not implemented \(see runs/grade/${id/./\\.}\.log\)"
        fi
    done
    refute_output --partial "FAIL (see"
    assert_output --regexp "total +0/$(total_points)"
}

@test "a stub reached by every thread of an OpenMP loop ends the program once, with its message" {
    # 01.2's AdamW and 03.3's merge run in OpenMP loops: every thread reaches the stub together
    for i in $(seq 20); do
        for kernel in adamw ring_attention; do
            run --separate-stderr env OMP_NUM_THREADS=16 "$COPIES/all/build/tests/test_kernels" "$kernel"
            assert_equal "$status" 1
            assert_equal "$(grep -c 'not implemented' <<<"$stderr")" 1
        done
    done
}

@test "with only 02.1 stubbed, exactly its grader fails" {
    run "$COPIES/one/common/scripts/grade.sh"
    assert_failure
    for id in $(grader_ids); do
        if [ "$id" = 02.1 ]; then
            assert_output --regexp '02\.1 .* not implemented \(see'
        else
            assert_output --regexp "${id/./\\.} .* pass"
        fi
    done
    assert_output --regexp "total +$(($(total_points) - $(points_of 02.1)))/$(total_points)"
}

@test "with only 01.2 stubbed, the graders whose runs reach an AdamW say they depend on 01.2" {
    # 02.2, 04.2, 04.3, 05.2 and 05.3 grade whole training runs, whose optimizer step is 01.2's AdamW;
    # 06.1 compares with the host AdamW's scalar path and 06.2's trainer ends each chunk with it
    # (adamw_element, both): on a CPU without AVX2, 06.1's grader skips
    make -C "$REPO" --no-print-directory exercises DEST="$BATS_TEST_TMPDIR/adamw" ONLY=01.2 >/dev/null
    cp "$BATS_TEST_TMPDIR/adamw/common/kernels/kernel_math.h" "$COPIES/one/common/kernels/kernel_math.h"
    cp "$REPO/02_data_parallel/ring.c" "$COPIES/one/02_data_parallel/ring.c"
    make -C "$COPIES/one" --no-print-directory -j2 CUDA=0 OPT=-O1 all >/dev/null 2>&1
    run "$COPIES/one/common/scripts/grade.sh"
    cp "$REPO/common/kernels/kernel_math.h" "$COPIES/one/common/kernels/kernel_math.h" # the reference, for the next tests
    assert_failure
    avx2=06.1
    "$COPIES/one/build/tests/test_cpu_adam" path | grep -q '^supported.* avx2' || avx2=
    lost=0
    for id in $(grader_ids); do
        case " 02.2 04.2 04.3 05.2 05.3 $avx2 06.2 " in
        *" $id "*)
            assert_output --regexp "${id/./\\.} .* FAIL \(depends on [0-9., ]*01\.2[0-9., ]*; stopped at 01\.2, not implemented yet"
            lost=$((lost + $(points_of $id)))
            ;;
        *)
            if [ "$id" = 01.2 ]; then
                assert_output --regexp '01\.2 .* not implemented \(see runs/grade/01\.2\.log\)'
                lost=$((lost + $(points_of $id)))
            else
                assert_output --regexp "${id/./\\.} .* pass"
            fi
            ;;
        esac
    done
    assert_output --regexp "total +$(($(total_points) - lost))/$(total_points)"
    assert_output --partial 'stopped at another exercise'"'"'s stub: do that exercise first'
}

@test "filling the stub back in with the reference makes its grader pass" {
    cp "$REPO/02_data_parallel/ring.c" "$COPIES/one/02_data_parallel/ring.c"
    make -C "$COPIES/one" --no-print-directory -j2 CUDA=0 OPT=-O1 all >/dev/null 2>&1
    # its grader alone: that the others pass in this copy is the test of 02.1 stubbed above,
    # and that the whole reference gets full marks the first test's
    run "$COPIES/one/common/scripts/grade.sh" 02.1
    assert_success
    assert_output --regexp '02\.1 .* pass'
    assert_output --regexp "total +$(points_of 02.1)/$(points_of 02.1)"
}

@test "a plausible wrong answer fails its grader: Adam without bias correction" {
    # (this file stays out of student copies: exercises.py, FULL_COPY_ONLY)
    sed -i 's|float mhat = mi / bias1, vhat = vi / bias2;|float mhat = mi, vhat = vi;|' \
        "$COPIES/one/common/kernels/kernel_math.h"
    grep -q "float mhat = mi, vhat = vi;" "$COPIES/one/common/kernels/kernel_math.h"
    make -C "$COPIES/one" --no-print-directory -j2 CUDA=0 OPT=-O1 build/tests/test_kernels >/dev/null 2>&1
    run "$COPIES/one/common/scripts/grade.sh" 01.2 # its grader alone: the others are not the point here
    cp "$REPO/common/kernels/kernel_math.h" "$COPIES/one/common/kernels/kernel_math.h"
    assert_failure
    assert_output --regexp '01\.2 .* FAIL'
}

@test "a plausible wrong answer fails its grader: 03.4's target logit not shifted by the row's maximum" {
    sed -i 's|sums\[N + n\] = target >= 0 \&\& target < cols ? z\[target\] - maxval : 0.0f;|sums[N + n] = target >= 0 \&\& target < cols ? z[target] : 0.0f;|' \
        "$COPIES/one/common/kernels/kernels_cpu.c"
    grep -q "target < cols ? z\[target\] : 0.0f;" "$COPIES/one/common/kernels/kernels_cpu.c"
    make -C "$COPIES/one" --no-print-directory -j2 CUDA=0 OPT=-O1 build/tests/test_kernels >/dev/null 2>&1
    run "$COPIES/one/common/scripts/grade.sh" 03.4
    cp "$REPO/common/kernels/kernels_cpu.c" "$COPIES/one/common/kernels/kernels_cpu.c"
    make -C "$COPIES/one" --no-print-directory -j2 CUDA=0 OPT=-O1 build/tests/test_kernels >/dev/null 2>&1
    assert_failure
    assert_output --regexp '03\.4 .* FAIL'
}

@test "a plausible wrong answer fails its grader: a loss-scale count that an overflow does not restart" {
    # the first "clean_steps = 0" is the overflow branch's
    sed -i '0,/ls->clean_steps = 0;/{/ls->clean_steps = 0;/d}' "$COPIES/one/common/model/mixed.c"
    [ "$(grep -c 'ls->clean_steps = 0;' "$COPIES/one/common/model/mixed.c")" = 1 ]
    make -C "$COPIES/one" --no-print-directory -j2 CUDA=0 OPT=-O1 build/tests/test_kernels >/dev/null 2>&1
    run "$COPIES/one/common/scripts/grade.sh" 05.4
    assert_failure
    assert_output --regexp '05\.4 .* FAIL \(see'
}

# Grader ID run on the copy with one line of a reference file replaced:
# ID TARGET FILE OLD NEW (TARGET: the program to rebuild). The file is put
# back afterwards, and so is mixed.c, which an earlier test breaks.
grade_with_line_replaced() {
    local id="$1" target="$2" file="$3" old="$4" new="$5"
    cp "$REPO/common/model/mixed.c" "$COPIES/one/common/model/mixed.c"
    sed "s|$old|$new|" "$REPO/$file" >"$COPIES/one/$file"
    ! cmp -s "$REPO/$file" "$COPIES/one/$file" # the edit applied
    make -C "$COPIES/one" --no-print-directory -j2 CUDA=0 OPT=-O1 "$target" >/dev/null 2>&1
    run bats "$COPIES/one/tests/grade/$id.bats"
    cp "$REPO/$file" "$COPIES/one/$file"
}

@test "a plausible wrong answer fails its grader: 01.4's share of T tokens in place of T*K choices" {
    grade_with_line_replaced 01.4 build/tests/test_kernels common/model/moe.c \
        'choices_h\[(size_t)b \* E + e\] / ((double)T \* K))' 'choices_h[(size_t)b * E + e] / (double)T)'
    assert_failure
    assert_output --partial "FAIL moe_balance"
}

@test "a plausible wrong answer fails its grader: 05.2's later micro-batches overwrite the shard" {
    grade_with_line_replaced 05.2 05_zero/train 05_zero/zero.c 'gb->accumulate ? gb->slice : mine, S,' 'mine, S,'
    assert_failure
    # and the failure names the configuration it checked
    assert_output --partial "checking --zero 2 on 2 ranks with --micro 2"
}

@test "a plausible wrong answer fails its grader: 06.2's thread reads the shard the next step fills" {
    grade_with_line_replaced 06.2 06_offload/train 06_offload/offload.c \
        'o->worker_grads = o->cur;' 'o->worker_grads = 1 - o->cur;'
    assert_failure
}

@test "a plausible wrong answer fails its grader: 06.2's update not delayed (waited for as soon as started)" {
    grade_with_line_replaced 06.2 06_offload/train 06_offload/train.c \
        'if (last) offload_update_wait(off);' 'offload_update_wait(off);'
    assert_failure
}

@test "a plausible wrong answer fails its grader: 04.3's W's not held back, so its bubble is 1F1B's" {
    grade_with_line_replaced 04.3 build/tests/test_schedule 04_pipeline/schedule.c \
        'int lag = stage, next_w = 0;' 'int lag = 0, next_w = 0;'
    assert_failure
    assert_output --partial "bubble 0.250000, formula 0.142857"
}

@test "a plausible wrong answer fails its grader: 06.3's optimizer state without the master weights" {
    grade_with_line_replaced 06.3 common/plan common/tools/plan_by_hand.c 'mine \* (4 + 8);' 'mine * 8;'
    assert_failure
    assert_output --regexp "device optimizer bytes +547840 +821760  WRONG"
}

@test "a plausible wrong answer fails its grader: 06.3's numbers copied from the planner for the course's layout" {
    # what `common/plan --csv --time-csv` prints for the layout of the exercise, as constants
    machine="$REPO/common/machines/cpu-amd-epyc-2cores.machine"
    plan=$(OMP_NUM_THREADS=1 "$REPO/common/plan" --model tiny --zero 1 --precision bf16 --dp 2 --machine "$machine" \
        --csv "$BATS_TEST_TMPDIR/memory.csv" --time-csv "$BATS_TEST_TMPDIR/time.csv")
    device() { awk -F, -v c="$1" '$1 == 0 && $2 == "device" && $3 == c { print $4 }' "$BATS_TEST_TMPDIR/memory.csv"; }
    sent=$(awk '$1 == "(sum)" { print $2 }' <<<"$plan")
    # the step as --by-hand grades it: plan_time.h's formulas (a plan prices the counted work instead)
    step=$(OMP_NUM_THREADS=1 "$REPO/common/plan" --by-hand --machine "$machine" | awk '$1 == "step" && $2 == "ms" { print $4 }')
    [ -n "$sent" ] && [ -n "$step" ] && [ -n "$(device optimizer)" ]
    copied="    h->params_bytes = $(device params); h->grads_bytes = $(device grads);
    h->optimizer_bytes = $(device optimizer); h->sent_bytes = $sent; h->step_ms = $step;
    (void)layout; (void)m;"
    file=common/tools/plan_by_hand.c
    python3 - "$REPO/$file" "$COPIES/one/$file" "$copied" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
region = re.compile(r"(    /\* EXERCISE 06\.3 BEGIN[^\n]*\n).*?(    /\* EXERCISE 06\.3 END)", re.S)
assert region.search(text), "no 06.3 region"
open(sys.argv[2], "w").write(region.sub(lambda m: m.group(1) + sys.argv[3] + "\n" + m.group(2), text))
PY
    make -C "$COPIES/one" --no-print-directory -j2 CUDA=0 OPT=-O1 common/plan >/dev/null 2>&1
    # they pass on the course's layout, so only the layouts drawn at grading time catch them
    run env OMP_NUM_THREADS=1 "$COPIES/one/common/plan" --by-hand --machine "$machine"
    assert_output --partial "all agree"
    run bats "$COPIES/one/tests/grade/06.3.bats"
    cp "$REPO/$file" "$COPIES/one/$file"
    assert_failure
    assert_output --partial "not ok 2 the numbers planned by hand are the planner's on layouts and machines drawn now"
}

@test "plan --by-hand refuses, in one line, a layout with padded shards or a batch the ranks cannot share" {
    machine="$REPO/common/machines/cpu-amd-epyc-2cores.machine"
    run --separate-stderr "$REPO/common/plan" --by-hand --machine "$machine" --dmodel 60 --heads 4 --dp 8
    assert_equal "$status" 2
    assert_equal "$stderr" "error: --by-hand plans shards without padding, and block 0 of this model has 43980 parameters, not a multiple of --dp 8 (valid: a --dmodel that is a multiple of 8)"
    run --separate-stderr "$REPO/common/plan" --by-hand --machine "$machine" --dp 3
    assert_equal "$status" 2
    assert_equal "$stderr" "error: --by-hand: --batch 8 does not divide among --dp 3 ranks (valid: a multiple of 3)"
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

# The leak tests: a stub is worth nothing if the answer survives elsewhere in
# the copy (another backend, another SIMD width, a test, the course text).

@test "leak test: no statement of any exercise's answer survives in a student copy" {
    # tests/exercise_leaks.py: each answer's statements, normalised (whitespace, struct
    # prefixes, SIMD widths), looked for in every file of the copy
    run python3 "$REPO/tests/exercise_leaks.py" "$REPO" "$COPIES/all"
    assert_success
    assert_output --regexp "exercise_leaks: $(python3 "$REPO/common/python/exercises.py" --list | wc -l) exercises, [0-9]+ answer statements, 0 found in [^;]*; [0-9]+ functions compute answers, 0 left"
    # and the copy holds no file that only the full copy may hold
    [ ! -e "$COPIES/all/tests/tools/exercises.bats" ]
}

@test "leak test: the checker finds an answer moved out of its region, and a twin at another SIMD width" {
    copy="$BATS_TEST_TMPDIR/leaky"
    make -C "$REPO" --no-print-directory exercises DEST="$copy" >/dev/null
    # 05.4's answer pasted into a test, with the struct renamed
    echo 'if (scaler.dynamic) scaler.scale /= 2.0f;' >>"$copy/tests/test_kernels.c"
    # 06.1's AVX2 loop written again at 16 lanes, in a new file
    sed -n '/EXERCISE 06.1 BEGIN/,/EXERCISE 06.1 END/p' "$REPO/06_offload/cpu_adam.c" |
        sed 's/_mm256_/_mm512_/g; s/__m256/__m512/g; s/j += 8/j += 16/' >"$copy/06_offload/wide.c"
    run python3 "$REPO/tests/exercise_leaks.py" "$REPO" "$copy"
    assert_failure
    assert_output --partial 'exercise 05.4: tests/test_kernels.c holds the answer'
    assert_output --partial 'exercise 06.1: 06_offload/wide.c holds the answer'
}

@test "leak test: every function that computes an answer, the CUDA twins included, is stubbed or gone" {
    # 03.3's CUDA twin writes merge_row's arithmetic in its own words (fmaxf, no pointer): the
    # check goes by what the kernel tables say computes it, not by its spelling
    copy="$BATS_TEST_TMPDIR/twin"
    make -C "$REPO" --no-print-directory exercises DEST="$copy" >/dev/null
    grep -q 'exercise_not_implemented("03\.3"' "$copy/common/kernels/attention_cuda.cu"
    run grep -c "attention_merge_kernel" "$copy/common/kernels/attention_cuda.cu"
    assert_output "0"
    # the twin put back (the reference's CUDA file) is found, the CPU stub notwithstanding
    cp "$REPO/common/kernels/attention_cuda.cu" "$copy/common/kernels/attention_cuda.cu"
    run python3 "$REPO/tests/exercise_leaks.py" "$REPO" "$copy"
    assert_failure
    assert_output --partial "exercise 03.3: common/kernels/attention_cuda.cu's attention_merge_kernel computes the answer and is neither stubbed nor gone"
    assert_output --partial "exercise 03.3: common/kernels/attention_cuda.cu's attention_merge_cuda computes the answer and is neither stubbed nor gone"
    # and a twin of the kernel table that the grader does not declare is named
    full="$BATS_TEST_TMPDIR/full"
    mkdir -p "$full/tests/grade" "$full/common/kernels"
    cp "$REPO"/common/kernels/*_cpu.c "$REPO"/common/kernels/*_cuda.cu "$full/common/kernels/"
    grep -v '^# twins:' "$REPO/tests/grade/03.3.bats" >"$full/tests/grade/03.3.bats"
    run python3 "$REPO/tests/exercise_leaks.py" "$full" "$BATS_TEST_TMPDIR/twin"
    assert_failure
    assert_output --partial "exercise 03.3: common/kernels/attention_cuda.cu's attention_merge_cuda computes the answer in the other backend (the kernel table's twin) and tests/grade/03.3.bats does not declare it"
}

@test "leak test: exercise 06.1's AVX-512 loop, renamed to AVX2 in its stub, does not pass the grader" {
    copy="$BATS_TEST_TMPDIR/avx"
    make -C "$REPO" --no-print-directory exercises DEST="$copy" ONLY=06.1 >/dev/null
    "$COPIES/one/build/tests/test_cpu_adam" path | grep -q '^supported.* avx2' ||
        skip "this CPU has no AVX2: exercise 06.1 cannot be graded here"
    src="$copy/06_offload/cpu_adam.c"
    # the body of adamw_avx512 up to its scalar tail, less `size_t i = 0;`, at 8 lanes
    awk '/^AVX512 static void adamw_avx512\(/ { f = 1 } f && /adamw_scalar\(/ { exit }
         g && !/size_t i = 0;/ { print } f && /\{$/ { g = 1 }' "$src" |
        sed 's/_mm512_/_mm256_/g; s/__m512/__m256/g; s/store_half16/store_half8/g; s/j += 16/j += 8/; s/\b32\b/16/g' \
            >"$BATS_TEST_TMPDIR/body"
    # in place of adamw_avx2's stub (the first of 06.1's two)
    python3 - "$src" "$BATS_TEST_TMPDIR/body" <<'PY'
import re, sys
src, body = sys.argv[1], open(sys.argv[2]).read()
text = open(src).read()
stub = re.compile(r"    /\* EXERCISE 06\.1: [^\n]*\n    exercise_not_implemented\(\"06\.1\"[^\n]*\n")
assert stub.search(text), "no 06.1 stub in adamw_avx2"
open(src, "w").write(stub.sub(lambda m: body, text, count=1))
PY
    # graded in the built copy (its library built once for the file), the reference put back after
    cp "$src" "$COPIES/one/06_offload/cpu_adam.c"
    make -C "$COPIES/one" --no-print-directory -j2 CUDA=0 OPT=-O1 build/tests/test_cpu_adam >/dev/null 2>&1
    run bats "$COPIES/one/tests/grade/06.1.bats"
    cp "$REPO/06_offload/cpu_adam.c" "$COPIES/one/06_offload/cpu_adam.c"
    assert_failure
}

@test "course.md's exercise dependencies are those the graders' runs reach" {
    # common/python/exercise_deps.py runs every grader on a traced copy (exercises.py --trace)
    "$COPIES/one/build/tests/test_cpu_adam" path | grep -q '^supported.* avx2' ||
        skip "this CPU has no AVX2: chapter 06's host AdamW does not run exercise 06.1 here"
    run python3 "$REPO/common/python/exercise_deps.py" --check
    assert_success
    assert_output --partial "course.md's dependency lines are those the graders' runs reach"
}
