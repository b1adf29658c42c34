#!/usr/bin/env bash
# gpu_check.sh: `make gpu-check`: every check of the course that only a GPU can
# do, in one command, with a dated report of verdicts and evidence.
#
#   make gpu-check                          all of it
#   make gpu-check GPU_CHECK_ONLY=part1     the correctness checks (parity .. hostadam), 2.5 minutes on an H200
#   make gpu-check GPU_CHECK_ONLY=part2     the measurements (capacity, bench, offloadbench, calibrate): bench
#                                           in 3 precisions of gpt2 takes about 3 minutes; the rest has not
#                                           run to the end on a GPU yet
#   common/scripts/gpu_check.sh --list              print every check and its commands; runs nothing, needs no GPU
#                                           (GPU_CHECK_DRY=1 does the same)
#
# Without a visible CUDA GPU it refuses in one line (exit 2) and writes
# nothing. It needs only what the build needs plus mpirun, bats (with
# bats-assert/support) and python3; never apt (install-deps.sh is not
# called), so it runs offline with shared/device's kit.
#
# Writes, in GPU_CHECK_RESULTS (common/bench_results), for the device (its name
# in lower case, e.g. nvidia-h100-80gb-hbm3) and the date (UTC):
#   gpu-check-DEVICE-DATE.md         the report: machine, commit, a table of every check's verdict
#                                    and evidence, then each check's commands and output
#   gpu-check-DEVICE-DATE.checks.csv group,check,verdict,seconds,evidence (one row per check)
#   gpu-check-DEVICE-DATE.losses.csv check,program,ranks,comm,precision,steps,tolerance,worst_rel_diff,verdict
#                                    (every comparison of losses)
#   and the CSVs of the measurements: .offload-timeline.csv (06's timeline on the GPU),
#   .bench.runs.csv/.bench.compare.csv (common/scripts/bench.sh), .offload.runs.csv/.offload.summary.csv
#   (common/scripts/bench_offload.sh), .capacity.csv (06_offload/capacity.py, on the GPU and the CPU),
#   .machine (common/plan --calibrate).
# A run with GPU_CHECK_ONLY adds its section (and rows) to the same day's report of the same
# device, so two halves run in two calls make one report; a full run starts it afresh. The
# report is written again after every check: a run cut short keeps the checks it finished.
# Scratch runs and logs go to runs/gpu-check/. Exit 0 when no check fails (skips allowed),
# 1 when one fails, 2 for a refusal or bad settings.
#
# The checks, by group, and what each proves (tolerances as in the test suite:
# fp32 within 1e-4 relative of the reference's losses, 16 bits within 1e-2 of 01
# in the same precision):
#   parity       test_parity: every kernel of kernels.h and every cast (bf16, fp16), CUDA against
#                the CPU on the same inputs, each within 1e-4 (casts bit for bit): the two backends
#                compute the same function. bats: REQUIRE_GPU=1 bats tests/library/parity.bats, the same per
#                kernel plus an async copy ordered by events, CUDA's memory accounting equal to the
#                CPU's, and 2-rank runs sharing the GPU (host-staged MPI).
#   overlap      test_overlap: a pinned host<->device copy on the copy stream runs while matmuls run on
#                the compute stream (overlap >= 0.5); also gives the pinned copy bandwidth.
#   chapters     for fp32, bf16 and fp16: 01 on CUDA against 01 on the CPU; then every chapter 02-06 on
#                CUDA against 01 on CUDA (02 flat and overlapped ring, 03 layer split and tensor parallel
#                with dp 2, 04 1F1B over 4 stages and GPipe 2x2, 05 stages 1-3 with prefetch, 06 offload
#                on 1 rank and 2 stages x 2 replicas: "06 = 01 on CUDA"). Several ranks share one GPU,
#                which NCCL refuses, so they use --comm mpi (host-staged), or NCCL when there is a GPU
#                per rank. Proves the mixed precision, the staged transport and every layout on CUDA.
#                Also 03 --cp 2 (ring attention's CUDA block kernels) against 01 on CUDA, each block
#                exchanged after its computation (CUDA's transports cannot post sends yet, comm.h),
#                03 --cp 2 --cp-mode ulysses (the all-to-all and its strided device copies), 06
#                --offload-activations (block inputs to pinned host memory and back on the copy stream)
#                and 06 --offload-params (each unit's weights copied in on the copy stream before its use).
#   tied         --tie-embeddings (the head reads wte): 01 tied on CUDA against 01 tied on the CPU, then
#                04 (the first and last stages sum the tied gradient), 05 ZeRO-3 and 06 offload, tied,
#                against 01 tied on CUDA, in each precision.
#   experts      the mixture of experts (--experts 3 --top-k 2 --capacity-factor 1.25: odd E, drops):
#                01 on CUDA against 01 on the CPU (the routing decided on the host from the device's
#                logits; the gather, combine and scatter kernels), then 02 on 2 ranks against 01 on
#                CUDA, in each precision. The kernels' parity is the parity group's (test_parity moe).
#   nccl         --comm nccl at world size 1 (NCCL allows one rank per GPU): 05 stage 2 and stage 3
#                with prefetch, whose reduce-scatters and all-gathers go through NCCL on the
#                communication stream (stage 3's from the communication thread) in fp32, bf16
#                (ncclBfloat16) and fp16 (ncclHalf); equal losses show the events order them with the
#                compute stream. With 2 GPUs or more, also 02 and 04 on 2 ranks over NCCL
#                (all-reduce, send/recv); skipped with one GPU.
#   offload      timeline: 06 --offload on CUDA writes timeline.csv, and the gradient copies
#                (grad_d2h) of every step after the first finish inside that step's backward (all
#                but at most the last of a step): they are queued on the copy stream and done while
#                the backward goes on, not after it. The rows are host times (a copy ends when the
#                host learns it is done), so this shows where the copies sit in the step; that the
#                copy engine and the SMs do run at once is test_overlap's part. dpu: --dpu (the host
#                update on a thread, during the next step) equals its one-step-stale reference bit
#                for bit on CUDA.
#   checkpoints  01 saved on CUDA resumes on the CPU and on CUDA, and saved on the CPU resumes on CUDA,
#                giving the uninterrupted CUDA run's losses (1e-4; 1e-5 CUDA to CUDA); 05 ZeRO-2 and 06
#                offload saved on CUDA in bf16 on 4 ranks resume in 01 (CUDA, CPU) within 1e-2;
#                common/ckpt verifies every checkpoint written from the GPU.
#   hostadam     not the GPU but its host: 06's CPU AdamW equals the kernel table bit for bit on every
#                SIMD path this CPU runs (the AVX-512 path has no other machine to run on).
#   capacity     06_offload/capacity.py on CUDA (and on the CPU, for comparison): --device-mem-limit
#                holds on the GPU (every fitting trial's peak within its budget) and 06 trains a
#                larger model than 01 at every budget.
#   bench        common/scripts/bench.sh in bf16 (GPU_CHECK_BENCH_PRECISIONS) on the medium and gpt2 presets:
#                the course's mixed precision against PyTorch under torch.autocast, tokens/s, peak
#                memory and MFU. Passes when both sides ran the same model and every ratio was
#                measured (the ratio itself is reported, not judged); skipped when PyTorch (PYTHON)
#                is not importable or cannot use the GPU.
#   offloadbench common/scripts/bench_offload.sh on CUDA: 06's step time against 01, 04 and 05, with and
#                without --dpu, each offload level (--offload-activations, --offload-params) against
#                --offload alone, the PCIe bytes per step each way and the copies' time against the
#                computation's (timeline.csv). Passes when every configuration ran.
#   calibrate    common/plan --calibrate on CUDA: this machine's constants for the planner (01's
#                gpt2 step, devicebench's pinned copies and device AdamW, adambench on the host,
#                commbench where there are 2 GPUs), written as gpu-check-DEVICE-DATE.machine, the
#                file that replaces common/machines/'s estimates. Passes when the planner reads it.
#
# Settings (environment): GPU_CHECK_ONLY (all; groups and/or part1, part2, comma-separated),
# GPU_CHECK_DRY=1 (print, run nothing), GPU_CHECK_RESULTS (common/bench_results), GPU_CHECK_STEPS
# (10, the chapters' steps), GPU_CHECK_PRECISIONS ("fp32 bf16 fp16"), GPU_CHECK_BENCH_PRECISIONS
# (bf16; also tf32, fp32, fp16), GPU_CHECK_BENCH_MODELS ("medium gpt2"), GPU_CHECK_BENCH_COMPILE (0; 1 adds a
# torch.compile run per preset, a minute or more each), GPU_CHECK_BUDGETS (16M,64M, capacity.py), PYTHON
# (python3, for bench.sh).
# For testing the script itself: GPU_CHECK_DEVICE=cpu rehearses every check that can run on the
# CPU backend (the GPU-only ones are skipped) and writes under runs/gpu-check-rehearsal, never
# into the benchmark results: its report is not a GPU check. GPU_CHECK_REF_EXTRA adds flags to
# 01's reference runs only (e.g. --seed 7), which makes every comparison with them fail.
# GPU_CHECK_WORK moves the scratch directory (runs/gpu-check). GPU_CHECK_STEP_LIMIT (120): the
# seconds one training run may take before it counts as hung (the benchmarks get longer).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

