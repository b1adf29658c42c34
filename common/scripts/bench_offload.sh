#!/usr/bin/env bash
# bench_offload.sh: chapter 06's benchmark: what moving the optimizer to the
# host costs in step time, what the delayed update (--dpu) buys back, and the
# combined trainer against chapters 04 and 05 on the same ranks, for one
# model, one global batch and one precision.
#
#   common/scripts/bench_offload.sh    (after make; BENCH_* settings below)
#
# The configurations, run one after another within each of BENCH_REPEATS
# repeats, so that every one sees the same machine load:
#
#   config          ranks  program and flags
#   01              1      01_single_gpu/train: everything on the device
#   06_offload      1      06_offload/train --offload
#   06_offload_dpu  1      06_offload/train --offload --dpu
#   04_pp2_dp2      4      04_pipeline/train --pp 2 --dp 2 (1F1B, BENCH_MICRO micro-batches)
#   05_zero2        4      05_zero/train --zero 2 (4 replicas)
#   06_pp2_dp2      4      06_offload/train --pp 2 --dp 2 --zero 2 --offload (BENCH_MICRO)
#   06_pp2_dp2_dpu  4      the same with --dpu
#   06_offload_recompute  1  06_offload/train --offload --recompute
#   06_offload_act        1  the same with --offload-activations (the checkpoints on the host)
#   06_offload_params     1  06_offload/train --offload --offload-params (the weights on the host)
#   06_offload_params_act 1  --offload --offload-params --recompute --offload-activations
#
# (--dpu with its default --dpu-warmup 1: every step but the first is delayed.)
# The last four are the offload levels: each against --offload alone
# (relative_offload), --offload-activations against --recompute's own cost.
# Writes, in BENCH_OUT (runs/bench):
#
#   offload.csv          machine,device,precision,model,batch,micro,steps,threads,config,ranks,repeat,
#                        median_step_ms,median_opt_ms,peak_device_bytes,peak_host_bytes,pcie_bytes_per_step,
#                        bytes_sent_per_step,d2h_bytes_per_step,h2d_bytes_per_step,copy_ms,compute_ms
#                        one row per run: run.csv's median step (the first, warm-up
#                        step left out), the median over the same steps of
#                        steps.csv's opt_ms (the update: on the host for 06, with
#                        --dpu only the wait for the previous step's), run.csv's
#                        peak device bytes (the largest rank's), the largest rank's
#                        peak host bytes (06's pinned state; 0 for 01, 04, 05),
#                        and 06's PCIe bytes per rank per step, both ways (0 for the
#                        others), and the bytes each rank sent per step (empty where
#                        the program does not report them: 01, 04); 06's bytes to the
#                        host and to the device per step (steps.csv's d2h_bytes and h2d_bytes,
#                        the median over the same steps), and from rank 0's timeline.csv
#                        (04-06), per step, the time its copies took (grad_d2h, param_h2d,
#                        act_d2h, act_h2d rows) and its forward and backward computation
#                        (fwd, bwd, bwd_input, bwd_weight), medians over the same steps
#   offload_summary.csv  machine,device,precision,model,batch,micro,threads,config,ranks,median_step_ms,
#                        min_step_ms,max_step_ms,relative,peak_device_bytes,peak_host_bytes,
#                        pcie_bytes_per_step,relative_offload,d2h_bytes_per_step,h2d_bytes_per_step,
#                        copy_ms,compute_ms
#                        per configuration over the repeats: the median step and
#                        its extremes; relative = median / the median of the
#                        baseline with the same ranks (01 on 1 rank, 04 on 4); relative_offload
#                        = median / 06_offload's median (06's one-rank rows); the other columns
#                        the medians of offload.csv's
#   offload.png          the medians with min..max bars and each run's peak
#                        device MiB (common/python/plot.py --offload-bench)
#
# Settings (environment): BENCH_REPEATS (3), BENCH_MODEL (small), BENCH_BATCH (8),
# BENCH_MICRO (2), BENCH_STEPS (8), BENCH_PRECISION (bf16), BENCH_DEVICE (cpu),
# BENCH_MACHINE (a name for the machine column: cpu-<model>-<N>cores),
# BENCH_OUT (runs/bench), OMP_NUM_THREADS (1 per rank).
# On a shared machine every number moves with the load: compare the
# configurations within one file, and look at min..max before believing a
# difference.
set -euo pipefail
cd "$(dirname "$0")/../.."

