#!/usr/bin/env bash
# demo.sh: run each chapter program that exists at its demo configuration on
# the default device (a GPU if one is visible, else the CPU), repeat each
# timed configuration, then draw the plots into runs/plots/<chapter>/.
# Called by `make demo` after building.
#
# Environment:
#   DEMO_STEPS    optimizer steps per run, 1..100000 (default 40; the pipeline sweep runs half,
#                 at least 4; the offload timeline plots step 10, or the last of shorter runs)
#   DEMO_REPEATS  repeats of every timed configuration, 1..100 (default 3)
#   DEMO_CORES    the cores to plan for, 1..4096 (default: this machine's, from nproc
#                 without OMP_NUM_THREADS, which GNU nproc would obey)
#   DEMO_RANKS    ranks for chapter 02 and pipeline stages for chapter 04, 1..1024
#                 (default: one per core, at most 4); each chapter then takes
#                 the nearest value its configuration allows (below)
#   DEMO_DRY_RUN  1: print every command the demo would run ("plan: ...") and
#                 run none of them; 0 (the default): run them
#   DEMO_DEVICE   cpu or cuda (default: cuda when build/tests/gpu_probe finds a
#                 GPU, else cpu). On a GPU the demo trains the medium preset
#                 instead of the small one: the small preset's kernels are too
#                 short to show a GPU computing (course.md, "Reading GPU runs")
#   DEMO_GPUS     GPUs to plan for on a GPU, 1..1024 (default: nvidia-smi's count, else 1);
#                 when ranks outnumber them, the demo says what that shows
#   DEMO_MACHINE  the machine file common/plan predicts every run's step on (default:
#                 common/machines/cpu-amd-epyc-2cores.machine, on a GPU h100-sxm.machine);
#                 runs/plots/plan/plan.png draws the predictions against the runs
#   DEMO_ONLY     the chapters to run, NN[,NN...] of 01..06 (default: all of them), e.g. 04 or
#                 02,05. A chapter's plots compare with chapter 01's run only when 01 is among them
#                 (05's precision plot then trains its own fp32 run); the plan plot at the end
#                 draws the chapters that ran
#   DEMO_3D       0 leaves out chapter 04's 3D run, the one of 8 ranks on any machine (default 1)
# Each value is checked before anything runs: one that is out of range ends the demo
# with one line naming it and its range, exit status 2. runs/demo is removed and
# written again only when it is new, empty or an earlier demo's (its demo-info.txt).
#
# The work, not the machine, sets the ranks: chapter 02's ranks must divide
# its global batch of 8 (2 or 4 ranks), chapter 03 splits the small preset
# (4 layers, 4 heads) over 2 ranks, and chapter 04 can have no more stages
# than the model has layers (2..4); its 3D run is pp 2 x tp 2 x dp 2, 8 ranks
# on any machine. Ranks stand in for GPUs, so there are at
# least 2 even on one core; each rank gets cores / ranks OpenMP threads.
#
# Repeats are interleaved: repeat 1 of every configuration of a comparison,
# then repeat 2, ..., so a burst of background load slows one repeat of
# several configurations rather than every repeat of one.
set -euo pipefail
cd "$(dirname "$0")/../.."

runs=runs/demo
# ---- every DEMO_* setting, checked before anything runs or is removed: one line and exit 2 ----
demo_refuse() {
    echo "demo: $1" >&2
    exit 2
}
# demo_count NAME VALUE LO HI: VALUE is a whole number from LO to HI
demo_count() {
    [[ "$2" =~ ^[1-9][0-9]{0,8}$ ]] && (($2 >= $3 && $2 <= $4)) || demo_refuse "$1=$2 (valid: a whole number $3..$4)"
}
cores="${DEMO_CORES:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}"
demo_count DEMO_CORES "$cores" 1 4096
steps="${DEMO_STEPS:-40}"
demo_count DEMO_STEPS "$steps" 1 100000
repeats="${DEMO_REPEATS:-3}"
demo_count DEMO_REPEATS "$repeats" 1 100
[ -z "${DEMO_RANKS:-}" ] || demo_count DEMO_RANKS "$DEMO_RANKS" 1 1024
[ -z "${DEMO_GPUS:-}" ] || demo_count DEMO_GPUS "$DEMO_GPUS" 1 1024
dry_run="${DEMO_DRY_RUN:-0}"
case "$dry_run" in 0 | 1) ;; *) demo_refuse "DEMO_DRY_RUN=$dry_run (valid: 0 or 1)" ;; esac
device_choice="${DEMO_DEVICE:-}"
case "$device_choice" in "" | cpu | cuda) ;; *) demo_refuse "DEMO_DEVICE=$device_choice (valid: cpu, cuda)" ;; esac
if [ -z "$device_choice" ]; then
    device_choice=cpu
    if [ -x build/tests/gpu_probe ] && build/tests/gpu_probe >/dev/null 2>&1; then device_choice=cuda; fi
