#!/usr/bin/env bats
# gpu_check.bats: `make gpu-check` (common/scripts/gpu_check.sh) where there is no GPU:
# it refuses in one line and writes nothing, its list of checks can be read
# without running any, and the parts that need no GPU work: the comparison of
# losses (common/scripts/compare_losses.sh), and a rehearsal of the checks on the CPU
# backend (GPU_CHECK_DEVICE=cpu) that passes, fails when the losses differ, and
# adds a second half's results to the same day's report.

load ../helpers

CHECK="$REPO/common/scripts/gpu_check.sh"
COMPARE="$REPO/common/scripts/compare_losses.sh"
export OMP_NUM_THREADS=1

no_gpu_here() {
    if "$BUILD/tests/gpu_probe" >/dev/null 2>&1; then skip "a GPU is visible here"; fi
}

# A steps.csv with the loss 6 - step/2, times FACTOR, for steps FIRST_STEP (1)..N.
losses_csv() { # FILE N FACTOR [FIRST_STEP]
    awk -v n="$2" -v f="$3" -v first="${4:-1}" 'BEGIN { print "step,loss,lr"
        for (s = first; s <= n; s++) printf "%d,%.9g,0.001\n", s, (6 - s * 0.5) * f }' >"$1"
}

@test "gpu-check without a GPU refuses in one line with exit 2 and writes no report" {
    no_gpu_here
    local results
    results="$(scratch)/results"
    GPU_CHECK_RESULTS="$results" GPU_CHECK_WORK="$(scratch)/work" run --separate-stderr "$CHECK"
    assert_equal "$status" 2
    assert_equal "$stderr" "$(echo "$stderr" | head -1)"
    assert_regex "$stderr" '^gpu-check: no CUDA GPU is visible \(.*\); run it on a machine with a GPU$'
    assert_equal "$output" ""
    [ ! -e "$results" ]
    [ ! -e "$(scratch)/work" ]
}

@test "where nvidia-smi lists a GPU but the CUDA runtime finds none, gpu-check refuses naming gpu_probe's answer" {
    no_gpu_here
    mkdir -p "$(scratch)/bin"
    printf '#!/bin/sh\necho "GPU 0: Pretend GPU (UUID: GPU-0)"\n' >"$(scratch)/bin/nvidia-smi"
    chmod +x "$(scratch)/bin/nvidia-smi"
    PATH="$(scratch)/bin:$PATH" GPU_CHECK_RESULTS="$(scratch)/results" GPU_CHECK_WORK="$(scratch)/work" \
        run --separate-stderr "$CHECK"
    assert_equal "$status" 2
    assert_regex "$stderr" '^gpu-check: no CUDA GPU is visible \(cudaGetDeviceCount found none: gpu_probe says .*\); run it on a machine with a GPU$'
    [ ! -e "$(scratch)/results" ]
}

@test "make gpu-check refuses before building when no GPU is visible" {
    no_gpu_here
    run make -C "$REPO" --no-print-directory gpu-check
    assert_equal "$status" 2
    assert_output --partial "gpu-check: no CUDA GPU is visible"
    refute_output --partial "gcc"
}

@test "gpu-check --list prints every check and its commands without a GPU, for every chapter, and runs nothing" {
    GPU_CHECK_RESULTS="$(scratch)/results" GPU_CHECK_WORK="$(scratch)/work" run "$CHECK" --list
    assert_success
    for chapter in 01_single_gpu 02_data_parallel 03_model_parallel 04_pipeline 05_zero 06_offload; do
        assert_output --partial "./$chapter/train --device cuda"
    done
    for precision in fp32 bf16 fp16; do
        assert_output --partial "--precision $precision --comm mpi --zero 3 --prefetch 1"
        assert_output --partial "--precision $precision --comm nccl --zero 3 --prefetch 1"
    done
    for command in "REQUIRE_GPU=1 bats --tap tests/library/parity.bats" build/tests/test_parity build/tests/test_overlap \
        "--offload --pp 2 --dp 2" "--dpu-reference" "--device cpu" "--resume" "common/ckpt verify" \
        common/scripts/compare_losses.sh common/scripts/bench.sh common/scripts/bench_offload.sh "06_offload/capacity.py --device cuda" \
        "test_cpu_adam parity" "--comm mpi --cp 2"; do
        assert_output --partial "$command"
    done
    # each group's checks, named
    for group in parity overlap chapters nccl offload checkpoints hostadam bench offloadbench capacity; do
        assert_output --partial "[$group] "
    done
    [ ! -e "$(scratch)/results" ]
    [ ! -e "$(scratch)/work" ]
    # GPU_CHECK_DRY=1 is the same list
    GPU_CHECK_DRY=1 GPU_CHECK_RESULTS="$(scratch)/results" run "$CHECK"
    assert_success
    assert_output --partial "./06_offload/train --device cuda"
}