PART1="parity overlap chapters tied experts nccl offload checkpoints hostadam"
PART2="capacity bench offloadbench calibrate"

usage() {
    echo "usage: common/scripts/gpu_check.sh [--list | --probe]   (settings in the environment: see its header)" >&2
    exit 2
}
mode=run
case "${1:-}" in
"") ;;
--list) mode=list ;;
--probe) mode=probe ;;
*) usage ;;
esac
[[ $# -le 1 ]] || usage
[[ ${GPU_CHECK_DRY:-0} == 1 && $mode == run ]] && mode=list

BUILD="${BUILD:-build}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
STEPS="${GPU_CHECK_STEPS:-10}"
PRECISIONS="${GPU_CHECK_PRECISIONS:-fp32 bf16 fp16}"
BENCH_PRECISIONS="${GPU_CHECK_BENCH_PRECISIONS:-bf16}"
BENCH_MODELS="${GPU_CHECK_BENCH_MODELS:-medium gpt2}"
BENCH_COMPILE="${GPU_CHECK_BENCH_COMPILE:-0}"
BUDGETS="${GPU_CHECK_BUDGETS:-16M,64M}"
REF_EXTRA="${GPU_CHECK_REF_EXTRA:-}"
PYTHON="${PYTHON:-python3}"
CORES="$(getconf _NPROCESSORS_ONLN)" # not nproc, which OMP_NUM_THREADS changes
work="${GPU_CHECK_WORK:-runs/gpu-check}"
[[ $DEVICE == cpu ]] && work="${GPU_CHECK_WORK:-runs/gpu-check-rehearsal-work}"

fail_usage() {
    echo "gpu-check: $*" >&2
    exit 2
}
[[ $DEVICE == cuda || $DEVICE == cpu ]] || fail_usage "GPU_CHECK_DEVICE=$DEVICE: expected cuda (or cpu, a rehearsal)"
[[ $STEPS =~ ^[0-9]+$ && $STEPS -ge 4 ]] || fail_usage "GPU_CHECK_STEPS=$STEPS: expected a whole number >= 4"
for p in $PRECISIONS; do
    [[ $p == fp32 || $p == bf16 || $p == fp16 ]] || fail_usage "precision '$p': expected fp32, bf16 or fp16"
done
for p in $BENCH_PRECISIONS; do # bench.sh's: tf32 is fp32 storage with TF32 matmuls on both sides
    [[ $p == fp32 || $p == tf32 || $p == bf16 || $p == fp16 ]] ||
        fail_usage "GPU_CHECK_BENCH_PRECISIONS: '$p': expected fp32, tf32, bf16 or fp16"
done

# ---- the groups to run: GPU_CHECK_ONLY, with part1 and part2 standing for their groups ----
groups=""
for g in $(echo "${GPU_CHECK_ONLY:-all}" | tr ',' ' '); do
    case "$g" in
    all) groups="$groups $PART1 $PART2" ;;
    part1) groups="$groups $PART1" ;;
    part2) groups="$groups $PART2" ;;
    *)
        [[ " $PART1 $PART2 " == *" $g "* ]] ||
            fail_usage "GPU_CHECK_ONLY: unknown group '$g' (groups: $PART1 $PART2; or part1, part2, all)"
        groups="$groups $g"
        ;;
    esac
