#!/usr/bin/env bash
# bench.sh: the benchmark suite behind `make bench`.
#
# Trains 01_single_gpu/train on the default device (a GPU when
# build/tests/gpu_probe finds one, else the CPU) for a few presets, each
# BENCH_REPEATS times, and, when PyTorch is importable, the same model and
# training step in PyTorch (common/python/pytorch_gpt.py) right after each repeat,
# interleaved so that both see the same machine load: eager PyTorch every
# repeat, and torch.compile (default settings) BENCH_COMPILE_REPEATS times (it
# spends its first steps compiling; the median over steps leaves them out).
#
# Each side runs in the settings its users would use, and the settings are in
# every row: the course with its recommendation (OMP_WAIT_POLICY=passive:
# threads that wait sleep instead of spinning), PyTorch with its defaults
# (threads from torch.set_num_threads, OpenMP's default waiting). These are the
# "headline" rows. On the CPU the waiting policy matters (PyTorch runs many
# short parallel regions, which passive waiting slows down), so each side is
# also measured in the other's setting: "alternative" rows (BENCH_VARIANTS=0
# leaves them out). Every configuration runs in each precision of
# BENCH_PRECISIONS:
#   fp32  strict fp32 matmuls on both sides (PyTorch's default)
#   tf32  COURSE_TF32=1: TF32 tensor-core matmuls on both sides (the course's
#         attention then also uses one TF32 product instead of three); GPU only
#   bf16  --precision bf16 (mixed precision, common/model/mixed.h; its attention one TF32
#         product, as in every 16-bit run: device.h) against PyTorch under
#         torch.autocast(bfloat16) with fp32 weights and AdamW
#   fp16  --precision fp16 against autocast(float16) with a GradScaler
# Writes, in runs/bench/:
#
#   bench.csv    device,program,model,precision,variant,settings,batch,seq,params,repeat,median_step_ms,
#                tokens_per_s,peak_device_bytes
#                one row per run; program is 01_single_gpu, pytorch_eager or
#                pytorch_compile; variant headline or alternative; settings the
#                environment and threads it ran with; median_step_ms is the
#                median over every step of the run (run.csv's); tokens_per_s =
#                batch*seq / median; peak_device_bytes: the course's run.csv,
#                PyTorch's torch.cuda.max_memory_allocated (0 on the CPU)
#   compare.csv  device,model,precision,variant,course_tokens_per_s,course_min,course_max,eager_tokens_per_s,
#                eager_min,eager_max,ratio_eager,ratio_eager_low,ratio_eager_high,verdict,
#                compile_tokens_per_s,ratio_compile,course_peak_bytes,eager_peak_bytes,
#                model_tflop_per_step,course_mfu,eager_mfu,compile_mfu
#                medians (and min, max) over the repeats; ratio = course / PyTorch,
#                so >= 1 means the course is at least as fast; ratio_eager_low and
#                _high are the ratio's extremes over the repeats (slowest course run
#                over fastest PyTorch run, and the reverse); verdict is "faster" or
#                "slower" only when the whole range is on one side of 1, else
#                "within noise". MFU = achieved model FLOP/s over the device's peak
#                for the precision, with the usual estimate of 6P + 12*L*T*C FLOPs
#                per token (forward and backward of P parameters, plus attention's
#                products); empty when the device's peak is not in the table below.
#
#   zero.csv, zero_summary.csv
#                the prefetch and overlap row: common/scripts/bench_zero.sh's files for
#                stage 3 with and without prefetch and chapter 02's flat and
#                overlapped all-reduce, on 2 CPU ranks, recommended and default
#                threads (its header says every column)
#
# Settings (environment): PYTHON (python3), BENCH_REPEATS (GPU 3, CPU 5),
# BENCH_COMPILE_REPEATS (1; 0 skips torch.compile), BENCH_VARIANTS (CPU 1, GPU 0),
# BENCH_PRECISIONS (GPU: "fp32 tf32 bf16"; CPU: "fp32 bf16"), BENCH_MODELS (the presets
# below; on the CPU, medium runs only when named here), BENCH_STEPS (steps per run;
# default per preset), BENCH_OUT (runs/bench; replaced whole, so it must be new, empty or an
# earlier bench's: anything else is refused, exit 2), OMP_NUM_THREADS (default: every core), TRAIN
# (./01_single_gpu/train), BENCH_ZERO (1; 0 leaves out the prefetch and overlap row),
# BENCH_ZERO_MODEL (small, or the first of BENCH_MODELS when that is tiny or small: the row runs
# on CPU ranks).
set -euo pipefail
cd "$(dirname "$0")/../.."

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
unset OMP_WAIT_POLICY # each run below sets its own (the course's recommendation, PyTorch's default)
PYTHON="${PYTHON:-python3}"
TRAIN="${TRAIN:-./01_single_gpu/train}"
COMPILE_REPEATS="${BENCH_COMPILE_REPEATS:-1}"
out="${BENCH_OUT:-runs/bench}"
probe="${BUILD:-build}/tests/gpu_probe"