@test "GPU_CHECK_ONLY runs one half (part1, part2) or named groups, and refuses an unknown group" {
    GPU_CHECK_ONLY=part2 run "$CHECK" --list
    assert_success
    assert_output --partial "[bench] "
    assert_output --partial "[offloadbench] "
    assert_output --partial "[capacity] "
    assert_output --partial "[calibrate] "
    refute_output --partial "[parity] "
    refute_output --partial "[chapters] "
    GPU_CHECK_ONLY=part1 run "$CHECK" --list
    assert_output --partial "[parity] "
    assert_output --partial "[hostadam] "
    refute_output --partial "[bench] "
    refute_output --partial "[capacity] "
    GPU_CHECK_ONLY=overlap,nccl run "$CHECK" --list
    assert_output --partial "[overlap] "
    assert_output --partial "[nccl] "
    refute_output --partial "[chapters] "
    GPU_CHECK_ONLY=chapterz run --separate-stderr "$CHECK" --list
    assert_equal "$status" 2
    assert_regex "$stderr" "^gpu-check: GPU_CHECK_ONLY: unknown group 'chapterz' \(groups: .*\)$"
}

@test "compare_losses.sh passes losses within the tolerance, matched by step, and fails beyond it" {
    d="$(scratch)"
    losses_csv "$d/ref.csv" 6 1
    losses_csv "$d/near.csv" 6 1.00005
    losses_csv "$d/resumed.csv" 6 1 4
    run "$COMPARE" "$d/ref.csv" "$d/near.csv" 1e-4 6
    assert_success
    assert_regex "$output" '^6 steps, worst relative difference 5e-05 at step [1-6] \(tolerance 1e-4\)$'
    run "$COMPARE" "$d/ref.csv" "$d/resumed.csv" 0 3
    assert_success
    run "$COMPARE" "$d/ref.csv" "$d/near.csv" 1e-5
    assert_failure
    assert_output --partial "step 2: loss 5.00025 against 5 (relative 5e-05)"
}

@test "compare_losses.sh refuses a tolerance or step count that is not a number in one line with exit 2" {
    d="$(scratch)"
    losses_csv "$d/ref.csv" 6 1
    losses_csv "$d/far.csv" 6 1.5
    # the difference is real: a valid tolerance catches it
    run "$COMPARE" "$d/ref.csv" "$d/far.csv" 1e-4
    assert_equal "$status" 1
    assert_output --partial "step 1: loss 8.25 against 5.5 (relative 0.5)"
    local tol
    for tol in 1O-4 abc 1e-4x "" -1e-4 -1 1e 0x10 "1e-4 "; do
        run --separate-stderr "$COMPARE" "$d/ref.csv" "$d/far.csv" "$tol"
        assert_equal "$status" 2
        assert_equal "$output" ""
        assert_equal "$stderr" "compare_losses: TOLERANCE '$tol' is not a non-negative number (valid: a decimal number such as 1e-4 or 0.01)"
    done
    for steps in 0 abc 6x -6; do
        run --separate-stderr "$COMPARE" "$d/ref.csv" "$d/ref.csv" 1e-4 "$steps"
        assert_equal "$status" 2
        assert_equal "$stderr" "compare_losses: STEPS '$steps' is not a count (valid: a whole number of steps from 1)"
    done
}

@test "compare_losses.sh fails on a missing step, the wrong number of steps, a NaN or an empty run" {
    d="$(scratch)"
    losses_csv "$d/ref.csv" 6 1
    losses_csv "$d/longer.csv" 8 1
    run "$COMPARE" "$d/ref.csv" "$d/longer.csv" 1e-4
    assert_failure
    assert_output --partial "step 7: not in the reference run"
    run "$COMPARE" "$d/ref.csv" "$d/ref.csv" 1e-4 5
    assert_failure
    assert_output --partial "expected 5 steps"
    sed 's/^3,[^,]*,/3,nan,/' "$d/ref.csv" >"$d/nan.csv"
    run "$COMPARE" "$d/ref.csv" "$d/nan.csv" 1
    assert_failure
    assert_output --partial "step 3: loss nan"
    echo "step,loss" >"$d/empty.csv"
    run "$COMPARE" "$d/ref.csv" "$d/empty.csv" 1
    assert_failure
    assert_output "the run has no steps"
    run "$COMPARE" "$d/ref.csv"
    assert_equal "$status" 2
}

