#!/usr/bin/env bash
# calibrate.sh OUT [--quick] [--name NAME]: measure this machine's constants
# with the course's own tools and write them as a machine file
# (common/tools/plan_time.h has the format) that `common/plan --machine OUT`
# reads. `common/plan --calibrate OUT` runs it and then reads OUT back.
#
# One rank's device is what the course's CPU runs give it: OMP_NUM_THREADS
# threads (1 unless set), the CPU backend. Each constant, and the tool:
#   flops                     01_single_gpu/train (the small preset; --quick:
#                             tiny), FLOPs per step (common/plan's 6P + 12LTC x
#                             tokens) over run.csv's median_step_ms
#   alpha_s                   02_data_parallel/commbench on 2 ranks: the smallest
#                             all-reduce's time (8 bytes) / 2(N-1)
#   beta_bytes_per_s          the same table: the bytes a rank sends in an
#                             all-reduce, 2(N-1)/N n, between its two largest
#                             sizes over the time between them (2 MiB and 512 KiB;
#                             --quick: 512 KiB and 128 KiB)
#   h2d, d2h_bytes_per_s      06_offload/adambench's copy: copy_GBps counts bytes
#                             read and written, a copy moves half (the CPU
#                             backend's host-device copies are such copies; a
#                             GPU's pinned copies are not probed yet)
#   cpu_adam_params_per_s     adambench: the fastest cpu_adamw path in fp32
#   device_adam_params_per_s  adambench: the reference row, the kernel table's
#                             adamw_update (the CPU backend's device AdamW)
#   device_mem_bytes          /proc/meminfo's MemTotal (the CPU backend's device
#                             memory is the host's)
# --quick (the test's): tiny sizes and few repeats, a few seconds in all.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="" quick=0 name="calibrated-$(hostname | tr -c 'A-Za-z0-9_.\n-' '-')"
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --name) name="$2"; shift ;;
        -*) echo "calibrate.sh: unknown flag $1 (valid: --quick, --name NAME)" >&2; exit 2 ;;
        *) out="$1" ;;
    esac
    shift
done
[ -n "$out" ] || { echo "usage: common/scripts/calibrate.sh OUT [--quick] [--name NAME]" >&2; exit 2; }
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [ $quick = 1 ]; then
    model=tiny steps=4 max_bytes=1M adam_n=256K reps=3
else
    model=small steps=10 max_bytes=4M adam_n=16M reps=9
fi

# a column of a one-row (or the last row of a) CSV
column() { awk -F, -v name="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == name) c = i; next } c { v = $c } END { print v }' "$1"; }

# the matmul probe: chapter 01's own step
"$REPO/01_single_gpu/train" --device cpu --model $model --steps $steps --eval-batches 1 --sample 0 --quiet \
    --out "$work/01" >/dev/null
step_ms="$(column "$work/01/run.csv" median_step_ms)"
flops_per_step="$("$REPO/common/plan" --model $model --threads "$OMP_NUM_THREADS" |
    awk '/^FLOPs per token/ { f = $8 } /batch [0-9]+ = / { for (i = 1; i <= NF; i++) { if ($i == "batch") b = $(i + 1); if ($i == "seq") t = $(i + 1) } }
         END { gsub(",", "", t); printf "%.9g", f * b * t }')"

# the links: commbench on 2 ranks
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
    "$REPO/02_data_parallel/commbench" --device cpu --min-bytes 8 --max-bytes $max_bytes --step-factor 4 \
    --out "$work/comm.csv" >/dev/null

# the host: adambench, one thread per rank as the runs
"$REPO/06_offload/adambench" --n $adam_n --threads "$OMP_NUM_THREADS" --reps $reps --half none \
    --out "$work/adam" >/dev/null

awk -F, -v step_ms="$step_ms" -v fps="$flops_per_step" -v name="$name" -v model="$model" \
    -v threads="$OMP_NUM_THREADS" -v mem_kb="$(awk '/^MemTotal/ { print $2 }' /proc/meminfo)" '
    FNR == 1 { for (i = 1; i <= NF; i++) col[FILENAME, $i] = i; next }
    FILENAME ~ /comm.csv$/ && $col[FILENAME, "op"] == "allreduce" {
        n = $col[FILENAME, "size_bytes"]; t = $col[FILENAME, "time_us"] * 1e-6; N = $col[FILENAME, "ranks"]
        if (!smallest || n < smallest) { smallest = n; t_small = t }
        sizes[++k] = n; times[k] = t
    }
    FILENAME ~ /adambench.csv$/ {
        kernel = $col[FILENAME, "kernel"]; rate = $col[FILENAME, "params_per_s"]
        if (kernel == "copy") copy = $col[FILENAME, "copy_GBps"] * 1e9 / 2
        if (kernel == "reference") device_adam = rate
        if (kernel == "cpu_adamw" && rate > cpu_adam) cpu_adam = rate
    }
    END {
        alpha = t_small / (2 * (N - 1))
        beta = 2 * (N - 1) / N * (sizes[k] - sizes[k - 1]) / (times[k] - times[k - 1])
        if (!(beta > 0)) beta = 2 * (N - 1) / N * sizes[k] / times[k] # noise: the largest size alone
        printf "# written by common/scripts/calibrate.sh (common/plan --calibrate), %s threads a rank\n", threads
        printf "name = %s\n", name
        printf "# 01_single_gpu/train --model %s: %.6g FLOPs a step in %s ms (median)\n", model, fps, step_ms
        printf "flops = %.6g\n", fps / (step_ms * 1e-3)
        printf "# 02_data_parallel/commbench, 2 ranks: all-reduce of %d bytes in %.3g s; sizes %d and %d\n", smallest, t_small, sizes[k - 1], sizes[k]
        printf "alpha_s = %.6g\nbeta_bytes_per_s = %.6g\n", alpha, beta
        printf "# 06_offload/adambench: copy, cpu_adamw (fastest fp32 path), reference\n"
        printf "h2d_bytes_per_s = %.6g\nd2h_bytes_per_s = %.6g\n", copy, copy
        printf "cpu_adam_params_per_s = %.6g\ndevice_adam_params_per_s = %.6g\n", cpu_adam, device_adam
        printf "# /proc/meminfo MemTotal\ndevice_mem_bytes = %.0f\n", mem_kb * 1024
    }' "$work/comm.csv" "$work/adam/adambench.csv" >"$work/machine"
mv "$work/machine" "$out"
