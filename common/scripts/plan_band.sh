#!/usr/bin/env bash
# plan_band.sh: how close common/plan's predicted step is to the measured one,
# over many layouts of every chapter, on this machine (course.md, "Plan before
# you run"; tests/tools/plan_time.bats checks five of them against a fixed band).
#
#   common/scripts/plan_band.sh          (after make; BAND_* settings below)
#
# For each of BAND_REPEATS repeats, runs every layout below once, one after
# another (interleaved: a burst of load slows one repeat of several layouts,
# not every repeat of one), each rank with one OpenMP thread, then plans each
# layout with the same flags on the machine file BAND_MACHINE. The layouts
# (the tiny preset, batch 8; 4 layers where a stage or a chunk needs them):
#   01, 01 with --micro 2 --recompute; 02 on 2 ranks, flat and overlap; 03's
#   layer split and tensor parallelism on 2; 04 on 2 stages with gpipe, 1f1b,
#   zb-h1 and interleaved (--micro 4); 05 at stages 1, 2, 3 on 2; 06 --offload
#   on 2; 03 with --cp 2 and --mp tensor --sp on 2; 05 at stages 1 and 2 over
#   --tp 2 (dp 1). No layout has more ranks than the development machine has cores (2):
#   the time model gives each rank a device of its own, and ranks sharing a
#   core take turns (04's pp 2 x tp 2 on 4 ranks measured 75 times its plan).
# Writes, in BAND_OUT (runs/plan-band; new, empty or an earlier plan_band's, else refused, exit 2):
#   band.csv          layout,ranks,repeat,load,predicted_ms,median_step_ms,ratio
#                     one row per run: the load average when it ended, the
#                     planner's step, run.csv's median step (warm-up left
#                     out), ratio = predicted / measured
#   band_summary.csv  layout,ranks,predicted_ms,median_ms,min_ms,max_ms,ratio,ratio_min,ratio_max
#                     medians and extremes over the repeats, ratio of the medians;
#                     a last row "all" with the lowest and highest ratio of the medians
# Settings (environment): BAND_REPEATS (3), BAND_STEPS (10), BAND_MACHINE
# (common/machines/cpu-amd-epyc-2cores.machine), BAND_OUT (runs/plan-band),
# BAND_ONLY (an extended regular expression: only the layouts whose label it
# matches; default every layout).
set -euo pipefail
cd "$(dirname "$0")/../.."
repeats="${BAND_REPEATS:-3}" steps="${BAND_STEPS:-10}" out="${BAND_OUT:-runs/plan-band}"
machine="${BAND_MACHINE:-common/machines/cpu-amd-epyc-2cores.machine}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1
export OMPI_MCA_mpi_yield_when_idle=1