done
wanted() { [[ " $groups " == *" $1 "* ]]; }
partial=0
for g in $PART1 $PART2; do wanted "$g" || partial=1; done

# ---- is there a GPU? ----
# Before the build (make gpu-check runs --probe first, so that a machine
# without a GPU is told so at once): nvidia-smi's list, or the driver's device
# files. After it: build/tests/gpu_probe, which asks the CUDA runtime
# (cudaGetDeviceCount) through the course's own device layer.
refuse() {
    echo "gpu-check: no CUDA GPU is visible ($1); run it on a machine with a GPU" >&2
    exit 2
}
probe_early() {
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || refuse "nvidia-smi lists none"
    else
        compgen -G '/dev/nvidia[0-9]*' >/dev/null || refuse "no nvidia-smi and no /dev/nvidia* device"
    fi
}
probe_build() { # sets device_label to the GPU's name
    [[ -x $BUILD/tests/gpu_probe ]] || refuse "$BUILD/tests/gpu_probe is not built; run make first"
    local said
    said="$("$BUILD/tests/gpu_probe" 2>&1)" || refuse "cudaGetDeviceCount found none: gpu_probe says '$said'"
    device_label="${said#cuda:}"
}
if [[ $mode == probe ]]; then
    [[ $DEVICE == cpu || ${GPU_CHECK_DRY:-0} == 1 ]] || probe_early
    exit 0
fi

if [[ $mode == list ]]; then
    device_label="(dry run: no device)"
elif [[ $DEVICE == cuda ]]; then
    probe_early
    probe_build
else
    device_label="cpu $(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -1) (rehearsal)"
fi
GPUS=0
[[ $DEVICE == cuda ]] && GPUS="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
[[ $DEVICE == cuda && $GPUS -lt 1 ]] && GPUS=1
dry() { [[ $mode == list ]]; }

for program in 0{1..6}_*/train "$BUILD"/tests/test_parity "$BUILD"/tests/test_overlap "$BUILD"/tests/test_cpu_adam \
    common/ckpt; do
    [[ -x $program ]] || dry || fail_usage "$program is missing; run make first"
done

# ---- where the report goes ----
date_utc="$(date -u +%Y-%m-%d)"
slug="$(echo "$device_label" | tr '[:upper:]' '[:lower:]' | sed 's/[^a-z0-9]\{1,\}/-/g; s/^-//; s/-$//' | cut -c1-48)"
results="${GPU_CHECK_RESULTS:-common/bench_results}"
[[ $DEVICE == cpu ]] && results="${GPU_CHECK_RESULTS:-runs/gpu-check-rehearsal}" && slug="cpu-rehearsal"
stem="$results/gpu-check-$slug-$date_utc"
report="$stem.md"

# ---- bookkeeping: one check at a time ----
check_name="" check_group="" check_start=0 check_cmds=() rows=()
sections="$work/sections.md"
# GPU_CHECK_WORK is replaced whole: a new name, an empty directory or an earlier check's (its losses.csv)
losses_header="check,program,ranks,comm,precision,steps,tolerance,worst_rel_diff,verdict"
. common/scripts/outputs.sh
. common/scripts/lib.sh
if ! dry; then
    output_dir_check GPU_CHECK_WORK "$work" gpu_check.sh losses.csv "$losses_header"
    rm -rf "$work"
    mkdir -p "$work/logs" || fail_usage "cannot create $work"
    : >"$sections"
    echo "$losses_header" >"$work/losses.csv"
fi

# The command as one shell line a reader can paste.
show() {
    local q
    printf -v q '%q ' "$@"
    echo "${q% }"
}

# begin NAME WHAT: a check starts (the dry run prints it).
begin() {
    check_name="$1" check_start=$SECONDS check_cmds=()
    if dry; then echo "[$check_group] $1: $2"; else echo "gpu-check: $check_group/$1 ..."; fi
}

# step COMMAND...: run COMMAND with its output appended to the check's log
# (runs/gpu-check/logs/CHECK.log; the dry run prints it instead), for at most
# step_limit seconds: a run that hangs (a deadlock) must not take the whole
# device call with it. When it fails, the check fails with its exit status
# (its output's end is in the report), and step returns 1.
step_limit="${GPU_CHECK_STEP_LIMIT:-120}"
step() {
    check_cmds+=("$(show "$@")")
    if dry; then
        echo "    \$ $(show "$@")"
        return 0
    fi
    timeout --kill-after=10 "$step_limit" "$@" >>"$work/logs/$check_name.log" 2>&1 && return 0
    local status=$? said
    said="$(grep -v '^[[:space:]]*$' "$work/logs/$check_name.log" | tail -n 1 | cut -c1-200)"
    # a refusal the course still makes on this device (known_refusal: the start of its line) skips
    if [[ -n ${known_refusal:-} ]] && grep -q -F -e "$known_refusal" "$work/logs/$check_name.log"; then
        verdict SKIP "refused, as the course still does on $DEVICE: $(grep -m1 -F -e "$known_refusal" "$work/logs/$check_name.log" | cut -c1-200)"
        return 1
    fi
    if [[ $status -eq 124 || $status -eq 137 ]]; then
        verdict FAIL "stopped after ${step_limit} s: $(show "$@" | cut -c1-160)"
    else
        verdict FAIL "exit status $status of: $(show "$@" | cut -c1-160); it said: $said"
    fi
    return 1
}