@test "a rehearsal of the checkpoint checks on the CPU passes and writes its report and CSVs, marked as no GPU check" {
    GPU_CHECK_DEVICE=cpu GPU_CHECK_ONLY=checkpoints GPU_CHECK_RESULTS="$(scratch)/results" \
        GPU_CHECK_WORK="$(scratch)/work" run "$CHECK"
    assert_success
    assert_output --partial "3 passed, 0 failed, 0 skipped"
    report="$(ls "$(scratch)"/results/gpu-check-cpu-rehearsal-*.md)"
    run cat "$report"
    assert_output --partial "A rehearsal on the CPU backend"
    assert_output --partial "| checkpoints | 06-offload-pp2-dp2-bf16-cpu-to-01-cpu | PASS |"
    assert_equal "$(grep -c ',PASS,' "${report%.md}.checks.csv")" 3
    assert_equal "$(tail -n +2 "${report%.md}.losses.csv" | wc -l)" 3
}

@test "the tied group compares each tied layout with 01 tied, not with the untied reference (rehearsed on the CPU)" {
    GPU_CHECK_DEVICE=cpu GPU_CHECK_ONLY=chapters,tied GPU_CHECK_PRECISIONS=fp32 GPU_CHECK_STEPS=4 \
        GPU_CHECK_RESULTS="$(scratch)/results" GPU_CHECK_WORK="$(scratch)/work" run "$CHECK"
    assert_success
    assert_output --partial "PASS tied/04-tied-1f1b-pp2-dp2-fp32: 4 steps"
    assert_output --partial "PASS tied/06-tied-offload-fp32: 4 steps"
    assert_output --partial "18 passed, 0 failed, 0 skipped"
    # two references: 01 untied for the chapters, 01 tied for the tied group
    run ls "$(scratch)/work/ref"
    assert_line "01-cpu-fp32"
    assert_line "01-cpu-fp32--tie-embeddings"
}

@test "the experts group compares 02 with experts with 01 with experts, not with the dense reference (rehearsed on the CPU)" {
    GPU_CHECK_DEVICE=cpu GPU_CHECK_ONLY=experts GPU_CHECK_PRECISIONS=fp32 GPU_CHECK_STEPS=4 \
        GPU_CHECK_RESULTS="$(scratch)/results" GPU_CHECK_WORK="$(scratch)/work" run "$CHECK"
    assert_success
    assert_output --partial "PASS experts/02-experts-flat-dp2-fp32: 4 steps"
    assert_output --partial "1 passed, 0 failed, 0 skipped"
    run ls "$(scratch)/work/ref"
    assert_line "01-cpu-fp32--experts3--top-k2--capacity-factor1-25"
    refute_line "01-cpu-fp32"
    # the run and its reference had the experts: steps.csv's routing columns
    run head -n 1 "$(scratch)/work/experts/02-experts-flat-dp2-fp32/steps.csv"
    assert_output --partial ",dropped,tokens_e0,tokens_e1,tokens_e2"
}

@test "a rehearsal whose reference losses differ (01 on another seed) fails those checks, exit 1, FAIL in the report" {
    GPU_CHECK_DEVICE=cpu GPU_CHECK_ONLY=chapters GPU_CHECK_PRECISIONS=fp32 GPU_CHECK_STEPS=4 \
        GPU_CHECK_REF_EXTRA="--seed 7" GPU_CHECK_RESULTS="$(scratch)/results" GPU_CHECK_WORK="$(scratch)/work" \
        run "$CHECK"
    assert_failure 1
    assert_output --partial "FAIL chapters/02-flat-fp32: 4 steps, worst relative difference"
    assert_output --partial "FAIL chapters/03-cp2-fp32: 4 steps, worst relative difference"
    assert_output --partial "FAIL chapters/03-ulysses-cp2-fp32: 4 steps, worst relative difference"
    assert_output --partial "0 passed, 15 failed, 0 skipped"
    run grep -c '| FAIL |' "$(ls "$(scratch)"/results/gpu-check-cpu-rehearsal-*.md)"
    assert_output 15
}

@test "the calibrate check writes the machine file the planner reads beside the report (rehearsed on the CPU, --quick)" {
    GPU_CHECK_DEVICE=cpu GPU_CHECK_ONLY=calibrate GPU_CHECK_RESULTS="$(scratch)/results" \
        GPU_CHECK_WORK="$(scratch)/work" OMP_NUM_THREADS=1 run "$CHECK"
    assert_success
    assert_output --partial "PASS calibrate/machine: name = "
    machine="$(ls "$(scratch)"/results/gpu-check-cpu-rehearsal-*.machine)"
    run "$REPO/common/plan" --model tiny --machine "$machine"
    assert_success
}

