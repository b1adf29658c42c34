#!/usr/bin/env bash
# calibrate.sh OUT [--quick] [--name NAME] [--device auto|cpu|cuda]: measure this
# machine's constants with the course's own tools and write them as a machine
# file (common/tools/plan_time.h has the format) that `common/plan --machine OUT`
# reads. `common/plan --calibrate OUT` runs it and then reads OUT back. OUT is a
# new name or a machine file this script wrote (its first line says so); anything
# else, a directory included, is refused before anything runs (exit 2).
#
# The device: --device (auto: cuda if common/devicebench finds a GPU). On the
# CPU backend one rank's device is what the course's CPU runs give it:
# OMP_NUM_THREADS threads (1 unless set). On a GPU the host's threads for the
# CPU AdamW are its cores per GPU (unless OMP_NUM_THREADS is set). Each constant,
# and the tool:
#   flops                     01_single_gpu/train on the device (the small preset,
#                             gpt2 on a GPU; --quick: tiny, small): the FLOPs its
#                             dry run of the same command counts (dry-work.csv, every
#                             piece; common/tools/plan_work.h) over run.csv's
#                             median_step_ms less the AdamW's time (its counted
#                             elements / device_adam_params_per_s below), as
#                             common/plan's time model adds them back
#   alpha_s                   02_data_parallel/commbench on 2 ranks: the smallest
#                             all-reduce's time (8 bytes) / 2(N-1)
#   beta_bytes_per_s          the same table: the bytes a rank sends in an
#                             all-reduce, 2(N-1)/N n, between its two largest
#                             sizes over the time between them (2 MiB and 512 KiB;
#                             --quick: 512 KiB and 128 KiB). A GPU machine with
#                             one GPU has no link to measure: alpha_s and beta
#                             are then NVLink's nominal (course.md, "The
#                             arithmetic of speed"), and the file says so
#   h2d, d2h_bytes_per_s      common/devicebench: copies from pinned host memory
#                             to the device and back (on the CPU backend, memcpy)
#   cpu_adam_params_per_s     06_offload/adambench: the fastest cpu_adamw path in fp32
#   device_adam_params_per_s  common/devicebench: the kernel table's adamw_update
#                             on device memory
#   device_mem_bytes          the GPU's memory (nvidia-smi), or /proc/meminfo's
#                             MemTotal (the CPU backend's device memory is the host's)
#   overlap                   02_data_parallel/train on 2 ranks, --dp-mode flat and
#                             --dp-mode overlap (a shape whose all-reduce is a
#                             sizeable part of the step: one sequence a rank, 32
#                             tokens on the CPU), and common/plan's prediction of
#                             both with the constants above at overlap 0 and 1:
#                             the step is linear in it, so the measured flat - overlap
#                             difference, less the predicted one at 0, over what
#                             overlap 1 hides, is the fraction; held to 0..1. With
#                             one GPU (no link) a stated 0.5, NOT MEASURED
# --quick (the test's): small sizes and few repeats, a few seconds in all.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="" quick=0 name="calibrated-$(hostname | tr -c 'A-Za-z0-9_.\n-' '-')" device=auto
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --name) name="$2"; shift ;;
        --device) device="${2:-}"; shift ;;
        -*) echo "calibrate.sh: unknown flag $1 (valid: --quick, --name NAME, --device auto|cpu|cuda)" >&2; exit 2 ;;
        *) out="$1" ;;
    esac
    shift
done
[ -n "$out" ] || { echo "usage: common/scripts/calibrate.sh OUT [--quick] [--name NAME] [--device auto|cpu|cuda]" >&2; exit 2; }
# OUT: a new name or a machine file this script wrote (its first line), before anything runs
. "$REPO/common/scripts/outputs.sh"
. "$REPO/common/scripts/lib.sh"
output_file_check calibrate.sh "$out" "a machine file of common/plan --calibrate" "--calibrate file" \
    "# written by common/scripts/calibrate.sh *"
case "$device" in auto | cpu | cuda) ;; *) echo "calibrate.sh: --device '$device' (valid: auto, cpu, cuda)" >&2; exit 2 ;; esac
threads_given="${OMP_NUM_THREADS:-}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [ $quick = 1 ]; then
    model=tiny steps=4 max_bytes=1M adam_n=256K reps=3 copy_bytes=4M