# verdict PASS|FAIL|SKIP EVIDENCE: the check's result; its commands and log go into the report.
verdict() {
    local result="$1" evidence="$2" seconds=$((SECONDS - check_start)) log="$work/logs/$check_name.log"
    dry && return 0
    rows+=("$check_group"$'\t'"$check_name"$'\t'"$result"$'\t'"$seconds"$'\t'"${evidence//$'\t'/ }")
    printf 'gpu-check: %-4s %s/%s: %s\n' "$result" "$check_group" "$check_name" "$evidence"
    {
        echo "### $check_group/$check_name: $result"
        echo
        echo "$evidence"
        echo
        if [[ ${#check_cmds[@]} -gt 0 ]]; then
            echo "Commands:"
            echo
            printf '    %s\n' "${check_cmds[@]}"
            echo
        fi
        if [[ -s $log ]]; then
            echo "Output (the last 25 lines):"
            echo
            tail -n 25 "$log" | sed 's/^/    /'
            echo
        fi
    } >>"$sections"
    write_report
}

# The last line a command printed into the check's log.
last_line() { tail -n 1 "$work/logs/$check_name.log"; }

# ---- the training runs ----
# Every chapter run: the tiny preset with 4 layers (so that 4 pipeline stages
# fit), a global batch of 8 (2 sequences a rank on 4 ranks).
MODEL=(--model tiny --layers 4 --batch 8 --sample 0 --quiet --eval-batches 1 --overwrite)

tolerance() { [[ $1 == fp32 ]] && echo 1e-4 || echo 1e-2; }

# The transport of a run of RANKS ranks on the GPU: NCCL needs a GPU per rank.
comm_for() {
    if [[ $DEVICE == cuda && $GPUS -ge $1 && $1 -gt 1 ]]; then echo nccl; else echo mpi; fi
}

# train RANKS PROGRAM FLAGS...: sets cmd to PROGRAM's command line on RANKS
# ranks (mpirun beyond one), with the cores shared out among the ranks.
cmd=()
train() {
    local ranks="$1" program="$2" threads=$((CORES / $1))
    shift 2
    [[ $threads -ge 1 ]] || threads=1
    cmd=(env OMP_NUM_THREADS="$threads" OMP_WAIT_POLICY=passive)
    if [[ $ranks -gt 1 ]]; then
        cmd+=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np "$ranks"
            -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
    fi
    cmd+=("./$program/train" "$@")
}

# ran_on DIR: the run's run.csv says it ran on the checked device.
ran_on() {
    local device
    device="$(column "$1/run.csv" device)"
    [[ $device == "$DEVICE"* ]] || {
        verdict FAIL "$1/run.csv says device '$device', not $DEVICE"
        return 1
    }
}

# compare CHECK PROGRAM RANKS COMM PRECISION REF RUN TOL STEPS: the run's losses
# against the reference's (common/scripts/compare_losses.sh), a row of losses.csv, and
# the check's verdict.
compare() {
    local check="$1" program="$2" ranks="$3" comm="$4" precision="$5" ref="$6" run="$7" tol="$8" steps="$9"
    check_cmds+=("$(show common/scripts/compare_losses.sh "$ref/steps.csv" "$run/steps.csv" "$tol" "$steps")")
    if dry; then
        echo "    \$ common/scripts/compare_losses.sh $ref/steps.csv $run/steps.csv $tol $steps"
        return 0
    fi
    local said status worst
    said="$(common/scripts/compare_losses.sh "$ref/steps.csv" "$run/steps.csv" "$tol" "$steps" 2>&1)"
    status=$?
    echo "$said" >>"$work/logs/$check_name.log"
    worst="$(echo "$said" | sed -n 's/.*worst relative difference \([^ ]*\) .*/\1/p' | tail -1)"
    local result=PASS
    [[ $status -eq 0 ]] || result=FAIL
    echo "$check,$program,$ranks,$comm,$precision,$(echo "$said" | sed -n 's/^\([0-9]*\) steps.*/\1/p' | tail -1),$tol,${worst:-},$result" \
        >>"$work/losses.csv"
    verdict "$result" "$(echo "$said" | tail -1)$([[ $result == FAIL ]] && echo "; $(echo "$said" | head -1)")"
}

# reference PRECISION: 01's run on the device in PRECISION (made once), with
# ref_flags (a model flag such as --tie-embeddings, empty for most checks): the
# losses every chapter of that precision and model is compared with. Sets ref
# and ref_key.
declare -A made_reference=()
ref_flags=()
reference() {
    ref_key="$1$(printf '%s' "${ref_flags[@]}" | tr -c 'a-z0-9' '-')"
    ref="$work/ref/01-$DEVICE-$ref_key"
    [[ -n ${made_reference[$ref_key]:-} ]] && return 0
    made_reference[$ref_key]=1
    # shellcheck disable=SC2086 # REF_EXTRA: several words
    train 1 01_single_gpu --device "$DEVICE" "${MODEL[@]}" --steps "$STEPS" --precision "$1" "${ref_flags[@]}" $REF_EXTRA \
        --out "$ref"
    if dry; then
        echo "    (reference) \$ $(show "${cmd[@]}")"
        return 0
    fi
    mkdir -p "$(dirname "$ref")"
    timeout --kill-after=10 "$step_limit" "${cmd[@]}" >"$ref.log" 2>&1 || {
        made_reference[$ref_key]=failed
        echo "gpu-check: the reference run failed: $(show "${cmd[@]}"); see $ref.log" >&2
    }
}

# layout_check NAME RANKS COMM PROGRAM PRECISION FLAGS...: one chapter run against 01 on the device.
layout_check() {
    local name="$1" ranks="$2" comm="$3" program="$4" precision="$5"
    shift 5
    begin "$name-$precision" "$program on $ranks rank(s), --comm $comm, $precision, against 01 on $DEVICE"
    reference "$precision"
    if ! dry && [[ ${made_reference[$ref_key]} == failed ]]; then
        verdict FAIL "01's reference run in $precision failed: $(tail -n 1 "$ref.log" | cut -c1-200) (all of it in $ref.log)"
        return
    fi
    local out="$work/$check_group/$name-$precision"
    train "$ranks" "$program" --device "$DEVICE" "${MODEL[@]}" --steps "$STEPS" --precision "$precision" \
        "${ref_flags[@]}" --comm "$comm" "$@" --out "$out"
    step "${cmd[@]}" || return 0
    if [[ $check_group == nccl ]] && ! dry && ! grep -q "comm nccl" "$work/logs/$check_name.log"; then
        verdict FAIL "the run's first line does not say 'comm nccl'"
        return
    fi
    dry || ran_on "$out" || return 0
    compare "$name" "$program" "$ranks" "$comm" "$precision" "$ref" "$out" "$(tolerance "$precision")" "$STEPS"
}

# skip_check NAME WHY
skip_check() {
    begin "$1" "skipped: $2"
    verdict SKIP "$2"
}

# ================================ the groups ================================

group_parity() {
    if [[ $DEVICE != cuda ]]; then
        skip_check kernels "needs a GPU (rehearsal on the CPU)"
        skip_check bats "needs a GPU (rehearsal on the CPU)"
        return
    fi
    parity_kernels
    parity_bats
}
parity_kernels() {
    begin kernels "every kernel and cast of kernels.h, CUDA against the CPU (build/tests/test_parity)"
    step "$BUILD/tests/test_parity" || return 0
    dry && return 0
    local log="$work/logs/kernels.log" passed failed worst
    passed="$(grep -c '^PASS' "$log")" failed="$(grep -c '^FAIL' "$log")"
    worst="$(sed -n 's/.*maxrel=\([0-9.eE+-]*\).*/\1/p' "$log" | sort -g | tail -1)"
    if [[ $failed -eq 0 && $passed -gt 0 ]]; then
        verdict PASS "$passed kernels and checks pass, largest maxrel $worst (limit 1e-4)"
    else
        verdict FAIL "$failed of $((passed + failed)) fail: $(grep -m3 '^FAIL' "$log" | tr '\n' ' ')"
    fi
}
parity_bats() {
    begin bats "REQUIRE_GPU=1 bats tests/library/parity.bats (kernels, async copies, memory accounting, 2 ranks on one GPU)"
    step_limit=240 step env REQUIRE_GPU=1 bats --tap tests/library/parity.bats || return 0
    dry || verdict PASS "$(grep -c '^ok' "$work/logs/bats.log") tests ok ($(grep -c '# skip' "$work/logs/bats.log") of them skipped), none failed"
}

group_overlap() {
    if [[ $DEVICE != cuda ]]; then
        skip_check copy-compute "needs a GPU (rehearsal on the CPU)"
        return
    fi
    begin copy-compute "a copy on the copy stream overlaps matmuls on the compute stream (build/tests/test_overlap)"
    step "$BUILD/tests/test_overlap" || return 0
    dry && return 0
    # the numbers under the header "matmuls copy_MiB kernel_ms copy_ms both_ms serial_ms overlap"
    local gbps
    gbps="$(awk '$1 == "matmuls" { getline; printf "%.1f", $2 * 1.048576 / $4 }' "$work/logs/copy-compute.log")"
    verdict PASS "$(grep -m1 '^PASS' "$work/logs/copy-compute.log"); pinned copies at $gbps GB/s (up then down, one stream)"
}

# name ranks program flags: the layouts of chapters 02-06 compared with 01
LAYOUTS=(
    "02-flat 4 02_data_parallel --dp-mode flat"
    "02-overlap-ring 4 02_data_parallel --dp-mode overlap --allreduce ring --bucket-mb 0.05"
    "03-layer-dp2 4 03_model_parallel --mp layer --dp 2"
    "03-tensor-tp2-dp2 4 03_model_parallel --mp tensor --tp 2 --dp 2"
    "04-1f1b-pp4 4 04_pipeline --schedule 1f1b --pp 4 --micro 4"
    "04-gpipe-pp2-dp2 4 04_pipeline --schedule gpipe --pp 2 --dp 2 --micro 2"
    "05-zero1 4 05_zero --zero 1"
    "05-zero2 4 05_zero --zero 2"
    "05-zero3-prefetch 4 05_zero --zero 3 --prefetch 1"
    "06-offload 1 06_offload --offload"
    "06-offload-pp2-dp2 4 06_offload --offload --pp 2 --dp 2 --micro 2"
    "06-offload-activations 1 06_offload --offload --recompute --offload-activations"
    "06-offload-params 1 06_offload --offload --offload-params"
)

group_chapters() {
    local precision
    for precision in $PRECISIONS; do
        layouts_against_01 "$precision" "${LAYOUTS[@]}"
        context_parallel_check "$precision"
    done
}
# layouts_against_01 PRECISION LINE...: 01 on the CPU against the device (on a
# GPU), then each line's layout ("name ranks program flags") against 01.
layouts_against_01() {
    local precision="$1" line name ranks program flags
    shift
    [[ $DEVICE == cuda ]] && chapter01_on_cpu "$precision"
    for line in "$@"; do
        read -r name ranks program flags <<<"$line"
        # shellcheck disable=SC2086 # flags: several words
        layout_check "$name" "$ranks" "$(comm_for "$ranks")" "$program" "$precision" $flags
    done
}
# 03 --cp 2 (ring attention: kernels.h's block forward, merge and block
# backward on the device) against 01 on the device. CUDA's transports (staged,
# nccl) cannot post sends yet, so the ring exchanges each block after its
# computation (--cp-send auto chooses blocking there).
context_parallel_check() { # PRECISION
    layout_check 03-cp2 2 "$(comm_for 2)" 03_model_parallel "$1" --cp 2
    layout_check 03-ulysses-cp2 2 "$(comm_for 2)" 03_model_parallel "$1" --cp 2 --cp-mode ulysses
}
chapter01_on_cpu() { # PRECISION
    begin "01-cpu-$1" "01 on the CPU against 01 on CUDA, $1 ${ref_flags[*]}"
    reference "$1"
    local out="$work/$check_group/01-cpu-$1"
    train 1 01_single_gpu --device cpu "${MODEL[@]}" --steps "$STEPS" --precision "$1" "${ref_flags[@]}" --out "$out"
    step "${cmd[@]}" || return 0
    compare "01-cpu" 01_single_gpu 1 - "$1" "$ref" "$out" "$(tolerance "$1")" "$STEPS"
}

# The tied embedding (--tie-embeddings: the head reads wte): 01 tied on CUDA
# against 01 tied on the CPU, then the layouts that share or shard the tied
# matrix against 01 tied on CUDA: the first and last pipeline stages summing its
# gradient (04), ZeRO counting it once (05), the offloaded optimizer (06).
TIED_LAYOUTS=(
    "04-tied-1f1b-pp2-dp2 4 04_pipeline --schedule 1f1b --pp 2 --dp 2 --micro 2"
    "05-tied-zero3 4 05_zero --zero 3 --prefetch 1"
    "06-tied-offload 1 06_offload --offload"
)
group_tied() {
    local precision
    ref_flags=(--tie-embeddings)
    for precision in $PRECISIONS; do
        layouts_against_01 "$precision" "${TIED_LAYOUTS[@]}"
    done
    ref_flags=()
}

# The mixture of experts (common/model/moe.h), with drops: 01 with experts on
# CUDA against 01 with experts on the CPU, then 02's replicas against it.
EXPERTS_FLAGS=(--experts 3 --top-k 2 --capacity-factor 1.25)
EXPERTS_LAYOUTS=(
    "02-experts-flat-dp2 2 02_data_parallel --dp-mode flat"
)
group_experts() {
    local precision
    ref_flags=("${EXPERTS_FLAGS[@]}")
    for precision in $PRECISIONS; do
        layouts_against_01 "$precision" "${EXPERTS_LAYOUTS[@]}"
    done
    ref_flags=()
}

group_nccl() {
    local precision
    if [[ $DEVICE != cuda ]]; then
        skip_check world-size-1 "NCCL needs CUDA (rehearsal on the CPU)"
        return
    fi
    for precision in $PRECISIONS; do
        layout_check 05-zero2-nccl 1 nccl 05_zero "$precision" --zero 2
        layout_check 05-zero3-prefetch-nccl 1 nccl 05_zero "$precision" --zero 3 --prefetch 1
        if [[ $GPUS -ge 2 ]] || dry; then # (the list shows them; they run with 2 GPUs or more)
            layout_check 02-overlap-nccl-2gpus 2 nccl 02_data_parallel "$precision" --dp-mode overlap --bucket-mb 0.05
            layout_check 04-1f1b-nccl-2gpus 2 nccl 04_pipeline "$precision" --schedule 1f1b --pp 2 --micro 4
        else
            skip_check "2-ranks-$precision" "one GPU: NCCL refuses two ranks on one GPU (the chapters group runs them staged)"
        fi
    done
}

group_offload() {
    offload_timeline
    offload_dpu
}
offload_timeline() {
    begin timeline "06 --offload on $DEVICE: the gradient copies finish inside the backward (timeline.csv)"
    local out="$work/offload/timeline"
    train 1 06_offload --device "$DEVICE" --model small --batch 8 --steps 4 --precision bf16 --offload --sample 0 \
        --quiet --eval-batches 1 --overwrite --out "$out"
    step "${cmd[@]}" || return 0
    dry && return 0
    ran_on "$out" || return 0
    # Per step after the first: the grad_d2h rows, how many lie inside the
    # step's bwd row, and the share of their time inside it.
    local said status
    said="$(csv_awk 'col("step") + 0 > 1 { n++; s[n] = col("step"); op[n] = col("op"); a[n] = col("start_us") + 0
                                      b[n] = col("end_us") + 0
                                      if (op[n] == "bwd") { bs[s[n]] = a[n]; be[s[n]] = b[n] } }
        END { for (i = 1; i <= n; i++) if (op[i] == "grad_d2h") {
                  copies++; t = s[i]; total += b[i] - a[i]
                  lo = a[i] > bs[t] ? a[i] : bs[t]; hi = b[i] < be[t] ? b[i] : be[t]
                  if (hi > lo) inside += hi - lo
                  if (a[i] >= bs[t] && b[i] <= be[t]) within++; else late[t]++ }
              for (t in late) if (late[t] > 1) bad = 1
              printf "%d gradient copies in steps 2+, %d of them inside the backward, %.0f%% of their time\n",
                     copies, within, (total > 0 ? 100 * inside / total : 0)
              exit bad || within == 0 }' "$out/timeline.csv")"
    status=$?
    echo "$said" >>"$work/logs/timeline.log"
    cp "$out/timeline.csv" "$work/offload-timeline.csv"
    if [[ $status -eq 0 ]]; then
        verdict PASS "$said"
    else
        verdict FAIL "$said (at most the last copy of a step may end after it)"
    fi
}
offload_dpu() {
    begin dpu "06 --offload --dpu equals its one-step-stale reference (--dpu-reference) bit for bit on $DEVICE"
    local base="$work/offload/dpu"
    train 1 06_offload --device "$DEVICE" "${MODEL[@]}" --steps 6 --precision bf16 --offload --dpu --out "$base"
    step "${cmd[@]}" || return 0
    train 1 06_offload --device "$DEVICE" "${MODEL[@]}" --steps 6 --precision bf16 --offload --dpu --dpu-reference \
        --out "$base-reference"
    step "${cmd[@]}" || return 0
    compare dpu 06_offload 1 mpi bf16 "$base-reference" "$base" 0 6
}

# Checkpoints: 6 steps, saved at step 3, the resumed steps 4-6 against the
# uninterrupted run on the device.
SIX=(--steps 6 --batch 8 --model tiny --layers 4 --sample 0 --quiet --eval-batches 1 --overwrite)
declare -A made=() # the runs and checkpoints made once, for several checks
group_checkpoints() {
    checkpoint_01 "$DEVICE" cpu 1e-4
    if [[ $DEVICE != cpu ]]; then # a rehearsal has checked its one pair
        checkpoint_01 "$DEVICE" "$DEVICE" 1e-5
        checkpoint_01 cpu "$DEVICE" 1e-4
    fi
    checkpoint_16bit 05-zero2 4 05_zero "$DEVICE" --zero 2
    checkpoint_16bit 06-offload-pp2-dp2 4 06_offload cpu --offload --pp 2 --dp 2 --micro 2
}
# uninterrupted PRECISION: 01's six steps on the device (made once); sets full.
uninterrupted() {
    full="$work/checkpoints/full-$1"
    [[ -n ${made[$full]:-} ]] && return 0
    train 1 01_single_gpu --device "$DEVICE" "${SIX[@]}" --precision "$1" --out "$full"
    step "${cmd[@]}" || return 1
    made[$full]=1
}
checkpoint_01() { # SAVED_ON RESUMED_ON TOLERANCE
    local d="$work/checkpoints" ck="$work/checkpoints/ck01-$1"
    begin "01-fp32-$1-to-$2" "01 saved at step 3 on $1, resumed on $2: steps 4-6 within $3 of the uninterrupted run on $DEVICE"
    uninterrupted fp32 || return 0
    if [[ -z ${made[$ck]:-} ]]; then
        train 1 01_single_gpu --device "$1" "${SIX[@]}" --stop-after 3 --save "$ck" --out "$d/first-$1"
        step "${cmd[@]}" || return 0
        step common/ckpt verify "$ck" || return 0
        made[$ck]=1
    fi
    train 1 01_single_gpu --device "$2" "${SIX[@]}" --resume "$ck" --out "$d/resumed-$1-$2"
    step "${cmd[@]}" || return 0
    compare "$check_name" 01_single_gpu 1 - fp32 "$full" "$d/resumed-$1-$2" "$3" 3
}
checkpoint_16bit() { # NAME RANKS PROGRAM RESUMED_ON FLAGS...: saved on the device in bf16, resumed by 01
    local name="$1" ranks="$2" program="$3" on="$4" d="$work/checkpoints"
    shift 4
    begin "$name-bf16-$DEVICE-to-01-$on" "$program ($*) saved on $DEVICE in bf16 on $ranks ranks, resumed by 01 on $on within 1e-2"
    uninterrupted bf16 || return 0
    train "$ranks" "$program" --device "$DEVICE" "${SIX[@]}" --precision bf16 --comm "$(comm_for "$ranks")" "$@" \
        --stop-after 3 --save "$d/ck-$name" --out "$d/first-$name"
    step "${cmd[@]}" || return 0
    step common/ckpt verify "$d/ck-$name" || return 0
    train 1 01_single_gpu --device "$on" "${SIX[@]}" --precision bf16 --resume "$d/ck-$name" --out "$d/resumed-$name"
    step "${cmd[@]}" || return 0
    compare "$check_name" 01_single_gpu 1 - bf16 "$full" "$d/resumed-$name" 1e-2 3
}

group_hostadam() {
    begin cpu-adam "06's host AdamW equals the kernel table bit for bit on every SIMD path of this CPU"
    step "$BUILD/tests/test_cpu_adam" path || return 0
    step "$BUILD/tests/test_cpu_adam" parity || return 0
    dry || verdict PASS "$(grep -m1 '^supported' "$work/logs/cpu-adam.log"); $(grep -c '^PASS' "$work/logs/cpu-adam.log") checks pass"
}

group_bench() {
    begin bf16-vs-autocast "common/scripts/bench.sh: the course in $BENCH_PRECISIONS against PyTorch under torch.autocast ($BENCH_MODELS)"
    if ! dry; then
        if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
            verdict SKIP "PyTorch is not importable by $PYTHON (set PYTHON=...)"
            return
        elif [[ $DEVICE == cuda ]] && ! "$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
            verdict SKIP "this PyTorch ($PYTHON) cannot use the GPU"
            return
        fi
    fi
    # BENCH_ZERO=0: bench.sh's prefetch and overlap row runs on CPU ranks, not a GPU check
    step_limit=480 step env BENCH_PRECISIONS="$BENCH_PRECISIONS" BENCH_MODELS="$BENCH_MODELS" BENCH_STEPS=12 BENCH_ZERO=0 \
        BENCH_REPEATS=3 BENCH_COMPILE_REPEATS="$BENCH_COMPILE" BENCH_OUT="$work/bench" PYTHON="$PYTHON" \
        common/scripts/bench.sh || return 0
    dry || {
        local compare="$work/bench/compare.csv" said status
        cp "$work/bench/bench.csv" "$work/bench.runs.csv" && cp "$compare" "$work/bench.compare.csv"
        said="$(csv_awk '{ n++; if (col("ratio_eager") == "") missing++
                           printf "%s%s %s: course/eager %s (%s..%s), MFU %s vs %s", (n > 1 ? "; " : ""), col("model"),
                                  col("precision"), col("ratio_eager"), col("ratio_eager_low"), col("ratio_eager_high"),
                                  col("course_mfu"), col("eager_mfu") }
                         END { exit missing || n == 0 }' "$compare")"
        status=$?
        if [[ $status -eq 0 ]]; then verdict PASS "$said"; else verdict FAIL "a ratio is missing: $said"; fi
    }
}

group_offloadbench() {
    begin steps "common/scripts/bench_offload.sh on $DEVICE: 06 (with and without --dpu) against 01, 04 and 05, and each offload level (activations, parameters) against --offload alone"
    step_limit=300 step env BENCH_DEVICE="$DEVICE" BENCH_REPEATS=3 BENCH_MACHINE="$slug" BENCH_OUT="$work/offloadbench" \
        common/scripts/bench_offload.sh || return 0
    dry || {
        local summary="$work/offloadbench/offload_summary.csv" configs
        cp "$work/offloadbench/offload.csv" "$work/offload.runs.csv" && cp "$summary" "$work/offload.summary.csv"
        configs="$(awk -F, 'NR > 1' "$summary" | wc -l)"
        if [[ $configs -eq 11 ]]; then
            verdict PASS "$(csv_awk '{ printf "%s%s %s ms (x%s%s)", (NR > 2 ? "; " : ""), col("config"), col("median_step_ms"),
                col("relative"), col("relative_offload") == "" ? "" : ", x" col("relative_offload") " of --offload" }' "$summary")"
        else
            verdict FAIL "$configs configurations in $summary, expected 11"
        fi
    }
}