# label|ranks|program|the program's flags|the planner's layout flags
layouts=(
    "01|1|01_single_gpu/train||--chapter 01"
    "01-micro2-recompute|1|01_single_gpu/train|--micro 2 --recompute|--chapter 01"
    "02-flat|2|02_data_parallel/train|--dp-mode flat|--chapter 02 --dp 2"
    "02-overlap|2|02_data_parallel/train|--dp-mode overlap --bucket-mb 0.1|--chapter 02 --dp 2"
    "03-layer|2|03_model_parallel/train|--mp layer|--chapter 03 --pp 2"
    "03-tensor|2|03_model_parallel/train|--mp tensor|--chapter 03 --tp 2"
    "04-gpipe|2|04_pipeline/train|--layers 4 --micro 4 --schedule gpipe|--chapter 04 --pp 2"
    "04-1f1b|2|04_pipeline/train|--layers 4 --micro 4 --schedule 1f1b|--chapter 04 --pp 2"
    "04-zb-h1|2|04_pipeline/train|--layers 4 --micro 4 --schedule zb-h1|--chapter 04 --pp 2"
    "04-interleaved|2|04_pipeline/train|--layers 4 --micro 4 --schedule interleaved --virtual 2|--chapter 04 --pp 2"
    "05-zero1|2|05_zero/train|--zero 1|--chapter 05 --dp 2"
    "05-zero2|2|05_zero/train|--zero 2|--chapter 05 --dp 2"
    "05-zero3|2|05_zero/train|--zero 3|--chapter 05 --dp 2"
    "06-offload|2|06_offload/train|--offload|--chapter 06 --dp 2"
    "03-cp2|2|03_model_parallel/train|--cp 2|--chapter 03"
    "03-tensor-sp|2|03_model_parallel/train|--mp tensor --sp|--chapter 03 --tp 2"
    "05-zero1-tp2|2|05_zero/train|--zero 1 --tp 2|--chapter 05"
    "05-zero2-tp2|2|05_zero/train|--zero 2 --tp 2|--chapter 05"
)
flags="--device cpu --model tiny --batch 8 --steps $steps --eval-batches 1 --sample 0 --quiet --overwrite"
# BAND_OUT holds this script's runs (--overwrite) and logs: a new name, an empty directory or its own
header="layout,ranks,repeat,load,predicted_ms,median_step_ms,ratio"
. common/scripts/outputs.sh
. common/scripts/lib.sh
output_dir_check BAND_OUT "$out" plan_band.sh band.csv "$header"
mkdir -p "$out"
echo "$header" >"$out/band.csv"
for r in $(seq 1 "$repeats"); do
    for entry in "${layouts[@]}"; do
        IFS='|' read -r label np program args layout <<<"$entry"
        [[ "$label" =~ ${BAND_ONLY:-.} ]] || continue
        dir="$out/$label"
        # shellcheck disable=SC2086
        mpirun --oversubscribe -np "$np" "$program" $flags $args --out "$dir" >"$dir.log" 2>&1 ||
            { echo "plan_band: $label failed:" >&2; cat "$dir.log" >&2; exit 1; }
        # shellcheck disable=SC2086
        common/plan $flags $args $layout --threads 1 --machine "$machine" --time-csv "$dir/plan-time.csv" >/dev/null
        predicted=$(csv_awk 'col("part") == "step" { print col("exposed_ms") }' "$dir/plan-time.csv")
        measured=$(column "$dir/run.csv" median_step_ms)
        load=$(cut -d' ' -f1 /proc/loadavg)
        ratio=$(awk -v p="$predicted" -v m="$measured" 'BEGIN { printf "%.4f", p / m }')
        echo "$label,$np,$r,$load,$predicted,$measured,$ratio" >>"$out/band.csv"
        printf 'plan_band: repeat %d %-20s predicted %8.3f ms, measured %8.3f ms, ratio %.2f (load %s)\n' \
            "$r" "$label" "$predicted" "$measured" "$ratio" "$load"
    done
done
python3 - "$out" <<'PY'
import os, sys
sys.path.insert(0, "common/python")
from tool import median, read_csv
out = sys.argv[1]
rows = read_csv(os.path.join(out, "band.csv"), "plan_band.sh's band.csv")
labels = list(dict.fromkeys(r["layout"] for r in rows))
with open(os.path.join(out, "band_summary.csv"), "w") as f:
    f.write("layout,ranks,predicted_ms,median_ms,min_ms,max_ms,ratio,ratio_min,ratio_max\n")
    ratios = []
    for label in labels:
        mine = [r for r in rows if r["layout"] == label]
        measured = [float(r["median_step_ms"]) for r in mine]
        predicted = float(mine[0]["predicted_ms"])
        middle = median(measured)
        ratios.append(predicted / middle)
        f.write(f"{label},{mine[0]['ranks']},{predicted:.4f},{middle:.4f},{min(measured):.4f},{max(measured):.4f},"
                f"{predicted / middle:.4f},{predicted / max(measured):.4f},{predicted / min(measured):.4f}\n")
    f.write(f"all,,,,,,{median(ratios):.4f},{min(ratios):.4f},{max(ratios):.4f}\n")
print(f"plan_band: {len(labels)} layouts, {len(rows)} runs: predicted / measured, the medians' ratio "
      f"{min(ratios):.2f} to {max(ratios):.2f} (median {median(ratios):.2f}); {out}/band_summary.csv")
PY