fi
machine="${DEMO_MACHINE:-common/machines/cpu-amd-epyc-2cores.machine}"
[ "$device_choice" = cpu ] || machine="${DEMO_MACHINE:-common/machines/h100-sxm.machine}"
[ -x common/plan ] || { echo "demo: common/plan is not built (run make)" >&2; exit 1; }
if ! problem="$(common/plan --model tiny --machine "$machine" 2>&1 >/dev/null)"; then
    problem="${problem#error: }"
    [[ "$problem" == *"(valid: "* ]] || problem="$problem (valid: a machine file, as common/machines/ ships)"
    demo_refuse "DEMO_MACHINE=$machine: $problem"
fi
# DEMO_ONLY and DEMO_3D: which chapters run, and chapter 04's 8-rank run.
only="${DEMO_ONLY:-01,02,03,04,05,06}"
[[ "$only" =~ ^0[1-6](,0[1-6])*$ ]] ||
    demo_refuse "DEMO_ONLY=$only is not a list of chapters (valid: NN[,NN...] of 01 to 06, e.g. 04 or 02,05)"
run_3d="${DEMO_3D:-1}"
[[ "$run_3d" =~ ^[01]$ ]] || demo_refuse "DEMO_3D=$run_3d (valid: 1 runs chapter 04's 8-rank run, 0 leaves it out)"
# chosen NN: whether DEMO_ONLY names chapter NN.
chosen() { [[ ",$only," == *",$1,"* ]]; }
# runs/demo is removed and written again: only when it is new, empty or an earlier demo's
demo_marker="# written by common/scripts/demo.sh (make demo): removed and written again by the next demo"
. common/scripts/outputs.sh
. common/scripts/lib.sh
[ "$dry_run" = 1 ] || output_dir_check demo: "$runs" demo.sh demo-info.txt "$demo_marker"
# A dry run prints the plot commands as the demo would type them, runs/demo/04-3d-*.r* and all: an
# earlier demo's runs must not expand into the plan.
[ "$dry_run" = 0 ] || set -f
# OpenMP threads that spin while waiting steal the cores other ranks need.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# MPI ranks that spin in a receive steal the core their neighbour needs: let them yield.
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"

# The Python that has matplotlib (Debian's python3-matplotlib lives in /usr/bin/python3).
python=""
for candidate in python3 /usr/bin/python3; do
    if "$candidate" -c "import matplotlib" 2>/dev/null; then python="$candidate"; break; fi
done
if [ -z "$python" ]; then
    [ "$dry_run" = 1 ] || { echo "demo: no python3 with matplotlib found (make deps installs python3-matplotlib)" >&2; exit 1; }
    python=python3
fi

# ---- the device and the preset ----
case "$device_choice" in
    cpu) preset=small model_layers=4 ;;
    cuda) preset=medium model_layers=6 ;; # 6 heads: tp 2 divides them too
esac
gpus="${DEMO_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}"
[[ "$gpus" =~ ^[1-9][0-9]*$ ]] || gpus=1

