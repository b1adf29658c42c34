#!/usr/bin/env bash
# bench_zero.sh: what each ZeRO stage costs in step time, what stage 3's
# prefetch buys, and what chapter 02's overlapped all-reduce buys, in two
# thread settings.
#
#   common/scripts/bench_zero.sh          (after make; BENCH_* settings below)
#
# For each number of ranks in BENCH_RANKS, BENCH_REPEATS times, runs every
# configuration of BENCH_CONFIGS in every setting of BENCH_SETTINGS, one
# after another within a repeat, so that every configuration sees the same
# machine load (interleaved). The configurations:
#   zero0 .. zero3    05_zero/train --zero S (and --prefetch 1 at stage 3)
#   zero3_prefetch0   05_zero/train --zero 3 --prefetch 0
#   dp_flat           02_data_parallel/train --dp-mode flat
#   dp_overlap        02_data_parallel/train --dp-mode overlap (--bucket-mb 0.5)
# The settings:
#   recommended       OMP_NUM_THREADS = cores / ranks (at least 1) and
#                     OMP_WAIT_POLICY=passive exported (the course's advice)
#   default           nothing exported: what a learner gets, the programs'
#                     own defaults (common/comm/comm.h, "Cores")
# Writes, in BENCH_OUT (runs/bench):
#
#   zero.csv          device,precision,model,ranks,settings,config,repeat,median_step_ms,median_comm_ms,
#                     median_comm_busy_ms,bytes_sent_per_step
#                     one row per run: run.csv's median step (the first,
#                     warm-up step left out) and, zero* only, bytes sent; the
#                     medians over the same steps of steps.csv's comm_ms (the
#                     time the slowest rank waited on communication) and
#                     comm_busy_ms (the time the collectives ran)
#   zero_summary.csv  device,precision,model,ranks,settings,config,median_step_ms,min_step_ms,max_step_ms,
#                     relative_to_stage0,gain,gain_min,gain_max
#                     medians (and extremes) over the repeats;
#                     relative_to_stage0 = median / zero0's median (empty
#                     without zero0); gain, on the zero3 row: zero3_prefetch0's
#                     step time over zero3's, and on the dp_overlap row:
#                     dp_flat's over dp_overlap's (above 1 when prefetch or
#                     overlap is faster): the median, lowest and highest of
#                     the ratio taken within each repeat
#
# Settings (environment): BENCH_RANKS ("2 4"), BENCH_REPEATS (3), BENCH_MODEL
# (small), BENCH_FLAGS (more flags for every run, e.g. "--layers 6 --dmodel
# 96"; the model column says them too), BENCH_BATCH (8), BENCH_STEPS (8), BENCH_PRECISION (fp32),
# BENCH_DEVICE (cpu), BENCH_OUT (runs/bench), BENCH_CONFIGS (all seven above),
# BENCH_SETTINGS ("recommended default").
# On a shared machine every number moves with the load: compare configurations
# within one file, and look at min..max before believing a difference.
set -euo pipefail
cd "$(dirname "$0")/../.."

ranks_list="${BENCH_RANKS:-2 4}"
repeats="${BENCH_REPEATS:-3}"
model="${BENCH_MODEL:-small}"
read -r -a model_flags <<<"${BENCH_FLAGS:-}"
model_label="$model${BENCH_FLAGS:+ ${BENCH_FLAGS//,/ }}"
batch="${BENCH_BATCH:-8}"
steps="${BENCH_STEPS:-8}"
precision="${BENCH_PRECISION:-fp32}"
device="${BENCH_DEVICE:-cpu}"
out="${BENCH_OUT:-runs/bench}"
configs="${BENCH_CONFIGS:-zero0 zero1 zero2 zero3 zero3_prefetch0 dp_flat dp_overlap}"
settings_list="${BENCH_SETTINGS:-recommended default}"
cores="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"
for program in ./05_zero/train ./02_data_parallel/train; do
    [[ -x "$program" ]] || { echo "bench_zero: $program is missing; run make first" >&2; exit 1; }
done

# BENCH_OUT: a new name or a directory; its zero.csv and zero_summary.csv new names or this script's own
header="device,precision,model,ranks,settings,config,repeat,median_step_ms,median_comm_ms,median_comm_busy_ms,bytes_sent_per_step"
summary_header="device,precision,model,ranks,settings,config,median_step_ms,min_step_ms,max_step_ms,relative_to_stage0,gain,gain_min,gain_max"
. common/scripts/outputs.sh
. common/scripts/lib.sh
output_files_check BENCH_OUT "$out" bench_zero.sh zero.csv "$header" zero_summary.csv "$summary_header"
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
csv="$out/zero.csv"
echo "$header" >"$csv"

