#!/bin/bash
# record_losses.sh [--only NAME] [--into DIR]: run each chapter in a few
# layouts on the CPU, on the frozen text tests/fixtures/text.txt, and write
# each run's step,loss as DIR/NAME.csv (default DIR: tests/fixtures/losses).
# tests/chapters/losses.bats compares a fresh run against the recorded files.
set -euo pipefail
cd "$(dirname "$0")/.."
into=tests/fixtures/losses only=""
while [ $# -gt 0 ]; do
    case "$1" in
    --only) only="$2"; shift 2 ;;
    --into) into="$2"; shift 2 ;;
    *) echo "usage: $0 [--only NAME] [--into DIR]" >&2; exit 2 ;;
    esac
done
mkdir -p "$into"
# the CPU they were recorded on: there the test asks for the same bits (add a
# line by hand for another CPU where every fixture reproduces exactly)
grep -m5 -E '^(vendor_id|cpu family|model|model name|flags)' /proc/cpuinfo | md5sum | cut -c1-16 >"$into/cpu.txt"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
common=(--device cpu --data tests/fixtures/text.txt --steps 6 --batch 12 --sample 0 --quiet --overwrite)
layouts=(
    "01|1|01_single_gpu/train|"
    "01-micro2-recompute|1|01_single_gpu/train|--micro 2 --recompute"
    "02-flat-3|3|02_data_parallel/train|--dp-mode flat"
    "02-overlap-ring-2|2|02_data_parallel/train|--dp-mode overlap --allreduce ring --bucket-mb 0.02"
    "03-layer-2|2|03_model_parallel/train|--mp layer"
    "03-tensor-2|2|03_model_parallel/train|--mp tensor"
    "04-1f1b-2|2|04_pipeline/train|--schedule 1f1b --micro 4"
    "04-gpipe-3|3|04_pipeline/train|--schedule gpipe --micro 2 --layers 3"
    "05-zero1-2|2|05_zero/train|--zero 1"
    "05-zero3-3|3|05_zero/train|--zero 3 --micro 2"
    "06-offload-2|2|06_offload/train|--offload"
    "06-offload-dpu-2|2|06_offload/train|--offload --dpu"
)
for layout in "${layouts[@]}"; do
    IFS='|' read -r name np program flags <<<"$layout"
    [ -z "$only" ] || [ "$only" = "$name" ] || continue
    out="$(mktemp -d)"
    # shellcheck disable=SC2086
    if [ "$np" = 1 ]; then
        "./$program" "${common[@]}" $flags --out "$out" >/dev/null
    else
        mpirun --oversubscribe -np "$np" "./$program" "${common[@]}" $flags --out "$out" >/dev/null
    fi
    cut -d, -f1,2 "$out/steps.csv" >"$into/$name.csv"
    rm -rf "$out"
done