# ---- ranks per chapter, chosen from the work ----
wanted="${DEMO_RANKS:-$(( cores < 4 ? cores : 4 ))}"
(( wanted >= 2 )) || wanted=2
dp_batch=8        # chapter 02's global batch: the ranks must divide it
dp_ranks=2        # the largest divisor of the batch not above the wish
for n in 4 8; do (( n <= wanted && dp_batch % n == 0 )) && dp_ranks=$n; done
mp_ranks=2        # chapter 03: tp 2 divides the heads (4 small, 6 medium); 2 stages of the layers
pp_stages=$(( wanted < model_layers ? wanted : model_layers ))
grid_ranks=8      # chapter 04's 3D run: pp 2 x tp 2 x dp 2, whatever the cores
if [ -n "${DEMO_RANKS:-}" ] && { (( dp_ranks != DEMO_RANKS )) || (( pp_stages != DEMO_RANKS )); }; then
    echo "demo: DEMO_RANKS=$DEMO_RANKS: chapter 02 uses $dp_ranks ranks (they must divide its batch of $dp_batch)," \
        "chapter 04 $pp_stages stages (at most $model_layers layers)"
fi

# launch NP PROGRAM ARGS...: run PROGRAM on NP ranks (NP = 1: one process, no
# MPI) with the cores shared out as OpenMP threads; in a dry run, print it.
launch() {
    local np="$1"
    shift
    local threads=$(( cores / np > 0 ? cores / np : 1 ))
    local command=("$@")
    (( np == 1 )) || command=(mpirun --oversubscribe -np "$np" "$@")
    if [ "$dry_run" = 1 ]; then
        echo "plan: OMP_NUM_THREADS=$threads ${command[*]}"
    else
        OMP_NUM_THREADS=$threads "${command[@]}"
    fi
}

