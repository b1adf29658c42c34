#!/usr/bin/env bash
# demo.sh: run each chapter program that exists at its demo configuration on
# the default device (a GPU if one is visible, else the CPU) and leave the
# CSVs under runs/demo/. Called by `make demo` after building.
set -euo pipefail
cd "$(dirname "$0")/.."

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
DEMO_STEPS="${DEMO_STEPS:-100}"
out=runs/demo

echo "demo: 01_single_gpu, small preset, $DEMO_STEPS steps (CSVs in $out/01_single_gpu)"
./01_single_gpu/train --model small --steps "$DEMO_STEPS" --eval-every 25 --sample 200 \
    --out "$out/01_single_gpu"
echo "demo: done; see $out/01_single_gpu/{steps,memory,run}.csv"
