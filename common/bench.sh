#!/usr/bin/env bash
# bench.sh: the benchmark suite behind `make bench`.
#
# Trains 01_single_gpu/train on the default device (a GPU when
# build/tests/gpu_probe finds one, else the CPU) for a few presets, each
# BENCH_REPEATS times, and, when PyTorch is importable, the same model and
# training step in eager PyTorch (common/pytorch_gpt.py) right after each
# repeat, so that both see the same machine load. Writes, in runs/bench/:
#
#   bench.csv    device,program,model,batch,seq,params,repeat,median_step_ms,tokens_per_s
#                one row per run of the course's program; median_step_ms is
#                run.csv's (the median over every step of the run, so the slow
#                first steps do not count); tokens_per_s = batch*seq / median
#   pytorch.csv  the same columns for program=pytorch_eager
#   compare.csv  device,model,course_tokens_per_s,pytorch_tokens_per_s,ratio
#                medians over the repeats; ratio = course / pytorch, so >= 1
#                means the course is at least as fast as PyTorch eager
#
# Both sides compute in fp32; COURSE_TF32=1 allows TF32 matmuls on both.
# Settings (environment): PYTHON (python3), BENCH_REPEATS (3), BENCH_STEPS
# (steps per run; default per preset below), BENCH_OUT (runs/bench),
# OMP_NUM_THREADS (default: every core), TRAIN (./01_single_gpu/train).
set -euo pipefail
cd "$(dirname "$0")/.."

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}" # both programs: spinning threads steal shared cores
PYTHON="${PYTHON:-python3}"
TRAIN="${TRAIN:-./01_single_gpu/train}"
REPEATS="${BENCH_REPEATS:-3}"
out="${BENCH_OUT:-runs/bench}"
probe="${BUILD:-build}/tests/gpu_probe"

[[ -x "$TRAIN" ]] || { echo "bench: $TRAIN is missing; run make first" >&2; exit 1; }

# ---- the device, and the configurations it runs: "model batch steps" ----
if [[ -x "$probe" ]] && gpu_name="$("$probe" 2>/dev/null)"; then
    device=cuda
    device_label="$gpu_name"
    configs=("tiny 8 50" "small 8 50" "medium 8 30" "gpt2 8 20")
else
    device=cpu
    cpu_model="$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -1)"
    device_label="cpu ${cpu_model:-unknown} ($(getconf _NPROCESSORS_ONLN) cores; OMP_NUM_THREADS=$OMP_NUM_THREADS)"
    configs=("tiny 8 50" "small 8 30")
fi
[[ "${COURSE_TF32:-0}" == 1 ]] && device_label+=" TF32"
device_label="${device_label//,/ }" # a CSV field

have_torch=0
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "bench: PyTorch is not importable by $PYTHON; skipping the PyTorch comparison (set PYTHON=... to use another)"
elif [[ $device == cuda ]] && ! "$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    echo "bench: this PyTorch ($PYTHON) cannot use the GPU; skipping the PyTorch comparison"
else
    have_torch=1
fi

rm -rf "$out"
mkdir -p "$out/runs"
header="device,program,model,batch,seq,params,repeat,median_step_ms,tokens_per_s"
echo "$header" >"$out/bench.csv"
[[ $have_torch == 1 ]] && echo "$header" >"$out/pytorch.csv"
echo "bench: device $device_label | $REPEATS repeats | OMP_NUM_THREADS=$OMP_NUM_THREADS | results in $out"

# One column of a one-row CSV with a header, by name.
csv_field() {
    awk -F, -v name="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == name) col = i }
                          NR == 2 { print $col }' "$1"
}

for config in "${configs[@]}"; do
    read -r model batch steps <<<"$config"
    steps="${BENCH_STEPS:-$steps}"
    for ((r = 1; r <= REPEATS; r++)); do
        run_dir="$out/runs/$model-r$r"
        "$TRAIN" --device "$device" --model "$model" --batch "$batch" --steps "$steps" --sample 0 --quiet \
            --out "$run_dir" >"$run_dir.log" 2>&1 || { cat "$run_dir.log" >&2; echo "bench: $TRAIN failed" >&2; exit 1; }
        run="$run_dir/run.csv"
        ms="$(csv_field "$run" median_step_ms)"
        tps="$(csv_field "$run" tokens_per_s)"
        echo "$device_label,01_single_gpu,$model,$batch,$(csv_field "$run" seq),$(csv_field "$run" params),$r,$ms,$tps" \
            >>"$out/bench.csv"
        printf 'bench: %-6s repeat %d  course        %9.1f ms/step %10.0f tokens/s\n' "$model" "$r" "$ms" "$tps"

        if [[ $have_torch == 1 ]]; then
            "$PYTHON" common/pytorch_gpt.py --device "$device" --model "$model" --batch "$batch" --steps "$steps" \
                --threads "$OMP_NUM_THREADS" --quiet --csv "$out/pytorch.csv" --device-label "$device_label" \
                --repeat "$r" >"$run_dir-pytorch.log" 2>&1 ||
                { cat "$run_dir-pytorch.log" >&2; echo "bench: common/pytorch_gpt.py failed" >&2; exit 1; }
            IFS=, read -r _ _ _ _ _ _ _ ms tps < <(tail -1 "$out/pytorch.csv")
            printf 'bench: %-6s repeat %d  pytorch_eager %9.1f ms/step %10.0f tokens/s\n' "$model" "$r" "$ms" "$tps"
        fi
    done
done

[[ $have_torch == 1 ]] || { echo "bench: done; see $out/bench.csv"; exit 0; }

# ---- compare.csv: medians over the repeats, course / pytorch ----
"$PYTHON" - "$out" <<'EOF'
import csv, statistics, sys
out = sys.argv[1]
def load(name):
    with open(f"{out}/{name}") as f:
        return list(csv.DictReader(f))
course, torch_rows = load("bench.csv"), load("pytorch.csv")
with open(f"{out}/compare.csv", "w") as f:
    f.write("device,model,course_tokens_per_s,pytorch_tokens_per_s,ratio\n")
    for model in dict.fromkeys(r["model"] for r in course):  # in run order
        ours = [r for r in course if r["model"] == model]
        theirs = [r for r in torch_rows if r["model"] == model]
        if {r["params"] for r in ours} != {r["params"] for r in theirs}:
            sys.exit(f"bench: {model}: the PyTorch model has {theirs[0]['params']} parameters, "
                     f"the course's {ours[0]['params']}: not the same model")
        a = statistics.median(float(r["tokens_per_s"]) for r in ours)
        b = statistics.median(float(r["tokens_per_s"]) for r in theirs)
        f.write(f"{ours[0]['device']},{model},{a:.1f},{b:.1f},{a / b:.3f}\n")
        print(f"bench: {model:6s} course {a:10.0f} tokens/s | pytorch_eager {b:10.0f} tokens/s | ratio {a / b:.2f}")
EOF
echo "bench: done; see $out/bench.csv, $out/pytorch.csv and $out/compare.csv (ratio = course / pytorch)"