group_calibrate() {
    begin machine "common/plan --calibrate on $DEVICE: the planner's constants of this machine"
    local quick=()
    [[ $DEVICE == cpu ]] && quick=(--quick) # the rehearsal: seconds, not a measurement
    step_limit=300 step common/plan --calibrate "$work/calibrated.machine" --device "$DEVICE" "${quick[@]}" || return 0
    dry || verdict PASS "$(grep -v '^#' "$work/calibrated.machine" | tr '\n' ' ')"
}

group_capacity() {
    begin budget "06_offload/capacity.py at $BUDGETS on $DEVICE: the budget holds, 06 fits more than 01"
    step_limit=240 step "$PYTHON" 06_offload/capacity.py --device "$DEVICE" --budgets "$BUDGETS" --out "$work/capacity-$DEVICE" ||
        return 0
    [[ $DEVICE == cpu ]] || step_limit=240 step "$PYTHON" 06_offload/capacity.py --device cpu --budgets "$BUDGETS" \
        --out "$work/capacity-cpu" || return 0
    dry || {
        local csv="$work/capacity-$DEVICE/capacity.csv" said
        { head -1 "$csv" | sed 's/^/device,/'; for d in "$DEVICE" cpu; do
            [[ -f $work/capacity-$d/capacity.csv ]] && tail -n +2 "$work/capacity-$d/capacity.csv" | sed "s/^/$d,/"
        done | sort -u; } >"$work/capacity.csv"
        said="$(csv_awk '{ b = col("budget_bytes") + 0; layers[b, col("program")] = col("layers") + 0
              params[b, col("program")] = col("params") + 0; budgets[b] = 1
              if (col("layers") + 0 > 0 && col("peak_device_bytes") + 0 > b) { print "over budget: " $0; bad = 1 } }
            END { for (b in budgets) {
                      if (layers[b, "06"] <= layers[b, "01"]) bad = 1
                      printf "budget %d MiB: 01 %d layers, 06 %d layers (%.1fx the parameters); ", b / 1048576,
                             layers[b, "01"], layers[b, "06"], params[b, "01"] ? params[b, "06"] / params[b, "01"] : 0 }
                  exit bad }' "$csv")"
        local status=$?
        said="${said%; }"
        [[ $DEVICE == cpu ]] || said="$said CPU: $(csv_awk '{ printf "%s %s %s layers; ", col("budget_bytes") / 1048576 "M", col("program"), col("layers") }' \
            "$work/capacity-cpu/capacity.csv")"
        if [[ $status -eq 0 ]]; then verdict PASS "$said"; else verdict FAIL "$said"; fi
    }
}