[[ -x "$TRAIN" ]] || { echo "bench: $TRAIN is missing; run make first" >&2; exit 1; }
# BENCH_OUT is replaced whole below: a new name, an empty directory or an earlier bench's (its bench.csv)
header="device,program,model,precision,variant,settings,batch,seq,params,repeat,median_step_ms,tokens_per_s,peak_device_bytes"
. common/scripts/outputs.sh
. common/scripts/lib.sh
output_dir_check BENCH_OUT "$out" bench.sh bench.csv "$header"

# ---- the device, and the configurations it runs: "model batch steps" ----
if [[ -x "$probe" ]] && gpu_name="$("$probe" 2>/dev/null)"; then
    device=cuda
    device_label="$gpu_name"
    configs=("tiny 8 50" "small 8 50" "medium 8 30" "gpt2 8 20")
    precisions="${BENCH_PRECISIONS:-fp32 tf32 bf16}"
    REPEATS="${BENCH_REPEATS:-3}"
    VARIANTS="${BENCH_VARIANTS:-0}"
else
    device=cpu
    cpu_model="$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -1)"
    device_label="cpu ${cpu_model:-unknown} ($(getconf _NPROCESSORS_ONLN) cores; OMP_NUM_THREADS=$OMP_NUM_THREADS)"
    configs=("tiny 8 50" "small 8 30")
    # medium (about 2 s a step on one core) only when BENCH_MODELS names it
    [[ " ${BENCH_MODELS:-} " == *" medium "* ]] && configs+=("medium 8 10")
    precisions="${BENCH_PRECISIONS:-fp32 bf16}"
    REPEATS="${BENCH_REPEATS:-5}"
    VARIANTS="${BENCH_VARIANTS:-1}"
fi
if [[ -n "${BENCH_MODELS:-}" ]]; then # keep the presets named there, in this order
    chosen=()
    for config in "${configs[@]}"; do [[ " $BENCH_MODELS " == *" ${config%% *} "* ]] && chosen+=("$config"); done
    configs=("${chosen[@]}")
fi
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
echo "$header" >"$out/bench.csv"
echo "bench: device $device_label | precisions $precisions | $REPEATS repeats | OMP_NUM_THREADS=$OMP_NUM_THREADS |" \
    "results in $out"

# The --precision of a BENCH_PRECISIONS entry: tf32 is fp32 storage with TF32 matmuls.
mixed_precision() { [[ $1 == tf32 ]] && echo fp32 || echo "$1"; }

# tf32_setting PRECISION: sets tf32, env's arguments for a run: COURSE_TF32=1 for tf32, else the
# variable unset (COURSE_TF32=0 would hold a 16-bit run's attention to strict fp32: device.h).
tf32_setting() {
    if [[ $1 == tf32 ]]; then tf32=(COURSE_TF32=1); else tf32=(-u COURSE_TF32); fi
}

# One PyTorch run (eager, or compiled with --compile); its row goes into bench.csv.
pytorch_run() { # precision model batch steps repeat variant wait_policy log [--compile]
    local precision="$1" model="$2" batch="$3" steps="$4" r="$5" variant="$6" wait="$7" log="$8"
    local tmp="$out/pytorch-row.csv" tf32
    tf32_setting "$precision"
    shift 8
    rm -f "$tmp"
    (
        [[ $wait == default ]] || export OMP_WAIT_POLICY="$wait"
        env "${tf32[@]}" "$PYTHON" common/python/pytorch_gpt.py \
            --device "$device" --model "$model" --batch "$batch" --steps "$steps" --threads "$OMP_NUM_THREADS" \
            --quiet --csv "$tmp" --device-label "$device_label" --repeat "$r" \
            --precision "$(mixed_precision "$precision")" "$@"
    ) >"$log" 2>&1 || { cat "$log" >&2; echo "bench: common/python/pytorch_gpt.py $* failed" >&2; exit 1; }
    local dev prog ms tps peak
    IFS=, read -r dev prog _ _ _ _ _ ms tps peak < <(tail -1 "$tmp")
    echo "$dev,$prog,$model,$precision,$variant,threads=$OMP_NUM_THREADS OMP_WAIT_POLICY=$wait,$batch,$T,$params,$r,$ms,$tps,$peak" \
        >>"$out/bench.csv"
    printf 'bench: %-6s %-4s repeat %d  %-15s %-11s %9.1f ms/step %10.0f tokens/s\n' "$model" "$precision" "$r" \
        "$prog" "$variant" "$ms" "$tps"
}