# the median of a column of steps.csv over every step but the first
median_after_first() { column "$1" "$2" | tail -n +2 | median; }

# the program and flags of a configuration
flags_of() {
    case "$1" in
    zero[0-2]) echo "./05_zero/train --zero ${1#zero}" ;; # --prefetch is a stage-3 flag (refused below it)
    zero3) echo "./05_zero/train --zero 3 --prefetch 1" ;;
    zero3_prefetch0) echo "./05_zero/train --zero 3 --prefetch 0" ;;
    dp_flat) echo "./02_data_parallel/train --dp-mode flat" ;;
    dp_overlap) echo "./02_data_parallel/train --dp-mode overlap --bucket-mb 0.5" ;;
    *) echo "bench_zero: unknown configuration '$1' (valid: zero0..zero3, zero3_prefetch0, dp_flat, dp_overlap)" >&2
       exit 2 ;;
    esac
}

for ranks in $ranks_list; do
    threads=$(( cores / ranks > 0 ? cores / ranks : 1 ))
    for repeat in $(seq 1 "$repeats"); do
        for settings in $settings_list; do
            case "$settings" in
            recommended) environment=(env OMP_NUM_THREADS="$threads" OMP_WAIT_POLICY=passive) ;;
            default) environment=(env -u OMP_NUM_THREADS -u OMP_WAIT_POLICY -u OMPI_MCA_mpi_yield_when_idle) ;;
            *) echo "bench_zero: unknown setting '$settings' (valid: recommended, default)" >&2; exit 2 ;;
            esac
            for config in $configs; do
                read -r -a program <<<"$(flags_of "$config")"
                dir="$work/n$ranks-$settings-$config-r$repeat"
                "${environment[@]}" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
                    mpirun --oversubscribe -np "$ranks" "${program[@]}" --device "$device" --model "$model" \
                    "${model_flags[@]}" --batch "$batch" --steps "$steps" --precision "$precision" --sample 0 --quiet \
                    --eval-batches 1 --out "$dir" >/dev/null
                step_ms="$(column "$dir/run.csv" median_step_ms)"
                comm_ms="$(median_after_first "$dir/steps.csv" comm_ms)"
                busy_ms="$(median_after_first "$dir/steps.csv" comm_busy_ms)"
                bytes="$(column "$dir/run.csv" bytes_sent_per_step)"
                echo "$device,$precision,$model_label,$ranks,$settings,$config,$repeat,$step_ms,$comm_ms,$busy_ms,$bytes" >>"$csv"
                echo "bench_zero: $ranks ranks, $settings threads, $config, repeat $repeat: $step_ms ms a step," \
                    "$comm_ms ms waiting on communication"
            done
        done
    done
done

python3 - "$csv" "$out/zero_summary.csv" "$summary_header" <<'EOF'
import sys
sys.path.insert(0, "common/python")
from tool import median, read_csv
rows = read_csv(sys.argv[1], "bench_zero.sh's zero.csv")
groups = {}
for r in rows:
    key = (r["device"], r["precision"], r["model"], int(r["ranks"]), r["settings"])
    groups.setdefault(key, {}).setdefault(r["config"], {})[r["repeat"]] = float(r["median_step_ms"])
# the configuration whose time over this one's is this one's gain
BASELINE = {"zero3": "zero3_prefetch0", "dp_overlap": "dp_flat"}
with open(sys.argv[2], "w") as f:
    f.write(sys.argv[3] + "\n")
    for (device, precision, model, ranks, settings), configs in groups.items():
        stage0 = median(configs["zero0"].values()) if "zero0" in configs else None
        for config, by_repeat in configs.items():
            times = list(by_repeat.values())
            m = median(times)
            relative = f"{m / stage0:.3f}" if stage0 else ""
            gain = ("", "", "")
            base = configs.get(BASELINE.get(config), {})
            ratios = [base[rep] / t for rep, t in by_repeat.items() if rep in base]
            if ratios:
                gain = (f"{median(ratios):.3f}", f"{min(ratios):.3f}", f"{max(ratios):.3f}")
            f.write(f"{device},{precision},{model},{ranks},{settings},{config},{m:.2f},{min(times):.2f},"
                    f"{max(times):.2f},{relative},{','.join(gain)}\n")
            text = f"bench_zero: {ranks} ranks {settings:11s} {config:16s} {m:8.1f} ms ({min(times):.1f}..{max(times):.1f})"
            if relative:
                text += f", {float(relative):.2f} x stage 0"
            if gain[0]:
                text += f", gain {gain[0]} ({gain[1]}..{gain[2]})"
            print(text)
EOF
echo "bench_zero: done; see $csv and $out/zero_summary.csv"