# ================================ the report ================================
# Written again after every check, so that a run cut short (a device call's
# time limit) leaves every finished check in the report. A partial run
# (GPU_CHECK_ONLY) adds its section and rows to the day's report when there is
# one; a full run starts it afresh. report_init keeps what came before in
# $work/before.*, write_report puts it back followed by this run's part.

report_init() {
    mkdir -p "$results" || fail_usage "cannot create $results"
    if [[ $partial == 1 && -f $report ]]; then
        cp "$report" "$work/before.md"
        for kind in checks losses; do
            if [[ -f $stem.$kind.csv ]]; then cp "$stem.$kind.csv" "$work/before.$kind.csv"; else : >"$work/before.$kind.csv"; fi
        done
        return
    fi
    rm -f "$stem".*
    local commit gpu_info
    commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    git diff --quiet HEAD 2>/dev/null || commit="$commit (with uncommitted changes)"
    gpu_info="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
        paste -sd ';')"
    {
        echo "# GPU check: $device_label, $date_utc"
        echo
        [[ $DEVICE == cpu ]] &&
            echo "**A rehearsal on the CPU backend (GPU_CHECK_DEVICE=cpu): it tests the script, not a GPU.**" && echo
        echo "Made by \`make gpu-check\` (common/scripts/gpu_check.sh, whose header says what each check proves) at commit"
        echo "$commit."
        echo
        echo "- GPU: ${gpu_info:-none} (name, driver, memory)"
        echo "- CUDA: $(nvcc --version 2>/dev/null | sed -n 's/.*release \([^,]*\),.*/\1/p')"
        echo "- host: $(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -1), $CORES cores"
        echo "- MPI: $(mpirun --version 2>/dev/null | head -1)"
        echo "- PyTorch: $("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "not importable by $PYTHON")"
        echo "- settings: $STEPS steps per chapter run, precisions $PRECISIONS, up to 4 ranks sharing $GPUS GPU(s)"
        echo
    } >"$work/before.md"
    echo "group,check,verdict,seconds,evidence" >"$work/before.checks.csv"
    echo "check,program,ranks,comm,precision,steps,tolerance,worst_rel_diff,verdict" >"$work/before.losses.csv"
}

