#!/usr/bin/env bash
# demo.sh: run each chapter program that exists at its demo configuration on
# the default device (a GPU if one is visible, else the CPU), repeat each
# timed configuration, then draw the plots into runs/plots/<chapter>/.
# Called by `make demo` after building. DEMO_STEPS and DEMO_REPEATS override
# the defaults (40 steps, 3 repeats).
set -euo pipefail
cd "$(dirname "$0")/.."

cores=$(nproc)
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$cores}"
# OpenMP threads that spin while waiting steal the cores other ranks need.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# MPI ranks that spin in a receive steal the core their neighbour needs: let them yield.
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
steps="${DEMO_STEPS:-40}"
repeats="${DEMO_REPEATS:-3}"
runs=runs/demo

# The Python that has matplotlib (Debian's python3-matplotlib lives in /usr/bin/python3).
python=""
for candidate in python3 /usr/bin/python3; do
    if "$candidate" -c "import matplotlib" 2>/dev/null; then python="$candidate"; break; fi
done
[ -n "$python" ] || { echo "demo: no python3 with matplotlib found (make deps installs python3-matplotlib)" >&2; exit 1; }

# MPI ranks for chapter 02: one per core, at least 2 (ranks stand in for GPUs).
ranks="${DEMO_RANKS:-$(( cores < 2 ? 2 : cores ))}"
threads_per_rank=$(( cores / ranks > 0 ? cores / ranks : 1 ))
mpi() { OMP_NUM_THREADS=$threads_per_rank mpirun --oversubscribe -np "$ranks" "$@"; }

# run LABEL PROGRAM FLAGS...: every repeat of one configuration, with a progress line each.
# PROGRAM may be a command with arguments ("mpi 02_data_parallel/train").
run() {
    local label="$1" program="$2"
    shift 2
    for r in $(seq 1 "$repeats"); do
        printf 'demo: %-28s repeat %d/%d ... ' "$label" "$r" "$repeats"
        $program --steps "$steps" --sample 0 --quiet --out "$runs/$label.r$r" "$@" >"$runs/logs/$label.r$r.log" 2>&1 ||
            { echo "failed"; cat "$runs/logs/$label.r$r.log" >&2; exit 1; }
        awk -F, 'NR == 2 { printf "loss %.4f, median step %.1f ms, %.0f tok/s\n", $16, $17, $18 }' \
            "$runs/$label.r$r/run.csv"
    done
}

rm -rf "$runs"
mkdir -p "$runs/logs"
device=$(./01_single_gpu/train --steps 1 --sample 0 --quiet --out "$runs/probe" | sed -n 's/.*| device \([^|]*\) |.*/\1/p')
rm -rf "$runs/probe"
echo "demo: device $device, $steps steps per run, $repeats repeats per configuration"

# ---- chapter 01: one device; gradient accumulation trades time for activation memory ----
run 01-small 01_single_gpu/train --model small --batch 8 --micro 1 --eval-every 20
run 01-small-micro4 01_single_gpu/train --model small --batch 8 --micro 4 --eval-every 20
"$python" common/plot.py "$runs"/01-small.r* "$runs"/01-small-micro4.r* --out runs/plots/01

# ---- chapter 02: data parallelism on $ranks ranks; naive, flat and overlapped all-reduce ----
if [ -x 02_data_parallel/train ]; then
    for mode in naive flat overlap; do
        run "02-dp$ranks-$mode" "mpi 02_data_parallel/train" --model small --batch 8 --dp-mode "$mode" --bucket-mb 0.5 \
            --eval-every 20
    done
    run "02-dp$ranks-flat-ring" "mpi 02_data_parallel/train" --model small --batch 8 --dp-mode flat --allreduce ring \
        --eval-every 20
    "$python" common/plot.py "$runs"/01-small.r* "$runs"/02-dp*.r* --out runs/plots/02
    echo "demo: commbench on $ranks ranks, 1 KiB to 64 MiB"
    mpi 02_data_parallel/commbench --max-bytes 64M --out "$runs/commbench-$ranks.csv" >"$runs/logs/commbench.log"
    "$python" common/plot.py --commbench "$runs/commbench-$ranks.csv" --out runs/plots/02
fi

# ---- chapter 03: the model split over 2 ranks, by layers and inside the layers ----
if [ -x 03_model_parallel/train ]; then
    mp2() { OMP_NUM_THREADS=$(( cores / 2 > 0 ? cores / 2 : 1 )) mpirun --oversubscribe -np 2 "$@"; }
    run 03-layer2 "mp2 03_model_parallel/train" --model small --batch 8 --mp layer --eval-every 20
    run 03-tensor2 "mp2 03_model_parallel/train" --model small --batch 8 --mp tensor --eval-every 20
    "$python" common/plot.py "$runs"/01-small.r* "$runs"/03-*.r* --out runs/plots/03
fi

# ---- chapter 04: pipeline on $ranks stages; micro-batch sweep for GPipe and 1F1B ----
if [ -x 04_pipeline/train ]; then
    pipeline_steps=$(( steps / 2 > 4 ? steps / 2 : 4 ))
    for schedule in gpipe 1f1b; do
        for micro in 1 2 4 8; do
            steps=$pipeline_steps run "04-$schedule-m$micro" "mpi 04_pipeline/train" --model small --batch 16 \
                --micro "$micro" --schedule "$schedule"
        done
    done
    "$python" common/plot.py --sweep "$runs"/04-*.r* --out runs/plots/04
    "$python" common/plot.py --gantt "$runs"/04-gpipe-m4.r1 "$runs"/04-1f1b-m4.r1 --out runs/plots/04
    "$python" common/plot.py "$runs"/04-gpipe-m8.r* "$runs"/04-1f1b-m8.r* --out runs/plots/04
fi

echo "demo: a text sample from the tiny model after 300 steps (prompt|generated):"
./01_single_gpu/train --model tiny --steps 300 --quiet --sample 200 --out "$runs/01-sample" | grep '^sample:'
echo "demo: done. CSVs in $runs/, plots in runs/plots/01 .. runs/plots/04 (see course.md for what to look for)"