else
    model=small steps=10 max_bytes=4M adam_n=16M reps=9 copy_bytes=256M
fi

# the device's own rates first; devicebench's first line names the device that auto chose
"$REPO/common/devicebench" --device "$device" --bytes $copy_bytes --n $adam_n --reps $reps >"$work/device.txt"
backend=cpu gpus=0
if grep -q '^# common/devicebench on cuda' "$work/device.txt"; then
    backend=cuda gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
    [ "$quick" = 1 ] && model=small || model=gpt2
    [ -n "$threads_given" ] || export OMP_NUM_THREADS=$(($(nproc) / (gpus > 0 ? gpus : 1)))
fi

# the matmul probe: chapter 01's own step
"$REPO/01_single_gpu/train" --device $backend --model $model --steps $steps --eval-batches 1 --sample 0 --quiet \
    --out "$work/01" >/dev/null
step_ms="$(column "$work/01/run.csv" median_step_ms)"
# the same step's work as its dry run counts it (the dry device is the CPU's; the counts are the shapes')
"$REPO/01_single_gpu/train" --device cpu --model $model --steps 1 --sample 0 --quiet --dry-run --world 1 --rank 0 \
    --out "$work/01-dry" >/dev/null
flops_per_step="$(column "$work/01-dry/dry-work.csv" flops | awk '{ f += $1 } END { printf "%.9g", f }')"
adam_params="$(column "$work/01-dry/dry-work.csv" adam_params | awk '{ a += $1 } END { printf "%.9g", a }')"

# the links: commbench on 2 ranks (2 GPUs on a GPU machine; with one, no link to measure)
if [ $backend = cpu ] || [ "$gpus" -ge 2 ]; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
        "$REPO/02_data_parallel/commbench" --device $backend --min-bytes 8 --max-bytes $max_bytes --step-factor 4 \
        --out "$work/comm.csv" >/dev/null
else
    echo "op,ranks,size_bytes,time_us" >"$work/comm.csv" # empty: the nominal link below
fi
if [ $backend = cuda ]; then
    mem_bytes=$(($(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) * 1048576))
else
    mem_bytes=$(($(awk '/^MemTotal/ { print $2 }' /proc/meminfo) * 1024))
fi

# the host: adambench, one thread per rank as the runs
"$REPO/06_offload/adambench" --n $adam_n --threads "$OMP_NUM_THREADS" --reps $reps --half none \
    --out "$work/adam" >/dev/null

# a value of devicebench's lines (key = value)
rate() { awk -v key="$1" '$1 == key { print $3 }' "$work/device.txt"; }