# write_report [final]: the report and CSVs as they stand.
passed=0 failed=0 skipped=0
write_report() {
    local row g c v s e state="in progress (the checks below are those finished so far)"
    [[ ${1:-} == final ]] && state="complete"
    passed=0 failed=0 skipped=0
    for row in "${rows[@]}"; do
        case "$(echo "$row" | cut -f3)" in
        PASS) passed=$((passed + 1)) ;;
        FAIL) failed=$((failed + 1)) ;;
        *) skipped=$((skipped + 1)) ;;
        esac
    done
    {
        cat "$work/before.md"
        echo "## Run of $started: groups$groups"
        echo
        echo "$passed passed, $failed failed, $skipped skipped; $state."
        echo
        echo "| group | check | verdict | seconds | evidence |"
        echo "|---|---|---|---|---|"
        for row in "${rows[@]}"; do
            row="${row//|//}"
            echo "| ${row//$'\t'/ | } |"
        done
        echo
        cat "$sections"
    } >"$report"
    {
        cat "$work/before.checks.csv"
        for row in "${rows[@]}"; do
            IFS=$'\t' read -r g c v s e <<<"$row"
            echo "$g,$c,$v,$s,\"${e//\"/\'}\""
        done
    } >"$stem.checks.csv"
    cat "$work/before.losses.csv" <(tail -n +2 "$work/losses.csv") >"$stem.losses.csv"
    for kind in offload-timeline bench.runs bench.compare offload.runs offload.summary capacity; do
        [[ -f $work/$kind.csv ]] && cp "$work/$kind.csv" "$stem.$kind.csv"
    done
    [[ -f $work/calibrated.machine ]] && cp "$work/calibrated.machine" "$stem.machine"
    return 0
}

# ================================ run ================================

started="$(date -u '+%Y-%m-%d %H:%M UTC')"
if dry; then
    echo "gpu-check --list: the checks and their commands (groups:$groups); nothing runs"
    echo "report: $results/gpu-check-DEVICE-$date_utc.md (DEVICE: the GPU's name, in lower case)"
else
    report_init
    write_report
fi
for check_group in $PART1 $PART2; do
    wanted "$check_group" || continue
    "group_$check_group"
done
dry && exit 0
write_report final
echo "gpu-check: $passed passed, $failed failed, $skipped skipped; report in $report"
[[ $failed -eq 0 ]]