repeats="${BENCH_REPEATS:-3}"
model="${BENCH_MODEL:-small}"
batch="${BENCH_BATCH:-8}"
micro="${BENCH_MICRO:-2}"
steps="${BENCH_STEPS:-8}"
precision="${BENCH_PRECISION:-bf16}"
device="${BENCH_DEVICE:-cpu}"
out="${BENCH_OUT:-runs/bench}"
cpu_model="$(sed -n 's/^model name[[:space:]]*: *//p' /proc/cpuinfo | head -1 | tr 'A-Z ' 'a-z-' | cut -c1-24)"
machine="${BENCH_MACHINE:-cpu-${cpu_model:-unknown}-$(nproc)cores}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export OMP_WAIT_POLICY=passive # waiting threads sleep: the ranks share the cores
for program in 01_single_gpu/train 04_pipeline/train 05_zero/train 06_offload/train; do
    [[ -x "$program" ]] || { echo "bench_offload: $program is missing; run make first" >&2; exit 1; }
done

# BENCH_OUT: a new name or a directory; its offload.csv and offload_summary.csv new names or this script's own
header="machine,device,precision,model,batch,micro,steps,threads,config,ranks,repeat,median_step_ms,median_opt_ms,peak_device_bytes,peak_host_bytes,pcie_bytes_per_step,bytes_sent_per_step,d2h_bytes_per_step,h2d_bytes_per_step,copy_ms,compute_ms"
summary_header="machine,device,precision,model,batch,micro,threads,config,ranks,median_step_ms,min_step_ms,max_step_ms,relative,peak_device_bytes,peak_host_bytes,pcie_bytes_per_step,relative_offload,d2h_bytes_per_step,h2d_bytes_per_step,copy_ms,compute_ms"
. common/scripts/outputs.sh
. common/scripts/lib.sh
output_files_check BENCH_OUT "$out" bench_offload.sh offload.csv "$header" offload_summary.csv "$summary_header"
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
csv="$out/offload.csv"
echo "$header" >"$csv"

# CONFIG RANKS PROGRAM FLAGS... (the order of the table above)
configs=(
    "01 1 01_single_gpu/train"
    "06_offload 1 06_offload/train --offload"
    "06_offload_dpu 1 06_offload/train --offload --dpu"
    "04_pp2_dp2 4 04_pipeline/train --pp 2 --dp 2 --schedule 1f1b --micro $micro"
    "05_zero2 4 05_zero/train --zero 2"
    "06_pp2_dp2 4 06_offload/train --pp 2 --dp 2 --zero 2 --offload --micro $micro"
    "06_pp2_dp2_dpu 4 06_offload/train --pp 2 --dp 2 --zero 2 --offload --micro $micro --dpu"
    "06_offload_recompute 1 06_offload/train --offload --recompute"
    "06_offload_act 1 06_offload/train --offload --recompute --offload-activations"
    "06_offload_params 1 06_offload/train --offload --offload-params"
    "06_offload_params_act 1 06_offload/train --offload --offload-params --recompute --offload-activations"
)
# STEPS_CSV COLUMN: the column's median over the steps after the first (empty: the program has none)
steps_median() {
    local values
    values="$(column "$1" "$2" | tail -n +2)"
    if [[ -n "$values" ]]; then echo "$values" | median; fi
}
# DIR: "copy_ms,compute_ms", rank 0's per-step sums of its timeline.csv's copy and computation
# rows, medians over the steps after the first (",": no timeline.csv)
timeline_times() {
    [[ -f "$1/timeline.csv" ]] || { echo ","; return; }
    csv_awk 'col("rank") == 0 && col("step") > 1 { t = col("end_us") - col("start_us"); s = col("step"); steps[s] = 1
                 if (col("op") ~ /^(grad_d2h|param_h2d|act_d2h|act_h2d)$/) copy[s] += t
                 if (col("op") ~ /^(fwd|bwd|bwd_input|bwd_weight)$/) work[s] += t }
             END { for (s in steps) printf "%.4f %.4f\n", copy[s] / 1000, work[s] / 1000 }' "$1/timeline.csv" >"$1/times.txt"
    echo "$(cut -d' ' -f1 "$1/times.txt" | median),$(cut -d' ' -f2 "$1/times.txt" | median)"
}
for repeat in $(seq 1 "$repeats"); do
    for line in "${configs[@]}"; do
        read -r config ranks program flags <<<"$line"
        dir="$work/$config-r$repeat"
        command=("./$program" --device "$device" --model "$model" --batch "$batch" --steps "$steps"
            --precision "$precision" --sample 0 --quiet --eval-batches 1 --out "$dir" $flags)
        if [[ "$ranks" -gt 1 ]]; then
            OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
                mpirun --oversubscribe -np "$ranks" -x OMP_NUM_THREADS -x OMP_WAIT_POLICY "${command[@]}" >/dev/null
        else
            "${command[@]}" >/dev/null
        fi
        step_ms="$(column "$dir/run.csv" median_step_ms)"
        opt_ms="$(column "$dir/steps.csv" opt_ms | tail -n +2 | median)"
        device_bytes="$(column "$dir/run.csv" peak_device_bytes)"
        host_bytes="$(column "$dir/run.csv" peak_host_bytes)"
        [[ -n "$host_bytes" ]] || host_bytes="$(csv_awk 'col("space") == "host" { s[col("rank")] += col("peak_bytes") } END { m = 0; for (r in s) if (s[r] > m) m = s[r]; print m }' "$dir/memory.csv")"
        pcie="$(column "$dir/run.csv" pcie_bytes_per_step)"
        sent="$(column "$dir/run.csv" bytes_sent_per_step)"
        d2h="$(steps_median "$dir/steps.csv" d2h_bytes)" h2d="$(steps_median "$dir/steps.csv" h2d_bytes)"
        echo "$machine,$device,$precision,$model,$batch,$micro,$steps,$OMP_NUM_THREADS,$config,$ranks,$repeat,$step_ms,$opt_ms,$device_bytes,$host_bytes,${pcie:-0},$sent,${d2h:-0},${h2d:-0},$(timeline_times "$dir")" >>"$csv"
        echo "bench_offload: $config (ranks $ranks), repeat $repeat: $step_ms ms a step, $opt_ms ms in the update"
    done