# plan_layout NP PROGRAM OUT FLAGS...: common/plan's prediction of that run on
# the machine file (DEMO_MACHINE; default the shipped one of the device):
# memory.csv's rows into OUT/plan.csv, the step's parts into OUT/plan-time.csv,
# for plot.py --plan. The layout is the one the rank count gives the program
# (02, 05, 06: dp; 03: its stages or its tensor group, of np / cp ranks; 04:
# its stages, or with --pp and --tp given its replicas); a layout the planner refuses (none today) is named in
# OUT/plan.err and left out of the plot.
plan_layout() {
    local np="$1" program="$2" out="$3"
    shift 3
    local chapter="${program%%_*}" layout=() threads=$(( cores / np > 0 ? cores / np : 1 ))
    case "$chapter" in
        02 | 05 | 06) [[ " $* " == *" --dp "* ]] || layout=(--dp "$np") ;;
        03) local cp=1 args=("$@") i # --cp N: the model-parallel group is np / N ranks
            for ((i = 0; i + 1 < ${#args[@]}; i++)); do [ "${args[i]}" != --cp ] || cp="${args[i + 1]}"; done
            if [[ " $* " == *" --mp tensor "* ]]; then layout=(--tp $((np / cp))); else layout=(--pp $((np / cp))); fi ;;
        04) local pp=0 tp=1 args=("$@") i # --pp P --tp T given: the replicas are the rest
            for ((i = 0; i + 1 < ${#args[@]}; i++)); do
                case "${args[i]}" in --pp) pp="${args[i + 1]}" ;; --tp) tp="${args[i + 1]}" ;; esac
            done
            if [ "$pp" = 0 ]; then layout=(--pp "$np"); else layout=(--dp $((np / pp / tp))); fi ;;
    esac
    local command=(common/plan "$@" --chapter "$chapter" "${layout[@]}" --threads "$threads" --machine "$machine"
        --out "$out" --csv "$out/plan.csv" --time-csv "$out/plan-time.csv")
    if [ "$dry_run" = 1 ]; then
        echo "plan: ${command[*]}"
    elif ! "${command[@]}" >"$out/plan.txt" 2>"$out/plan.err"; then
        rm -f "$out/plan.csv" "$out/plan-time.csv"
    fi
}

# A comparison: `configure LABEL NP PROGRAM FLAGS...` queues one configuration
# (flags contain no spaces), `compare STEPS` runs repeat 1 of every queued
# configuration, then repeat 2, ..., with a progress line each, and empties
# the queue.
queued=()
configure() { queued+=("$*"); }
compare() {
    local run_steps="$1" r line label np program flags
    for r in $(seq 1 "$repeats"); do
        for line in "${queued[@]}"; do
            read -r label np program flags <<<"$line"
            read -ra flags <<<"$flags"
            local out="$runs/$label.r$r"
            local command=(launch "$np" "$program" --steps "$run_steps" --sample 0 --quiet --out "$out" "${flags[@]}")
            if [ "$dry_run" = 1 ]; then
                "${command[@]}"
                [ "$r" != 1 ] || plan_layout "$np" "$program" "$out" --steps "$run_steps" "${flags[@]}"
                continue
            fi
            printf 'demo: %-28s repeat %d/%d ... ' "$label" "$r" "$repeats"
            "${command[@]}" >"$runs/logs/$label.r$r.log" 2>&1 ||
                { echo "failed"; cat "$runs/logs/$label.r$r.log" >&2; exit 1; }
            csv_awk 'NR == 2 { printf "loss %.4f, median step %.1f ms, %.0f tok/s\n",
                               col("final_loss"), col("median_step_ms"), col("tokens_per_s") }' "$out/run.csv"
            [ "$r" != 1 ] || plan_layout "$np" "$program" "$out" --steps "$run_steps" "${flags[@]}"
        done
    done
    queued=()
}
# plot ARGS...: draw with common/python/plot.py (printed in a dry run).
plot() {
    if [ "$dry_run" = 1 ]; then echo "plan: $python common/python/plot.py $*"; else "$python" common/python/plot.py "$@"; fi
}

if [ "$dry_run" = 1 ]; then
    echo "demo: dry run for $cores cores: chapter 02 on $dp_ranks ranks, 03 on $mp_ranks, 04 on $pp_stages stages"
else
    rm -rf "$runs"
    mkdir -p "$runs/logs"
    echo "$demo_marker" >"$runs/demo-info.txt"
    device=$(./01_single_gpu/train --steps 1 --sample 0 --quiet --out "$runs/probe" |
        sed -n 's/.*| device \([^|]*\) |.*/\1/p')
    rm -rf "$runs/probe"
    echo "demo: device $device, $cores cores, $steps steps per run, $repeats repeats per configuration, interleaved"
    echo "demo: chapter 02 on $dp_ranks ranks, 03 on $mp_ranks ranks, 04 on $pp_stages stages"
fi
echo "demo: the $preset preset on --device $device_choice"
if [ "$device_choice" = cuda ] && (( grid_ranks > gpus )); then
    echo "demo: note: up to $grid_ranks ranks share $gpus GPU(s): they take" \
        "turns on it, so chapters 02-04 show their losses, memory and bytes, not their speed-ups" \
        "(course.md, \"Reading GPU runs\")"
fi

# chapter_01_runs: chapter 01's runs, which the later chapters' plots compare with, when DEMO_ONLY has 01.
chapter_01_runs() { if chosen 01; then printf '%s\n' "$runs"/01-"$preset".r*; fi; }

# ---- chapter 01: one device; gradient accumulation and recomputation trade time for activation memory ----
if chosen 01; then
    configure "01-$preset" 1 01_single_gpu/train --model "$preset" --device "$device_choice" --batch 8 --micro 1 --eval-every 20
    configure "01-$preset-micro4" 1 01_single_gpu/train --model "$preset" --device "$device_choice" --batch 8 --micro 4 --eval-every 20
    configure "01-$preset-recompute" 1 01_single_gpu/train --model "$preset" --device "$device_choice" --batch 8 --micro 1 --eval-every 20 --recompute
    compare "$steps"
    plot "$runs"/01-"$preset".r* "$runs"/01-"$preset"-micro4.r* "$runs"/01-"$preset"-recompute.r* --out runs/plots/01
fi

# ---- chapter 02: data parallelism; naive, flat and overlapped all-reduce ----
if chosen 02 && [ -x 02_data_parallel/train ]; then
    for mode in naive flat overlap; do
        configure "02-dp$dp_ranks-$mode" "$dp_ranks" 02_data_parallel/train --model "$preset" --device "$device_choice" \
            --batch "$dp_batch" --dp-mode "$mode" --bucket-mb 0.5 --eval-every 20
    done
    configure "02-dp$dp_ranks-flat-ring" "$dp_ranks" 02_data_parallel/train --model "$preset" --device "$device_choice" \
        --batch "$dp_batch" --dp-mode flat --allreduce ring --eval-every 20
    compare "$steps"
    plot $(chapter_01_runs) "$runs"/02-dp*.r* --out runs/plots/02
    [ "$dry_run" = 1 ] || echo "demo: commbench on $dp_ranks ranks, 1 KiB to 64 MiB"
    if [ "$dry_run" = 1 ]; then
        launch "$dp_ranks" 02_data_parallel/commbench --max-bytes 64M --out "$runs/commbench-$dp_ranks.csv"
    else
        launch "$dp_ranks" 02_data_parallel/commbench --max-bytes 64M --out "$runs/commbench-$dp_ranks.csv" \
            >"$runs/logs/commbench.log"
    fi
    plot --commbench "$runs/commbench-$dp_ranks.csv" --out runs/plots/02
fi

# ---- chapter 03: the model split over 2 ranks, by layers and inside the layers ----
if chosen 03 && [ -x 03_model_parallel/train ]; then
    configure "03-layer$mp_ranks" "$mp_ranks" 03_model_parallel/train --model "$preset" --device "$device_choice" --batch 8 --mp layer \
        --eval-every 20
    configure "03-tensor$mp_ranks" "$mp_ranks" 03_model_parallel/train --model "$preset" --device "$device_choice" --batch 8 --mp tensor \
        --eval-every 20
    compare "$steps"
    plot $(chapter_01_runs) "$runs"/03-layer*.r* "$runs"/03-tensor*.r* --out runs/plots/03
    # context parallelism: activation memory per rank against the sequence length, cp 1, 2, 4 (tiny
    # preset, 2 steps; on the CPU: ring attention has no CUDA kernels yet)
    for cp in 1 2 4; do
        for seq in 64 128 256; do
            configure "03-cp$cp-seq$seq" "$cp" 03_model_parallel/train --model tiny --device cpu --batch 4 --cp "$cp" --seq "$seq"
        done
    done
    compare 2
    plot --cp "$runs"/03-cp*.r* --out runs/plots/03
    plot --gantt "$runs"/03-cp4-seq256.r1 --out runs/plots/03 # the ring: blocks, sends in flight, waits
fi

# ---- chapter 04: pipeline stages; micro-batch sweep for GPipe and 1F1B; the four schedules' bubbles ----
if chosen 04 && [ -x 04_pipeline/train ]; then
    for schedule in gpipe 1f1b; do
        for micro in 1 2 4 8; do
            configure "04-$schedule-m$micro" "$pp_stages" 04_pipeline/train --model "$preset" --device "$device_choice" --batch 16 \
                --micro "$micro" --schedule "$schedule"
        done
    done
    compare $(( steps / 2 > 4 ? steps / 2 : 4 ))
    plot --sweep "$runs"/04-gpipe-m*.r* "$runs"/04-1f1b-m*.r* --out runs/plots/04
    plot --gantt "$runs"/04-gpipe-m4.r1 "$runs"/04-1f1b-m4.r1 --out runs/plots/04
    plot "$runs"/04-gpipe-m8.r* "$runs"/04-1f1b-m8.r* --out runs/plots/04
    # the four schedules' measured bubbles against their formulas, on the CPU, where every stage
    # computes at the same pace: M = 4P micro-batches (interleaved needs a multiple of P) of
    # 2 sequences, and 2P layers at least, so that V = 2 chunks per stage each get a block
    bubble_micro=$(( 4 * pp_stages ))
    bubble_layers=$(( 2 * pp_stages > 4 ? 2 * pp_stages : 4 ))
    for schedule in gpipe 1f1b interleaved zb-h1; do
        virtual=1
        [ "$schedule" = interleaved ] && virtual=2
        configure "04-schedule-$schedule" "$pp_stages" 04_pipeline/train --model small --layers "$bubble_layers" \
            --device cpu --batch $(( 2 * bubble_micro )) --micro "$bubble_micro" --schedule "$schedule" --virtual "$virtual"
    done
    compare $(( steps / 2 > 4 ? steps / 2 : 4 ))
    plot --bubbles "$runs"/04-schedule-gpipe.r* "$runs"/04-schedule-1f1b.r* "$runs"/04-schedule-interleaved.r* \
        "$runs"/04-schedule-zb-h1.r* --out runs/plots/04
    plot --gantt "$runs"/04-schedule-interleaved.r1 "$runs"/04-schedule-zb-h1.r1 --out runs/plots/04
    # a 3D run: pp 2 x tp 2 x dp 2 on 8 ranks (tp 2 divides both presets' heads): its Gantt chart
    # (every rank, named by its place in the grid), every rank's memory by category and the bytes
    # each axis sent per step (run.csv's bytes_AXIS_per_step)
    # (DEMO_3D=0 leaves it out)
    if [ "$run_3d" = 1 ]; then
        configure "04-3d-pp2-tp2-dp2" "$grid_ranks" 04_pipeline/train --model "$preset" --device "$device_choice" \
            --batch 16 --micro 4 --pp 2 --tp 2
        compare $(( steps / 2 > 4 ? steps / 2 : 4 ))
        plot --grid "$runs"/04-3d-pp2-tp2-dp2.r* --out runs/plots/04
        plot --gantt "$runs"/04-3d-pp2-tp2-dp2.r1 --out runs/plots/04
    fi
fi

# ---- chapter 05 opens with mixed precision: chapter 01's first run again in bf16 and fp16 ----
# once each (their losses and memory, not their speed), next to that run's first repeat in fp32
# (without chapter 01 in DEMO_ONLY, an fp32 run once too)
precision_runs=()
if chosen 05; then
    precisions="bf16 fp16" reference="$runs/01-$preset.r1"
    chosen 01 || { precisions="fp32 bf16 fp16"; reference="$runs/01-$preset-fp32"; }
    for precision in $precisions; do
        label="01-$preset-$precision"
        precision_runs+=("$runs/$label")
        if [ "$dry_run" = 1 ]; then
            launch 1 01_single_gpu/train --model "$preset" --device "$device_choice" --batch 8 --micro 1 --eval-every 20 \
                --precision "$precision" --steps "$steps" --sample 0 --quiet --out "$runs/$label"
            plan_layout 1 01_single_gpu/train "$runs/$label" --model "$preset" --device "$device_choice" --batch 8 \
                --micro 1 --eval-every 20 --precision "$precision" --steps "$steps"
            continue
        fi
        printf 'demo: %-28s once ... ' "$label"
        launch 1 01_single_gpu/train --model "$preset" --device "$device_choice" --batch 8 --micro 1 --eval-every 20 \
            --precision "$precision" --steps "$steps" --sample 0 --quiet --out "$runs/$label" >"$runs/logs/$label.log" 2>&1 ||
            { echo "failed"; cat "$runs/logs/$label.log" >&2; exit 1; }
        echo "loss $(column "$runs/$label/run.csv" final_loss)"
        plan_layout 1 01_single_gpu/train "$runs/$label" --model "$preset" --device "$device_choice" --batch 8 --micro 1 \
            --eval-every 20 --precision "$precision" --steps "$steps"
    done
    plot --precision "$reference" "$runs/01-$preset-bf16" "$runs/01-$preset-fp16" --out runs/plots/05
fi

# ---- chapter 05: ZeRO stages 0-3 on the data-parallel ranks; stage 3 with and without prefetch ----
if chosen 05 && [ -x 05_zero/train ]; then
    for stage in 0 1 2 3; do
        configure "05-dp$dp_ranks-zero$stage" "$dp_ranks" 05_zero/train --model "$preset" --device "$device_choice" \
            --batch "$dp_batch" --zero "$stage" --eval-every 20
    done
    configure "05-dp$dp_ranks-zero3-prefetch0" "$dp_ranks" 05_zero/train --model "$preset" --device "$device_choice" \
        --batch "$dp_batch" --zero 3 --prefetch 0 --eval-every 20
    compare "$steps"
    plot $(chapter_01_runs) "$runs"/05-*.r* --out runs/plots/05
    plot --zero "$runs"/05-*.r* --out runs/plots/05
    plot --gantt "$runs/05-dp$dp_ranks-zero3.r1" "$runs/05-dp$dp_ranks-zero3-prefetch0.r1" --out runs/plots/05
fi

# ---- chapter 06: ZeRO-Offload in bf16 on the data-parallel ranks, with the delayed update, and
# combined with a 2-stage pipeline; the capacity of a device budget, 01 against 06 ----
if chosen 06 && [ -x 06_offload/train ]; then
    configure "06-01-bf16" 1 01_single_gpu/train --model "$preset" --device "$device_choice" --batch 8 --precision bf16 \
        --eval-every 20
    configure "06-dp$dp_ranks-offload" "$dp_ranks" 06_offload/train --model "$preset" --device "$device_choice" \
        --batch "$dp_batch" --offload --precision bf16 --eval-every 20
    configure "06-dp$dp_ranks-offload-dpu" "$dp_ranks" 06_offload/train --model "$preset" --device "$device_choice" \
        --batch "$dp_batch" --offload --precision bf16 --dpu --dpu-warmup 5 --eval-every 20
    configure "06-pp2-dp2-offload" 4 06_offload/train --model "$preset" --device "$device_choice" --batch 8 --micro 2 \
        --pp 2 --dp 2 --zero 2 --offload --precision bf16 --eval-every 20
    compare "$steps"
    plot "$runs"/06-*.r* --out runs/plots/06
    # step 10, after the delayed runs' warm-up of 5 steps; the last step of shorter runs
    plot --offload "$runs/06-dp$dp_ranks-offload.r1" "$runs/06-dp$dp_ranks-offload-dpu.r1" "$runs/06-pp2-dp2-offload.r1" \
        --step $((steps < 10 ? steps : 10)) --out runs/plots/06
    if [ "$dry_run" = 1 ]; then
        echo "plan: $python 06_offload/capacity.py --budgets 8M,16M --max-layers 64 --device $device_choice --out $runs/06-capacity"
    else
        echo "demo: capacity: the largest model 01 and 06 train under 8 and 16 MiB of device memory"
        "$python" 06_offload/capacity.py --budgets 8M,16M --max-layers 64 --device "$device_choice" \
            --out "$runs/06-capacity" | grep -v '^capacity.py: wrote'
    fi
    plot --capacity "$runs/06-capacity/capacity.csv" --out runs/plots/06
    # the step time of offload, with and without the delayed update, next to 01, 04 and 05 (about 40 s on 2 cores)
    bench=(env BENCH_REPEATS="$repeats" BENCH_MODEL="$preset" BENCH_DEVICE="$device_choice" BENCH_OUT="$runs/06-bench"
        common/scripts/bench_offload.sh)
    if [ "$dry_run" = 1 ]; then
        echo "plan: ${bench[*]}"
    else
        echo "demo: offload's step time: 01, 06 with and without --dpu on 1 rank; 04, 05 and 06 combined on 4"
        "${bench[@]}" | grep -E '^bench_offload: [0-9_a-z]+ +ranks'
    fi
    plot --offload-bench "$runs/06-bench/offload_summary.csv" --out runs/plots/06
fi

# ---- the planner: every layout above, predicted (common/plan) against measured ----
plot --plan "$runs"/*.r* "${precision_runs[@]}" --out runs/plots/plan
[ "$dry_run" = 1 ] || echo "demo: planned against measured, every layout of the demo: runs/plots/plan/plan.png" \
    "(not planned: $(grep -l . "$runs"/*.r1/plan.err 2>/dev/null | sed 's|.*/\(.*\)\.r1/plan.err|\1|' | paste -sd, -))"

if chosen 01; then
    if [ "$dry_run" = 1 ]; then
        launch 1 ./01_single_gpu/train --model tiny --steps 300 --quiet --sample 200 --out "$runs/01-sample"
    else
        echo "demo: a text sample from the tiny model after 300 steps (prompt|generated):"
        launch 1 ./01_single_gpu/train --model tiny --steps 300 --quiet --sample 200 --out "$runs/01-sample" | grep '^sample:'
    fi
fi
[ "$dry_run" != 1 ] || exit 0
echo "demo: done. CSVs in $runs/, plots in runs/plots/01 .. runs/plots/06 (see course.md for what to look for)"