@test "a second half adds its section and rows to the same day's report" {
    for _ in first second; do
        GPU_CHECK_DEVICE=cpu GPU_CHECK_ONLY=hostadam GPU_CHECK_RESULTS="$(scratch)/results" \
            GPU_CHECK_WORK="$(scratch)/work" run "$CHECK"
        assert_success
    done
    report="$(ls "$(scratch)"/results/gpu-check-cpu-rehearsal-*.md)"
    assert_equal "$(grep -c '^## Run of' "$report")" 2
    assert_equal "$(grep -c '^# GPU check' "$report")" 1
    assert_equal "$(grep -c '^hostadam,cpu-adam,PASS' "${report%.md}.checks.csv")" 2
}

@test "a run cut short keeps the checks it finished in the report, marked in progress" {
    # setsid: the script leads its own process group, so that one signal ends it and its runs
    GPU_CHECK_DEVICE=cpu GPU_CHECK_ONLY=hostadam,offloadbench GPU_CHECK_RESULTS="$(scratch)/results" \
        GPU_CHECK_WORK="$(scratch)/work" setsid "$CHECK" >"$(scratch)/log" 2>&1 &
    local pid=$!
    for _ in $(seq 150); do
        grep -qs '| hostadam | cpu-adam | PASS' "$(scratch)"/results/gpu-check-*.md && break
        sleep 0.2
    done
    kill -TERM -- -"$pid"
    wait "$pid" || true
    report="$(ls "$(scratch)"/results/gpu-check-cpu-rehearsal-*.md)"
    run cat "$report"
    assert_output --partial "1 passed, 0 failed, 0 skipped; in progress"
    assert_output --partial "| hostadam | cpu-adam | PASS |"
    refute_output --partial "| offloadbench |"
}

# A pretend GPU in DIR: nvidia-smi and build/tests programs that print what
# the real ones print on a GPU (test_overlap with overlap OVERLAP and exit STATUS).
pretend_gpu() { # DIR OVERLAP STATUS
    mkdir -p "$1/bin" "$1/build/tests"
    printf '#!/bin/sh\necho "GPU 0: NVIDIA Pretend H100 80GB HBM3 (UUID: GPU-0)"\n' >"$1/bin/nvidia-smi"
    printf '#!/bin/sh\necho "cuda:NVIDIA Pretend H100 80GB HBM3"\n' >"$1/build/tests/gpu_probe"
    cat >"$1/build/tests/test_overlap" <<END
#!/bin/sh
echo "device: cuda:NVIDIA Pretend H100 80GB HBM3"
echo "matmuls  copy_MiB  kernel_ms  copy_ms  both_ms  serial_ms  overlap"
echo "     12       512     10.000   10.000   11.000     20.000    $2"
echo "$([ "$3" = 0 ] && echo PASS || echo FAIL): a copy on the copy stream ... (overlap $2, needed 0.50)"
exit $3
END
    for program in test_parity test_cpu_adam; do ln -s "$BUILD/tests/$program" "$1/build/tests/$program"; done
    chmod +x "$1/bin/nvidia-smi" "$1/build/tests/gpu_probe" "$1/build/tests/test_overlap"
}

@test "on a pretend GPU, the overlap check reads test_overlap's verdict and bandwidth into a report named after the device" {
    d="$(scratch)"
    pretend_gpu "$d/gpu" 0.900 0
    PATH="$d/gpu/bin:$PATH" BUILD="$d/gpu/build" GPU_CHECK_ONLY=overlap GPU_CHECK_RESULTS="$d/results" \
        GPU_CHECK_WORK="$d/work" run "$CHECK"
    assert_success
    run cat "$d/results/gpu-check-nvidia-pretend-h100-80gb-hbm3-$(date -u +%Y-%m-%d).md"
    assert_output --partial "# GPU check: NVIDIA Pretend H100 80GB HBM3"
    assert_output --partial "| overlap | copy-compute | PASS |"
    assert_output --partial "pinned copies at 53.7 GB/s"
    pretend_gpu "$d/slow" 0.100 1
    PATH="$d/slow/bin:$PATH" BUILD="$d/slow/build" GPU_CHECK_ONLY=overlap GPU_CHECK_RESULTS="$d/results" \
        GPU_CHECK_WORK="$d/work" run "$CHECK"
    assert_failure 1
    assert_output --partial "FAIL overlap/copy-compute: exit status 1 of: $d/slow/build/tests/test_overlap"
}