# One run of the course's program; its row goes into bench.csv.
course_run() { # precision model batch steps repeat variant wait_policy
    local precision="$1" model="$2" batch="$3" steps="$4" r="$5" variant="$6" wait="$7"
    local run_dir="$out/runs/$model-$precision-$variant-r$r" tf32
    tf32_setting "$precision"
    (
        [[ $wait == default ]] || export OMP_WAIT_POLICY="$wait"
        env "${tf32[@]}" "$TRAIN" --device "$device" --model "$model" \
            --batch "$batch" --steps "$steps" --precision "$(mixed_precision "$precision")" --sample 0 --quiet \
            --overwrite --out "$run_dir"
    ) >"$run_dir.log" 2>&1 || { cat "$run_dir.log" >&2; echo "bench: $TRAIN failed" >&2; exit 1; }
    local run="$run_dir/run.csv" ms tps
    ms="$(column "$run" median_step_ms)" tps="$(column "$run" tokens_per_s)"
    T="$(column "$run" seq)" params="$(column "$run" params)"
    echo "$device_label,01_single_gpu,$model,$precision,$variant,OMP_NUM_THREADS=$OMP_NUM_THREADS OMP_WAIT_POLICY=$wait,$batch,$T,$params,$r,$ms,$tps,$(column "$run" peak_device_bytes)" \
        >>"$out/bench.csv"
    printf 'bench: %-6s %-4s repeat %d  %-15s %-11s %9.1f ms/step %10.0f tokens/s\n' "$model" "$precision" "$r" \
        course "$variant" "$ms" "$tps"
}

# Interleaved: every repeat runs each side (and each variant) once, back to back.
for precision in $precisions; do
    for config in "${configs[@]}"; do
        read -r model batch steps <<<"$config"
        steps="${BENCH_STEPS:-$steps}"
        for ((r = 1; r <= REPEATS; r++)); do
            course_run "$precision" "$model" "$batch" "$steps" "$r" headline passive
            [[ $VARIANTS == 1 ]] && course_run "$precision" "$model" "$batch" "$steps" "$r" alternative default
            [[ $have_torch == 1 ]] || continue
            log="$out/runs/$model-$precision-r$r"
            pytorch_run "$precision" "$model" "$batch" "$steps" "$r" headline default "$log-eager.log"
            [[ $VARIANTS == 1 ]] &&
                pytorch_run "$precision" "$model" "$batch" "$steps" "$r" alternative passive "$log-eager-passive.log"
            if [[ $r -le $COMPILE_REPEATS ]]; then
                pytorch_run "$precision" "$model" "$batch" "$steps" "$r" headline default "$log-compile.log" --compile
            fi
        done
    done
done
rm -f "$out/pytorch-row.csv"

# ---- compare.csv: medians and spreads over the repeats, course / PyTorch, and MFU ----
"$PYTHON" - "$out" <<'EOF'
import sys
sys.path.insert(0, "common/python")
from tool import median, read_csv
out = sys.argv[1]
# Dense peak FLOP/s by device name (substring) and precision, from the vendors'
# data sheets: H100 SXM5 67 TFLOPS fp32, 494.7 TF32 (989.4 is with sparsity),
# 989.4 bf16 and fp16 (1979 with sparsity); H100 PCIe 51.2 / 378 / 756;
# A100 19.5 / 156 / 312. The H200 has the H100 SXM5's compute (and more, faster memory).
PEAKS = [("H100 80GB HBM3", {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12}),
         ("H200", {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12}),
         ("H100 PCIe", {"fp32": 51.2e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12}),
         ("A100", {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12})]
PRESETS = {"tiny": (2, 64, 64), "small": (4, 128, 128), "medium": (6, 384, 256), "gpt2": (12, 768, 1024)}
rows = read_csv(f"{out}/bench.csv", "bench.sh's bench.csv")
def values(program, model, precision, variant, column):
    return [float(r[column]) for r in rows if r["program"] == program and r["model"] == model
            and r["precision"] == precision and r["variant"] == variant]
def stat(f, xs):
    return f(xs) if xs else None
def fmt(x, spec):
    return "" if x is None else format(x, spec)
def ratio(a, b):
    return None if a is None or b is None else a / b
