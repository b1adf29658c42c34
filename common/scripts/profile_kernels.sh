#!/usr/bin/env bash
# profile_kernels.sh: per-kernel GPU time of one training step, by kind of kernel.
#
#   common/scripts/profile_kernels.sh LABEL OUT_DIR [train flags...]
#
# Runs 01_single_gpu/train (TRAIN=... for another build, or another chapter:
# every chapter's run harness, common/run/harness.h, profiles the same way) under
# Nsight Compute for 3 steps and records step 3 only (COURSE_PROFILE_STEP=3
# switches the profiler on for that step; the first steps warm up cuBLAS and
# the caches).
# ncu runs kernels one at a time with its own clock control turned off, so the
# sum is close to, but not the same as, the step time the program reports.
# Writes OUT_DIR/LABEL.ncu.csv (ncu's rows) and OUT_DIR/LABEL.kernels.csv
# (label,category,kernel,calls,time_us; see common/python/kernel_breakdown.py).
# Default flags: --model gpt2 --batch 8. Needs ncu and a GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $# -ge 2 ]] || { echo "usage: common/scripts/profile_kernels.sh LABEL OUT_DIR [train flags...]" >&2; exit 2; }
label="$1" out="$2"
shift 2
flags=("$@")
[[ ${#flags[@]} -gt 0 ]] || flags=(--model gpt2 --batch 8)
TRAIN="${TRAIN:-./01_single_gpu/train}"
# OUT_DIR's LABEL.kernels.csv: a new name or an earlier profile's (its header). LABEL.ncu.csv holds
# ncu's and the program's lines, no header of its own: replaced only beside that earlier profile's table.
. common/scripts/outputs.sh
output_files_check OUT_DIR "$out" profile_kernels.sh "$label.kernels.csv" "label,category,kernel,calls,time_us"
if [ -d "$out" ]; then
    output_file_check OUT_DIR "$out/$label.ncu.csv" "" "profile's" "*" # a directory, a device: refused
    [ ! -e "$out/$label.ncu.csv" ] || [ -f "$out/$label.kernels.csv" ] ||
        output_refuse "OUT_DIR $out/$label.ncu.csv: exists and is not an earlier profile's (no $label.kernels.csv beside it; valid: a new name or an earlier profile's)"
fi
command -v ncu >/dev/null || { echo "profile_kernels: ncu (Nsight Compute) is not on PATH" >&2; exit 1; }
mkdir -p "$out"
COURSE_PROFILE_STEP=3 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
    "$TRAIN" --device cuda "${flags[@]}" --steps 3 --sample 0 --quiet --overwrite --out "$out/$label.run" \
    >"$out/$label.ncu.csv"
python3 common/python/kernel_breakdown.py ncu "$out/$label.ncu.csv" "$label" "$out/$label.kernels.csv"
