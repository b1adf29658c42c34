#!/usr/bin/env bash
# bubble_bench.sh: chapter 04's four schedules' measured bubble against their
# formulas on this machine, as the demo runs them (course.md, chapter 04, "The
# demo and its plots"), with the settings a quiet measurement needs.
#
#   common/scripts/bubble_bench.sh          (after make; BUBBLE_* settings below)
#
# P = 2 stages (one rank each, one OpenMP thread each, so two cores are enough),
# the small preset with BUBBLE_LAYERS layers (32: 16 blocks a stage, so that the head,
# on the last stage, weighs about a hundredth of it; 8 blocks a piece of interleaved's V = 2),
# M = 8 micro-batches of 2 sequences, BUBBLE_STEPS steps (run.csv's
# bubble_measured is the median over the steps after the first), BUBBLE_REPEATS
# repeats interleaved: repeat 1 of every schedule, then repeat 2, ...
# Writes BUBBLE_OUT/bubbles.csv (runs/bubbles by default; BUBBLE_OUT must be new, empty or an
# earlier bubble_bench's, else it is refused, exit 2):
#   schedule,repeat,load,bubble_theory,bubble_measured,median_step_ms
# one row per run (load: the 1-minute load average when the run ended), and
# BUBBLE_OUT/bubbles_summary.csv: schedule,bubble_theory,median,min,max,
# relative (median / theory - 1), the medians over the repeats; for zb-h1
# theory_at_times, its formula at the F, B and W the runs' timelines measured,
# and relative_at_times; for every schedule replayed, the schedule replayed
# with each computation's own time from the timelines and messages taking
# none (the median over the repeats; common/python/pipeline_bubble.py), and
# relative_replayed: what the messages and the waits add to that.
set -euo pipefail
cd "$(dirname "$0")/../.."
repeats="${BUBBLE_REPEATS:-3}" steps="${BUBBLE_STEPS:-20}" out="${BUBBLE_OUT:-runs/bubbles}" layers="${BUBBLE_LAYERS:-32}"
stages=2 micro=8 # P and M: the runs' and the formulas'
export stages micro
[[ "$repeats" =~ ^[1-9][0-9]*$ ]] || { echo "bubble_bench: BUBBLE_REPEATS=$repeats (valid: a positive number)" >&2; exit 2; }
[[ "$steps" =~ ^[1-9][0-9]*$ && "$steps" -ge 3 ]] || { echo "bubble_bench: BUBBLE_STEPS=$steps (valid: 3 or more)" >&2; exit 2; }
[ -x 04_pipeline/train ] || { echo "bubble_bench: 04_pipeline/train is not built (run make)" >&2; exit 2; }
# BUBBLE_OUT holds this script's runs (--overwrite) and logs: a new name, an empty directory or its own
header="schedule,repeat,load,bubble_theory,bubble_measured,median_step_ms"
. common/scripts/outputs.sh
. common/scripts/lib.sh
output_dir_check BUBBLE_OUT "$out" bubble_bench.sh bubbles.csv "$header"
mkdir -p "$out"
echo "$header" >"$out/bubbles.csv"
for r in $(seq 1 "$repeats"); do
    for schedule in gpipe 1f1b interleaved zb-h1; do
        virtual=1
        [ "$schedule" = interleaved ] && virtual=2
        dir="$out/$schedule.r$r"
        echo "bubble_bench: repeat $r/$repeats, $schedule" >&2
        OMP_NUM_THREADS=1 common/scripts/mpirun.sh -np "$stages" ./04_pipeline/train --device cpu --model small \
            --layers "$layers" --batch $((2 * micro)) --micro "$micro" --schedule "$schedule" --virtual "$virtual" \
            --steps "$steps" --sample 0 --quiet --overwrite --out "$dir" >/dev/null
        printf '%s,%s,%s,%s,%s,%s\n' "$schedule" "$r" "$(cut -d' ' -f1 /proc/loadavg)" "$(column "$dir/run.csv" bubble_theory)" \
            "$(column "$dir/run.csv" bubble_measured)" "$(column "$dir/run.csv" median_step_ms)" >>"$out/bubbles.csv"
    done
done
python3 - "$out" >"$out/bubbles_summary.csv" <<'PY'
import os, sys
sys.path.insert(0, "common/python")
from pipeline_bubble import timeline_replay, zb_h1_formula_measured
from tool import median, read_csv
out, P, M = sys.argv[1], int(os.environ["stages"]), int(os.environ["micro"])
rows = read_csv(os.path.join(out, "bubbles.csv"), "bubble_bench.sh's bubbles.csv")


def median_of(values):
    """The median of the values that are there (a theory needs a timeline), or None."""
    values = [v for v in values if v is not None]
    return median(values) if values else None


print("schedule,bubble_theory,median,min,max,relative,theory_at_times,relative_at_times,replayed,relative_replayed")
for s in dict.fromkeys(r["schedule"] for r in rows):
    m = [float(r["bubble_measured"]) for r in rows if r["schedule"] == s]
    theory = float(next(r["bubble_theory"] for r in rows if r["schedule"] == s))
    med = median(m)
    line = f"{s},{theory:.4f},{med:.4f},{min(m):.4f},{max(m):.4f},{med / theory - 1:+.2f}"
    dirs = [os.path.join(out, f"{s}.r{r['repeat']}") for r in rows if r["schedule"] == s]
    timed = median_of(zb_h1_formula_measured(d, P, M) for d in dirs) if s == "zb-h1" else None
    for at in (timed, median_of(timeline_replay(d, P) for d in dirs)):
        line += f",{at:.4f},{med / at - 1:+.2f}" if at else ",,"
    print(line)
PY
cat "$out/bubbles_summary.csv"