with open(f"{out}/compare.csv", "w") as f:
    f.write("device,model,precision,variant,course_tokens_per_s,course_min,course_max,eager_tokens_per_s,eager_min,"
            "eager_max,ratio_eager,ratio_eager_low,ratio_eager_high,verdict,compile_tokens_per_s,ratio_compile,"
            "course_peak_bytes,eager_peak_bytes,model_tflop_per_step,course_mfu,eager_mfu,compile_mfu\n")
    keys = dict.fromkeys((r["model"], r["precision"], r["variant"]) for r in rows)  # in run order
    for model, precision, variant in keys:
        ours = [r for r in rows if r["program"] == "01_single_gpu" and r["model"] == model]
        theirs = [r for r in rows if r["program"] != "01_single_gpu" and r["model"] == model]
        if theirs and {r["params"] for r in ours} != {r["params"] for r in theirs}:
            sys.exit(f"bench: {model}: the PyTorch model has {theirs[0]['params']} parameters, "
                     f"the course's {ours[0]['params']}: not the same model")
        c = values("01_single_gpu", model, precision, variant, "tokens_per_s")
        e = values("pytorch_eager", model, precision, variant, "tokens_per_s")
        k = values("pytorch_compile", model, precision, variant, "tokens_per_s")
        course, eager, compiled = stat(median, c), stat(median, e), stat(median, k)
        low = ratio(stat(min, c), stat(max, e))
        high = ratio(stat(max, c), stat(min, e))
        verdict = "" if low is None else "faster" if low > 1 else "slower" if high < 1 else "within noise"
        L, C, T = PRESETS[model]
        flop_per_token = 6 * float(ours[0]["params"]) + 12 * L * T * C
        batch_tokens = float(ours[0]["batch"]) * T
        peak = next((p.get(precision) for name, p in PEAKS if name in ours[0]["device"]), None)
        def mfu(tps):
            return None if tps is None or peak is None else tps * flop_per_token / peak
        f.write(f"{ours[0]['device']},{model},{precision},{variant},{fmt(course, '.1f')},{fmt(stat(min, c), '.1f')},"
                f"{fmt(stat(max, c), '.1f')},{fmt(eager, '.1f')},{fmt(stat(min, e), '.1f')},{fmt(stat(max, e), '.1f')},"
                f"{fmt(ratio(course, eager), '.3f')},{fmt(low, '.3f')},{fmt(high, '.3f')},{verdict},"
                f"{fmt(compiled, '.1f')},{fmt(ratio(course, compiled), '.3f')},"
                f"{fmt(stat(median, values('01_single_gpu', model, precision, variant, 'peak_device_bytes')), '.0f')},"
                f"{fmt(stat(median, values('pytorch_eager', model, precision, variant, 'peak_device_bytes')), '.0f')},"
                f"{flop_per_token * batch_tokens / 1e12:.4f},{fmt(mfu(course), '.4f')},{fmt(mfu(eager), '.4f')},"
                f"{fmt(mfu(compiled), '.4f')}\n")
        text = f"bench: {model:6s} {precision:4s} {variant:11s} course {course:10.0f} tokens/s"
        if eager:
            text += f" | eager {eager:10.0f}: ratio {course / eager:.2f} (over the repeats {low:.2f}..{high:.2f}"
            text += ", within noise: no claim either way)" if verdict == "within noise" else ")"
        if compiled:
            text += f" | compile {compiled:10.0f} (ratio {course / compiled:.2f})"
        print(text)
EOF
# ---- the communication thread: stage 3's prefetch and chapter 02's overlap ----
# common/scripts/bench_zero.sh on 2 CPU ranks, in the course's recommended thread
# setting and in the defaults (nothing exported), interleaved: zero.csv and
# zero_summary.csv, whose gain column is prefetch's (zero3) and overlap's
# (dp_overlap). BENCH_ZERO=0 leaves it out.
if [[ ${BENCH_ZERO:-1} == 1 ]]; then
    zero_model="${BENCH_ZERO_MODEL:-small}"
    # the first of BENCH_MODELS when the CPU ranks run it in seconds (tiny, small): never a GPU
    # preset (medium, gpt2) on 2 CPU ranks unless BENCH_ZERO_MODEL asks for it
    first="${configs[0]%% *}"
    [[ -n "${BENCH_MODELS:-}" && -z "${BENCH_ZERO_MODEL:-}" && ($first == tiny || $first == small) ]] &&
        zero_model="$first"
    BENCH_RANKS=2 BENCH_REPEATS="$REPEATS" BENCH_MODEL="$zero_model" BENCH_DEVICE=cpu BENCH_OUT="$out" \
        BENCH_CONFIGS="zero3 zero3_prefetch0 dp_flat dp_overlap" common/scripts/bench_zero.sh | grep -v '^bench_zero: 2 ranks,'
fi
echo "bench: done; see $out/bench.csv and $out/compare.csv (ratio = course / PyTorch)," \
    "$out/zero_summary.csv (prefetch and overlap)"
