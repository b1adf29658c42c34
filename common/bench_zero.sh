#!/usr/bin/env bash
# bench_zero.sh: chapter 05's benchmark: what each ZeRO stage costs in step
# time, and what stage 3's prefetch buys.
#
#   common/bench_zero.sh          (after make; BENCH_* settings below)
#
# For each number of ranks in BENCH_RANKS, BENCH_REPEATS times, runs
# 05_zero/train at --zero 0, 1, 2, 3 (--prefetch 1) and 3 with --prefetch 0,
# one after another within a repeat, so that every configuration sees the
# same machine load. Writes, in BENCH_OUT (runs/bench):
#
#   zero.csv          device,precision,model,ranks,zero,prefetch,repeat,median_step_ms,median_comm_ms,
#                     bytes_sent_per_step
#                     one row per run: run.csv's median step (the first,
#                     warm-up step left out) and bytes, and the median over the
#                     same steps of steps.csv's comm_ms (time the slowest rank
#                     waited on communication)
#   zero_summary.csv  device,precision,model,ranks,config,median_step_ms,min_step_ms,max_step_ms,
#                     relative_to_stage0,prefetch_gain
#                     medians (and extremes) over the repeats; config is
#                     zero0 .. zero3 (prefetch 1) and zero3_prefetch0;
#                     relative_to_stage0 = median / stage 0's median;
#                     prefetch_gain (on zero3's row) = zero3_prefetch0's
#                     median / zero3's: above 1 when prefetching is faster
#
# Settings (environment): BENCH_RANKS ("2 4"), BENCH_REPEATS (3), BENCH_MODEL
# (small), BENCH_BATCH (8), BENCH_STEPS (8), BENCH_PRECISION (fp32),
# BENCH_DEVICE (cpu), BENCH_OUT (runs/bench), OMP_NUM_THREADS (1 per rank).
# On a shared machine every number moves with the load: compare configurations
# within one file, and look at min..max before believing a difference.
set -euo pipefail
cd "$(dirname "$0")/.."

ranks_list="${BENCH_RANKS:-2 4}"
repeats="${BENCH_REPEATS:-3}"
model="${BENCH_MODEL:-small}"
batch="${BENCH_BATCH:-8}"
steps="${BENCH_STEPS:-8}"
precision="${BENCH_PRECISION:-fp32}"
device="${BENCH_DEVICE:-cpu}"
out="${BENCH_OUT:-runs/bench}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export OMP_WAIT_POLICY=passive # waiting threads sleep: the ranks share the cores
TRAIN=./05_zero/train
[[ -x "$TRAIN" ]] || { echo "bench_zero: $TRAIN is missing; run make first" >&2; exit 1; }

mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
csv="$out/zero.csv"
echo "device,precision,model,ranks,zero,prefetch,repeat,median_step_ms,median_comm_ms,bytes_sent_per_step" >"$csv"

# column NAME of a CSV (header skipped)
column() { awk -F, -v name="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == name) c = i; next } c { print $c }' "$1"; }

for ranks in $ranks_list; do
    for repeat in $(seq 1 "$repeats"); do
        for config in "0 1" "1 1" "2 1" "3 1" "3 0"; do
            read -r stage prefetch <<<"$config"
            dir="$work/n$ranks-z$stage-p$prefetch-r$repeat"
            prefetch_flag=() # --prefetch is a stage-3 flag (refused below it); the CSV keeps the column
            [ "$stage" = 3 ] && prefetch_flag=(--prefetch "$prefetch")
            OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
                mpirun --oversubscribe -np "$ranks" -x OMP_NUM_THREADS -x OMP_WAIT_POLICY \
                "$TRAIN" --device "$device" --model "$model" --batch "$batch" --steps "$steps" \
                --precision "$precision" --zero "$stage" "${prefetch_flag[@]}" --sample 0 --quiet \
                --eval-batches 1 --out "$dir" >/dev/null
            step_ms="$(column "$dir/run.csv" median_step_ms)"
            comm_ms="$(column "$dir/steps.csv" comm_ms | tail -n +2 | sort -g |
                awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')"
            bytes="$(column "$dir/run.csv" bytes_sent_per_step)"
            echo "$device,$precision,$model,$ranks,$stage,$prefetch,$repeat,$step_ms,$comm_ms,$bytes" >>"$csv"
            echo "bench_zero: $ranks ranks, zero $stage, prefetch $prefetch, repeat $repeat: $step_ms ms a step, $comm_ms ms waiting on communication"
        done
    done
done

python3 - "$csv" "$out/zero_summary.csv" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
groups = {}
for r in rows:
    config = f"zero{r['zero']}" + ("_prefetch0" if r["zero"] == "3" and r["prefetch"] == "0" else "")
    key = (r["device"], r["precision"], r["model"], int(r["ranks"]))
    groups.setdefault(key, {}).setdefault(config, []).append(float(r["median_step_ms"]))
with open(sys.argv[2], "w") as f:
    f.write("device,precision,model,ranks,config,median_step_ms,min_step_ms,max_step_ms,relative_to_stage0,prefetch_gain\n")
    for (device, precision, model, ranks), configs in sorted(groups.items()):
        base = statistics.median(configs["zero0"])
        for config in ("zero0", "zero1", "zero2", "zero3", "zero3_prefetch0"):
            times = configs[config]
            m = statistics.median(times)
            gain = f"{statistics.median(configs['zero3_prefetch0']) / m:.3f}" if config == "zero3" else ""
            f.write(f"{device},{precision},{model},{ranks},{config},{m:.2f},{min(times):.2f},{max(times):.2f},"
                    f"{m / base:.3f},{gain}\n")
            print(f"bench_zero: {ranks} ranks {config:16s} {m:8.1f} ms ({min(times):.1f}..{max(times):.1f}), "
                  f"{m / base:.2f} x stage 0" + (f", prefetch gain {gain}" if gain else ""))
EOF
echo "bench_zero: done; see $csv and $out/zero_summary.csv"