done

python3 - "$csv" "$out/offload_summary.csv" "$summary_header" <<'EOF'
import sys
sys.path.insert(0, "common/python")
from tool import median, read_csv
rows = read_csv(sys.argv[1], "bench_offload.sh's offload.csv")
order, groups = [], {}
for r in rows:
    if r["config"] not in groups:
        order.append(r["config"])
    groups.setdefault(r["config"], []).append(r)
baseline = {"1": "01", "4": "04_pp2_dp2"}
med = {c: median(float(r["median_step_ms"]) for r in groups[c]) for c in order}
keys = "machine,device,precision,model,batch,micro,threads".split(",")
with open(sys.argv[2], "w") as f:
    f.write(sys.argv[3] + "\n")
    for c in order:
        g = groups[c]
        times = [float(r["median_step_ms"]) for r in g]
        base = baseline.get(g[0]["ranks"])
        rel = f"{med[c] / med[base]:.3f}" if base in med else ""
        mem = [median(float(r[k]) for r in g) for k in ("peak_device_bytes", "peak_host_bytes",
                                                                    "pcie_bytes_per_step")]
        # the offload levels against --offload alone: 06's one-rank rows
        rel_offload = (f"{med[c] / med['06_offload']:.3f}" if c.startswith("06_offload") and g[0]["ranks"] == "1"
                       and "06_offload" in med else "")
        link = [f"{median(float(r[k]) for r in g):.0f}" for k in ("d2h_bytes_per_step", "h2d_bytes_per_step")]
        timed = [f"{median(float(r[k]) for r in g):.3f}" if g[0][k] != "" else "" for k in ("copy_ms", "compute_ms")]
        f.write(",".join(g[0][k] for k in keys) + f",{c},{g[0]['ranks']},{med[c]:.2f},{min(times):.2f},"
                f"{max(times):.2f},{rel},{mem[0]:.0f},{mem[1]:.0f},{mem[2]:.0f},{rel_offload},{link[0]},{link[1]},"
                f"{timed[0]},{timed[1]}\n")
        print(f"bench_offload: {c:15s} ranks {g[0]['ranks']} {med[c]:8.1f} ms ({min(times):.1f}..{max(times):.1f})"
              + (f", {rel} x {base}" if rel else "") + (f", {rel_offload} x 06_offload" if rel_offload else "")
              + f", device {mem[0] / 1048576:.1f} MiB, host {mem[1] / 1048576:.1f} MiB, PCIe "
              f"{float(link[0]) / 1048576:.2f} MiB out + {float(link[1]) / 1048576:.2f} MiB in a step"
              + (f", copies {timed[0]} ms against {timed[1]} ms of computation" if timed[0] else ""))
EOF
plot_python=python3
for candidate in python3 /usr/bin/python3; do
    if "$candidate" -c 'import matplotlib' 2>/dev/null; then plot_python="$candidate" && break; fi
done
"$plot_python" common/python/plot.py --offload-bench "$out/offload_summary.csv" --out "$out" ||
    echo "bench_offload: no plot (common/python/plot.py needs matplotlib)"
echo "bench_offload: done; see $csv and $out/offload_summary.csv"