csv_awk -v step_ms="$step_ms" -v fps="$flops_per_step" -v adam_params="$adam_params" -v name="$name" -v model="$model" \
    -v threads="$OMP_NUM_THREADS" -v mem_bytes="$mem_bytes" -v backend="$backend" \
    -v h2d="$(rate h2d_bytes_per_s)" -v d2h="$(rate d2h_bytes_per_s)" -v device_adam="$(rate device_adam_params_per_s)" \
    -v devicebench="$(head -1 "$work/device.txt" | sed 's/^# //')" '
    FILENAME ~ /comm.csv$/ && col("op") == "allreduce" {
        n = col("size_bytes") + 0; t = col("time_us") * 1e-6; N = col("ranks") + 0
        if (!smallest || n < smallest) { smallest = n; t_small = t }
        sizes[++k] = n; times[k] = t
    }
    FILENAME ~ /adambench.csv$/ {
        kernel = col("kernel"); rate = col("params_per_s") + 0
        if (kernel == "cpu_adamw" && rate > cpu_adam) cpu_adam = rate
    }
    END {
        printf "# written by common/scripts/calibrate.sh (common/plan --calibrate) on %s, %s threads a rank\n", backend, threads
        printf "name = %s\n", name
        # the step less its AdamW (timed by device_adam_params_per_s), unless noise leaves under half of it
        compute_s = step_ms * 1e-3 - adam_params / device_adam
        if (!(compute_s >= step_ms * 1e-3 / 2)) compute_s = step_ms * 1e-3
        printf "# 01_single_gpu/train --device %s --model %s: %.6g FLOPs a step (its dry run counted them) in %s ms (median), %.4g s of it besides AdamW\n", backend, model, fps, step_ms, compute_s
        printf "flops = %.6g\n", fps / compute_s
        if (k >= 2) {
            alpha = t_small / (2 * (N - 1))
            beta = 2 * (N - 1) / N * (sizes[k] - sizes[k - 1]) / (times[k] - times[k - 1])
            if (!(beta > 0)) beta = 2 * (N - 1) / N * sizes[k] / times[k] # noise: the largest size alone
            printf "# 02_data_parallel/commbench, 2 ranks: all-reduce of %d bytes in %.3g s; sizes %d and %d\n", smallest, t_small, sizes[k - 1], sizes[k]
        } else {
            alpha = 5e-6; beta = 4.5e11
            printf "# NOT MEASURED (one GPU: no link): NVLink nominal, course.md \"The arithmetic of speed\"\n"
        }
        printf "alpha_s = %.6g\nbeta_bytes_per_s = %.6g\n", alpha, beta
        printf "# %s\n", devicebench
        printf "h2d_bytes_per_s = %.6g\nd2h_bytes_per_s = %.6g\n", h2d, d2h
        printf "device_adam_params_per_s = %.6g\n", device_adam
        printf "# 06_offload/adambench: cpu_adamw, the fastest fp32 path\n"
        printf "cpu_adam_params_per_s = %.6g\n", cpu_adam
        printf "# %s\ndevice_mem_bytes = %.0f\n", backend == "cuda" ? "nvidia-smi memory.total" : "/proc/meminfo MemTotal", mem_bytes
        if (!(h2d > 0 && d2h > 0 && device_adam > 0 && cpu_adam > 0 && fps > 0 && step_ms > 0)) {
            print "calibrate.sh: a constant was not measured (see the file above)" > "/dev/stderr"; exit 1
        }
    }' "$work/comm.csv" "$work/adam/adambench.csv" >"$work/machine"

# the overlap: 02 flat against 02 overlap on 2 ranks, each planned at overlap 0 and 1
if [ $backend = cpu ] || [ "$gpus" -ge 2 ]; then
    if [ $backend = cuda ]; then shape=(--model "$model" --batch 2 --bucket-mb 25); else shape=(--model "$model" --seq 32 --batch 2 --bucket-mb 0.1); fi
    for mode in flat overlap; do
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
            "$REPO/02_data_parallel/train" --device $backend "${shape[@]}" --dp-mode $mode --steps $steps \
            --eval-batches 1 --sample 0 --quiet --out "$work/02-$mode" >/dev/null
        for f in 0 1; do
            { cat "$work/machine"; echo "overlap = $f"; } >"$work/machine-$f"
            "$REPO/common/plan" --chapter 02 --dp 2 "${shape[@]}" --dp-mode $mode --machine "$work/machine-$f" \
                --time-csv "$work/plan-$mode-$f.csv" >/dev/null
        done
    done
    predicted() { awk -F, '$1 == "step" { print $3 }' "$work/plan-$1-$2.csv"; }
    awk -v mf="$(column "$work/02-flat/run.csv" median_step_ms)" -v mo="$(column "$work/02-overlap/run.csv" median_step_ms)" \
        -v pf="$(predicted flat 0)" -v p0="$(predicted overlap 0)" -v p1="$(predicted overlap 1)" -v shape="${shape[*]}" 'BEGIN {
        hides = p0 - p1; f = hides > 0 ? ((mf - mo) - (pf - p0)) / hides : 0
        held = f < 0 ? 0 : f > 1 ? 1 : f
        printf "# 02_data_parallel/train %s on 2 ranks: median step %.4f ms flat, %.4f ms overlap; planned %.4f and\n", shape, mf, mo, pf
        if (hides > 0)
            printf "# %.4f at overlap 0, %.4f at 1: ((flat - overlap) - %.4f) / %.4f = %.4g%s\n", p0, p1, pf - p0, hides, f, held != f ? ", held to 0..1" : ""
        else
            printf "# %.4f at overlap 0 and at 1: nothing of that run can hide (its last bucket is all of it), so 0\n", p0
        printf "overlap = %.4g\n", held
    }' >>"$work/machine"
else
    printf '# NOT MEASURED (one GPU: no link): half of a collective beside the computation hides, assumed\noverlap = 0.5\n' \
        >>"$work/machine"
fi
mv "$work/machine" "$out"
