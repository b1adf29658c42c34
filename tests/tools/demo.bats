#!/usr/bin/env bats
# demo.bats: `make demo` picks ranks from the work, not from the core count.
# DEMO_DRY_RUN=1 prints the demo's plan; each test checks the choices for one
# core count, then runs every planned training command once, for one step, to
# prove the programs accept it (they exit 2 on an impossible topology). The
# pipeline's commands are checked with --print-schedule, which validates the
# same flags and exits before training. Commands already proven by an earlier
# test of this file (the same for 8 and 16 cores) are not run again. The last
# tests check that repeats are interleaved and how the pipeline sweep plot
# compares configurations (the fastest repeat).

load ../helpers

setup_file() {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
    : >"$BATS_FILE_TMPDIR/proven"
}

# plan CORES [VAR=VALUE...]: the demo's planned commands for CORES cores, one per line, "plan: " removed.
plan() {
    local cores="$1"
    shift
    (cd "$REPO" && env "$@" DEMO_DRY_RUN=1 DEMO_REPEATS=1 DEMO_CORES="$cores" common/scripts/demo.sh) | sed -n 's/^plan: //p'
}

# ranks_of PLAN PROGRAM: the -np of PROGRAM's planned commands (1 without mpirun), one line per distinct
# value; chapter 04's 3D run, 8 ranks whatever the cores, is left out (its own test checks it).
ranks_of() {
    awk -v program="$2" '$0 ~ program " " && !/04-3d-/ { np = 1; for (i = 1; i < NF; i++) if ($i == "-np") np = $(i + 1); print np }' \
        <<<"$1" | sort -u
}

# prove_plan PLAN: run every planned training command once with --steps 1 (the
# pipeline's with --print-schedule) into a scratch directory; fail on the first
# it rejects.
prove_plan() {
    local line words i key n=0
    while read -r line; do
        [[ "$line" == *"/train "* ]] || continue
        read -ra words <<<"$line"
        words=("${words[@]:1}") # drop OMP_NUM_THREADS=k: one thread per rank is enough to check the flags
        for i in "${!words[@]}"; do
            case "${words[$i]}" in
                --steps) words[i + 1]=1 ;;
                --out) words[i + 1]="$BATS_TEST_TMPDIR/run$n" ;;
            esac
        done
        [[ "$line" == *04_pipeline/train* ]] && words+=(--print-schedule)
        key="${words[*]}"
        key="${key//$BATS_TEST_TMPDIR\/run$n/}" # the same command whatever its --out
        grep -qxF "$key" "$BATS_FILE_TMPDIR/proven" && continue
        if ! (cd "$REPO" && OMP_NUM_THREADS=1 "${words[@]}" </dev/null >"$BATS_TEST_TMPDIR/out$n.log" 2>&1); then
            echo "the demo's command was rejected: ${words[*]}" >&2
            cat "$BATS_TEST_TMPDIR/out$n.log" >&2
            return 1
        fi
        echo "$key" >>"$BATS_FILE_TMPDIR/proven"
        n=$((n + 1))
    done <<<"$1"
}

# check_plan CORES DP_RANKS PP_STAGES: the plan's choices, then every command run for real.
check_plan() {
    local cores="$1" dp="$2" pp="$3" p
    p=$(plan "$cores")
    [ "$(ranks_of "$p" 01_single_gpu/train)" = 1 ]
    [ "$(ranks_of "$p" 02_data_parallel/train)" = "$dp" ]
    [ "$(ranks_of "$p" 02_data_parallel/commbench)" = "$dp" ]
    [ "$(ranks_of "$p" "03_model_parallel/train .*--model (small|medium)")" = 2 ]
    [ "$(ranks_of "$p" "03_model_parallel/train .*--model tiny")" = "$(printf '1\n2\n4')" ] # --cp 1, 2, 4
    [ "$(ranks_of "$p" 04_pipeline/train)" = "$pp" ]
    # ranks x threads never exceed the cores (or the ranks, when there are more ranks than cores)
    awk -v cores="$cores" '{ t = substr($1, 17); np = 1; for (i = 1; i < NF; i++) if ($i == "-np") np = $(i + 1)
                             if (np * t > (np > cores ? np : cores)) { print "oversubscribed: " $0; exit 1 } }' <<<"$p"
    prove_plan "$p"
}

@test "the demo's plan is valid on 1 core" {
    check_plan 1 2 2
}

@test "the demo's plan is valid on 2 cores" {
    check_plan 2 2 2
}

@test "the demo's plan is valid on 8 cores" {
    check_plan 8 4 4
}

@test "the demo's plan is valid on 16 cores" {
    check_plan 16 4 4
}

@test "the demo's plan on 3 cores uses 2 data-parallel ranks (they divide the batch) and 3 stages" {
    p=$(plan 3)
    [ "$(ranks_of "$p" 02_data_parallel/train)" = 2 ]
    [ "$(ranks_of "$p" 04_pipeline/train)" = 3 ]
    # the 3-stage split, once (the micro-batch counts were proven for 2 and 4 stages)
    prove_plan "$(grep -- '04_pipeline/train.*--micro 8 --schedule 1f1b' <<<"$p")"
}

@test "DEMO_RANKS larger than the work allows is cut to what each chapter can use" {
    p=$(plan 2 DEMO_RANKS=16)
    [ "$(ranks_of "$p" 02_data_parallel/train)" = 8 ]
    [ "$(ranks_of "$p" 04_pipeline/train)" = 4 ]
    run env DEMO_DRY_RUN=1 DEMO_RANKS=16 DEMO_CORES=2 "$REPO/common/scripts/demo.sh"
    assert_output --partial "chapter 02 uses 8 ranks"
}

@test "the demo interleaves repeats: repeat 1 of every configuration of a comparison, then repeat 2" {
    # the training commands only (each repeat 1 is also planned: common/plan ... --out the same directory)
    run bash -c "cd '$REPO' && DEMO_DRY_RUN=1 DEMO_REPEATS=2 DEMO_CORES=2 common/scripts/demo.sh | grep '/train ' |
        grep -o 'runs/demo/0[14]-[a-z0-9-]*\.r[0-9]'"
    assert_success
    expected="runs/demo/01-small.r1
runs/demo/01-small-micro4.r1
runs/demo/01-small-recompute.r1
runs/demo/01-small.r2
runs/demo/01-small-micro4.r2
runs/demo/01-small-recompute.r2"
    [ "$(head -6 <<<"$output")" = "$expected" ]
    # the pipeline sweep: all 8 configurations once before any second repeat
    pipeline=$(grep 'runs/demo/04-' <<<"$output")
    [ "$(sed -n 8p <<<"$pipeline")" = runs/demo/04-1f1b-m8.r1 ]
    [ "$(sed -n 9p <<<"$pipeline")" = runs/demo/04-gpipe-m1.r2 ]
}

@test "DEMO_CORES must be a positive number" {
    run env DEMO_DRY_RUN=1 DEMO_CORES=many "$REPO/common/scripts/demo.sh"
    assert_failure 2
    assert_output --partial "DEMO_CORES=many"
}

@test "DEMO_STEPS must be a positive number, and a demo of fewer than 10 steps plots its last step's offload timeline" {
    run env DEMO_DRY_RUN=1 DEMO_STEPS=0 DEMO_CORES=2 "$REPO/common/scripts/demo.sh"
    assert_failure 2
    assert_output --partial "DEMO_STEPS=0"
    for steps in 1 3 40; do
        p=$(plan 2 DEMO_STEPS=$steps)
        want=$((steps < 10 ? steps : 10))
        grep -q -- "common/python/plot.py --offload .* --step $want --out runs/plots/06" <<<"$p"
    done
}

@test "DEMO_ONLY runs only the chapters it names, and DEMO_3D=0 leaves out the 8-rank run" {
    # issue 36 item 18: one chapter's demo; the plots compare with chapter 01 only when it ran
    p=$(plan 2 DEMO_ONLY=04)
    [ -n "$(ranks_of "$p" 04_pipeline/train)" ]
    run grep -E '0[12356]_[a-z_]+/(train|commbench)|capacity.py|bench_offload' <<<"$p"
    assert_failure
    grep -q -- "-np 8 04_pipeline/train .*--out runs/demo/04-3d-pp2-tp2-dp2.r1 " <<<"$p"
    # (a dry run's globs expand where runs/demo holds an earlier demo: the checks read around them)
    grep -- "plot.py --plan .* --out runs/plots/plan\$" <<<"$p" | grep -vq -- "/01-small-bf16 \|/01-small-fp16 "
    p=$(plan 2 DEMO_ONLY=04 DEMO_3D=0)
    [ -z "$(grep -v "plot.py --plan" <<<"$p" | grep -- "-np 8 \|04-3d-")" ]
    grep -q -- "--schedule zb-h1" <<<"$p"
    # 02 and 05 without 01: no chapter 01 runs in their plots; 05's precision plot trains its own fp32 run
    p=$(plan 2 DEMO_ONLY=02,05)
    grep -q -- "02_data_parallel/train " <<<"$p"
    grep -q -- "05_zero/train " <<<"$p"
    [ -z "$(grep -v "plot.py --plan" <<<"$p" | grep -E '0[346]_[a-z_]+/train|runs/demo/01-small\.r')" ]
    grep -q -- "01_single_gpu/train .*--precision fp32 .*--out runs/demo/01-small-fp32\$" <<<"$p"
    grep -q -- "plot.py --precision runs/demo/01-small-fp32 runs/demo/01-small-bf16 runs/demo/01-small-fp16 " <<<"$p"
    grep -- "plot.py runs/demo/02-dp.* --out runs/plots/02\$" <<<"$p" | grep -vq -- "01-small"
    # with 01: the plots compare with its runs, and 05 takes 01's fp32 run
    p=$(plan 2 DEMO_ONLY=01,05)
    grep -q -- "plot.py --precision runs/demo/01-small.r1 runs/demo/01-small-bf16 " <<<"$p"
    grep -q -- "plot.py runs/demo/01-small\.r.* runs/demo/05-.* --out runs/plots/05\$" <<<"$p"
    run grep -q -- "01-small-fp32" <<<"$p"
    assert_failure
    # the default is every chapter: the plan of today's demo, unchanged
    [ "$(plan 2)" = "$(plan 2 DEMO_ONLY=01,02,03,04,05,06 DEMO_3D=1)" ]
}

@test "DEMO_ONLY and DEMO_3D refuse what is not a chapter list or a switch, in one line, before anything runs" {
    for only in 07 4 00 abc ",," "02,,03" "01," "02 03" "02,03,"; do
        run env DEMO_DRY_RUN=1 DEMO_ONLY="$only" "$REPO/common/scripts/demo.sh"
        assert_failure 2
        assert_output "demo: DEMO_ONLY=$only is not a list of chapters (valid: NN[,NN...] of 01 to 06, e.g. 04 or 02,05)"
    done
    for value in 2 yes -1 ""x; do
        run env DEMO_DRY_RUN=1 DEMO_3D="$value" "$REPO/common/scripts/demo.sh"
        assert_failure 2
        assert_output "demo: DEMO_3D=$value (valid: 1 runs chapter 04's 8-rank run, 0 leaves it out)"
    done
    # not a dry run: the refusal comes before the demo empties runs/demo
    mkdir -p "$REPO/runs/demo"
    touch "$REPO/runs/demo/.demo_only_test_marker"
    run env DEMO_ONLY=07 "$REPO/common/scripts/demo.sh"
    assert_failure 2
    [ -e "$REPO/runs/demo/.demo_only_test_marker" ]
    rm -f "$REPO/runs/demo/.demo_only_test_marker"
    rmdir "$REPO/runs/demo" 2>/dev/null || true
}

@test "plot.py asked for a step a run does not have says so in one line, exit status 2" {
    python="$(plot_python)"
    "$python" -c "import matplotlib" 2>/dev/null || skip "no python3 with matplotlib"
    dir="$(scratch)/06-run"
    mkdir -p "$dir"
    printf 'rank,step,micro,op,start_us,end_us\n0,1,0,fwd,0,10\n0,2,0,fwd,20,30\n0,3,0,bwd,40,60\n' >"$dir/timeline.csv"
    for kind in --offload --gantt; do
        run "$python" "$REPO/common/python/plot.py" $kind "$dir" --step 10 --out "$(scratch)/plots"
        assert_failure 2
        assert_output "plot.py: --step 10: $dir/timeline.csv has no step 10 (valid: 1..3, or no --step for the last)"
        run "$python" "$REPO/common/python/plot.py" $kind "$dir" --step 3 --out "$(scratch)/plots"
        assert_success
    done
    run "$python" "$REPO/common/python/plot.py" --offload "$dir" --out "$(scratch)/plots" # no --step: the last
    assert_success
}

@test "course.md's command for the ring's Gantt chart names the run directory the demo writes" {
    local dirs dir
    dirs="$(grep -o '`runs/[^` ]*-cp4-[^` ]*`' "$REPO/course.md" | tr -d '`' | sort -u)"
    [ -n "$dirs" ]
    for dir in $dirs; do
        assert_regex "$dir" '^runs/.*-cp4-seq256\.r1$'
        plan 2 | grep -q -- "03_model_parallel/train .*--out $dir "
    done
}

@test "the pipeline sweep plot takes the fastest repeat and draws the measured bubble against the formula" {
    python="$(plot_python)"
    "$python" -c "import matplotlib" 2>/dev/null || skip "no python3 with matplotlib"
    dir="$(scratch)"
    # two repeats per configuration; repeat 1 of 1f1b-m4 was slowed by background load
    for run in gpipe-m4.r1:100:0.25 gpipe-m4.r2:90:0.22 1f1b-m4.r1:180:0.40 1f1b-m4.r2:88:0.21; do
        IFS=: read -r name ms bubble <<<"$run"
        mkdir -p "$dir/04-$name"
        echo "step,loss" >"$dir/04-$name/steps.csv"
        echo "rank,space,category,peak_bytes" >"$dir/04-$name/memory.csv"
        printf 'pp,micro,median_step_ms,schedule,bubble_measured,bubble_theory\n2,4,%s,%s,%s,0.2\n' \
            "$ms" "${name%%-*}" "$bubble" >"$dir/04-$name/run.csv"
    done
    run "$python" "$REPO/common/python/plot.py" --sweep "$dir"/04-* --out "$dir/plots"
    assert_success
    assert_output --partial "sweep 1f1b M=4: fastest of 2 repeats 88.0 ms, bubble 0.210 measured, 0.200 formula"
    assert_output --partial "sweep gpipe M=4: fastest of 2 repeats 90.0 ms, bubble 0.220 measured, 0.200 formula"
    [ -s "$dir/plots/sweep.png" ]
}

@test "the bubbles plot draws each schedule's measured bubble against its formula, zb-h1's at its measured F, B, W, and the replay" {
    python="$(plot_python)"
    "$python" -c "import matplotlib" 2>/dev/null || skip "no python3 with matplotlib"
    dir="$(scratch)"
    # schedule:bubble_measured:bubble_theory, P = 2, M = 8; two repeats each
    for run in gpipe:0.15:0.1111 1f1b:0.14:0.1111 interleaved:0.07:0.0588 zb-h1:0.05:0.0400; do
        IFS=: read -r schedule bubble theory <<<"$run"
        for r in 1 2; do
            d="$dir/04-schedule-$schedule.r$r"
            mkdir -p "$d"
            echo "step,loss" >"$d/steps.csv"
            echo "rank,space,category,peak_bytes" >"$d/memory.csv"
            printf 'pp,micro,schedule,bubble_measured,bubble_theory\n2,8,%s,%s,%s\n' "$schedule" \
                "$(awk -v b="$bubble" -v r=$r 'BEGIN { print b + (r - 1) / 100 }')" "$theory" >"$d/run.csv"
        done
    done
    # zb-h1's timeline: steps 1 (warm-up, left out) and 2; F 10, B 10, W 5 us on rank 0
    printf 'rank,step,micro,op,start_us,end_us\n0,1,0,fwd,0,99\n0,2,0,fwd,0,10\n0,2,0,bwd_input,10,20\n0,2,0,bwd_weight,20,25\n1,2,0,fwd,0,50\n' \
        >"$dir/04-schedule-zb-h1.r1/timeline.csv"
    # gpipe's timelines (both repeats), M = 2 here: stage 0 F 1, B 2; stage 1 F 2, B 3 (us). Replayed,
    # the span is the flow shop's sum(f) + max(f) + sum(b) + max(b) = 3 + 2 + 5 + 3 = 13, busy 2 x 8
    for r in 1 2; do
        printf 'rank,step,micro,op,start_us,end_us\n0,1,0,fwd,0,99\n%s\n' \
            "$(printf '0,2,0,fwd,0,1 0,2,1,fwd,1,2 0,2,0,bwd,10,12 0,2,1,bwd,12,14 1,2,0,fwd,1,3 1,2,1,fwd,3,5 1,2,0,bwd,5,8 1,2,1,bwd,8,11' | tr ' ' '\n')" \
            >"$dir/04-schedule-gpipe.r$r/timeline.csv"
    done
    run "$python" "$REPO/common/python/plot.py" --bubbles "$dir"/04-schedule-*.r* --out "$dir/plots"
    assert_success
    # 1 - 16 / (2 x 13) = 0.385, and the measured median 0.155 is 60% under it
    assert_output --partial "bubbles 04-schedule-gpipe (gpipe, P=2, M=8): measured 0.155 (median of 2 repeats), formula 0.111, 0.385 replayed at the run's own times (-60%)"
    assert_output --partial "bubbles 04-schedule-interleaved (interleaved, P=2, M=8): measured 0.075 (median of 2 repeats), formula 0.059"
    # (P-1)(tf+tb-tw) / (M(tf+tb+tw) + (P-1)(tf+tb-tw)) = 15 / (8 x 25 + 15)
    assert_output --partial "bubbles 04-schedule-zb-h1 (zb-h1, P=2, M=8): measured 0.055 (median of 2 repeats), formula 0.040, 0.070 at the measured F, B, W"
    [ -s "$dir/plots/bubbles.png" ]
}

@test "the demo runs the four schedules on the CPU with M a multiple of P and a block per piece, and plots their bubbles" {
    for cores in 2 4; do
        p=$(plan $cores)
        P=$(ranks_of "$p" 04_pipeline/train)
        for schedule in gpipe 1f1b zb-h1; do
            grep -q -- "--out runs/demo/04-schedule-$schedule.r1 .*--device cpu .*--micro $((4 * P)) --schedule $schedule --virtual 1\$" <<<"$p"
        done
        grep -q -- "--layers $((2 * P > 4 ? 2 * P : 4)) .*--micro $((4 * P)) --schedule interleaved --virtual 2\$" <<<"$p"
        grep -q -- "plot.py --bubbles runs/demo/04-schedule-gpipe.r\* " <<<"$p"
    done
}

@test "the demo's 3D run is pp 2 x tp 2 x dp 2 on 8 ranks, plotted as a Gantt chart, memory per rank and bytes per axis" {
    p=$(plan 2)
    grep -q -- "-np 8 04_pipeline/train .*--out runs/demo/04-3d-pp2-tp2-dp2.r1 .*--pp 2 --tp 2\$" <<<"$p"
    grep -q -- "plot.py --grid runs/demo/04-3d-pp2-tp2-dp2.r\* " <<<"$p"
    grep -q -- "plot.py --gantt runs/demo/04-3d-pp2-tp2-dp2.r1 " <<<"$p"
    python="$(plot_python)"
    "$python" -c "import matplotlib" 2>/dev/null || skip "no python3 with matplotlib"
    # the plots of a real 3D run: the tiny model, 2 steps; its bytes per axis are combined_layouts.bats's formulas
    # (tp's with the vocabulary split's, dp's of gradients with wte and lm_head split over tp)
    dir="$(scratch)"
    (cd "$REPO" && OMP_NUM_THREADS=1 mpirun_np 8 04_pipeline/train --device cpu --model tiny --layers 4 --batch 8 \
        --micro 2 --pp 2 --tp 2 --steps 2 --sample 0 --quiet --out "$dir/3d.r1" >/dev/null)
    run "$python" "$REPO/common/python/plot.py" --grid "$dir/3d.r1" --out "$dir/plots"
    assert_success
    assert_output --partial "plot.py: 3d: bytes per step dp 1941504, pp 524288, cp 0, tp 4730880"
    [ -s "$dir/plots/grid-3d.png" ]
    run "$python" "$REPO/common/python/plot.py" --gantt "$dir/3d.r1" --out "$dir/plots"
    assert_success
    [ -s "$dir/plots/gantt-3d.r1.png" ]
    # a run without the columns (chapter 02's, say) is refused in one line
    mkdir -p "$dir/02.r1"
    echo "step,loss" >"$dir/02.r1/steps.csv"
    echo "rank,space,category,peak_bytes" >"$dir/02.r1/memory.csv"
    printf 'dp,tp,pp\n2,1,1\n' >"$dir/02.r1/run.csv"
    run "$python" "$REPO/common/python/plot.py" --grid "$dir/02.r1" --out "$dir/plots"
    assert_failure 2
    assert_output "plot.py: $dir/02.r1/run.csv has no bytes_dp_per_step (valid: a run of chapter 04 or 05's pipeline)"
}

@test "on a GPU the demo trains the medium preset, and says what ranks sharing a GPU show" {
    run env DEMO_DRY_RUN=1 DEMO_CORES=16 DEMO_DEVICE=cuda DEMO_GPUS=1 "$REPO/common/scripts/demo.sh"
    assert_success
    assert_output --partial "demo: the medium preset on --device cuda"
    assert_output --partial "up to 8 ranks share 1 GPU(s)"
    # every chapter on the GPU trains medium; only chapter 04's four-schedule bubble comparison runs
    # small on the CPU, by design (demo.sh says why)
    refute_output --regexp "--model small [^\n]*--device cuda"
    refute_output --regexp "(0[1-356]_[a-z_]+|04-(gpipe|1f1b)-m[0-9]+[^ ]*) [^\n]*--model small"
    assert_output --partial "04_pipeline/train --steps 20 --sample 0 --quiet --out runs/demo/04-gpipe-m1.r1 --model medium --device cuda"
    run env DEMO_DRY_RUN=1 DEMO_CORES=2 DEMO_DEVICE=cuda DEMO_GPUS=8 "$REPO/common/scripts/demo.sh"
    refute_output --partial "share"
    run env DEMO_DRY_RUN=1 DEMO_DEVICE=tpu "$REPO/common/scripts/demo.sh"
    assert_failure
    assert_output --partial "DEMO_DEVICE=tpu (valid: cpu, cuda)"
}

@test "the ZeRO plot puts each stage's memory and bytes sent next to the paper's formulas" {
    python="$(plot_python)"
    "$python" -c "import matplotlib" 2>/dev/null || skip "no python3 with matplotlib"
    dir="$(scratch)"
    for stage in 0 1 2 3; do
        OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2 "$REPO/05_zero/train" --zero "$stage" --steps 2 \
            --sample 0 --quiet --eval-batches 1 --out "$dir/05-zero$stage" >/dev/null
    done
    run "$python" "$REPO/common/python/plot.py" --zero "$dir"/05-zero* --out "$dir/plots"
    assert_success
    [ -s "$dir/plots/zero.png" ]
    # the tiny preset's units divide by 2: no padding, so every stage is its formula to the byte
    for stage in 0 1 2 3; do
        line="$(grep "^zero 05-zero$stage:" <<<"$output")"
        [[ "$line" =~ model\ state\ ([0-9.]+)\ MiB\ per\ rank\ \(formula\ ([0-9.]+)\),\ sent\ ([0-9.]+)\ MiB\ per\ step\ \(formula\ ([0-9.]+)\) ]]
        assert_equal "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
        assert_equal "${BASH_REMATCH[3]}" "${BASH_REMATCH[4]}"
    done
}

@test "the precision plot overlays fp32, bf16 and fp16 and reads 4+4+8 and 2+2+12 bytes per parameter" {
    python="$(plot_python)"
    "$python" -c "import matplotlib" 2>/dev/null || skip "no python3 with matplotlib"
    dir="$(scratch)"
    for precision in fp32 bf16 fp16; do
        OMP_NUM_THREADS=1 "$TRAIN01" --device cpu --precision "$precision" --steps 3 --sample 0 --quiet \
            --eval-batches 1 --out "$dir/01-$precision" >/dev/null
    done
    run "$python" "$REPO/common/python/plot.py" --precision "$dir"/01-fp32 "$dir"/01-bf16 "$dir"/01-fp16 --out "$dir/plots"
    assert_success
    [ -s "$dir/plots/precision.png" ]
    assert_output --partial "precision 01-fp32: bytes per parameter: params 4, grads 4, optimizer 8"
    assert_output --partial "precision 01-bf16: bytes per parameter: params 2, grads 2, optimizer 12"
    assert_output --partial "precision 01-fp16: bytes per parameter: params 2, grads 2, optimizer 12"
}

@test "the demo plans every layout it trains, the ring all-reduce too, and plot.py --plan draws them" {
    # every planned command of the plan for 2 cores runs, and the planner refuses none
    local dir refused=() line words i
    dir="$(scratch)"
    while read -r line; do
        [[ "$line" == common/plan* ]] || continue
        read -ra words <<<"$line"
        for i in "${!words[@]}"; do
            case "${words[$i]}" in --out | --csv | --time-csv) words[i + 1]="$dir/${words[i + 1]##*/}" ;; esac
        done
        (cd "$REPO" && "${words[@]}" >/dev/null 2>"$dir/err") || refused+=("$(cat "$dir/err")")
    done <<<"$(plan 2)"
    printf 'refused: %s\n' "${refused[@]}"
    assert_equal "${#refused[@]}" 0
    grep -q -- "^common/plan .*--allreduce ring" <<<"$(plan 2)" # the ring's layout is among them
    # two tiny runs planned, one not: plan.png from the two, the third named
    python="$(plot_python)"
    "$python" -c "import matplotlib" 2>/dev/null || skip "no python3 with matplotlib"
    f="--device cpu --model tiny --steps 2 --sample 0 --quiet --eval-batches 1"
    OMP_NUM_THREADS=1 "$TRAIN01" $f --out "$dir/01-tiny.r1" >/dev/null
    OMP_NUM_THREADS=1 mpirun_np 2 "$REPO/04_pipeline/train" $f --micro 2 --out "$dir/04-tiny.r1" >/dev/null
    cp -r "$dir/01-tiny.r1" "$dir/unplanned.r1"
    machine="$REPO/common/machines/cpu-amd-epyc-2cores.machine"
    for run in "01-tiny --chapter 01" "04-tiny --chapter 04 --pp 2 --micro 2"; do
        set -- $run
        out="$dir/$1.r1"
        shift
        OMP_NUM_THREADS=1 "$REPO/common/plan" $f "$@" --machine "$machine" --csv "$out/plan.csv" \
            --time-csv "$out/plan-time.csv" >/dev/null
    done
    run "$python" "$REPO/common/python/plot.py" --plan "$dir"/*.r1 --out "$dir/plots"
    assert_success
    assert_output --partial "not planned, left out of plan.png: unplanned"
    [ -s "$dir/plots/plan.png" ]
}

# fake_tree: a copy of the demo script in a tree of its own ($BATS_TEST_TMPDIR/tree: the planner and
# the machine files linked, no training program), so that a check that failed to refuse could never
# run or remove anything of the repository's; prints the tree's path.
fake_tree() {
    local t="$BATS_TEST_TMPDIR/tree"
    mkdir -p "$t/common/scripts" "$t/runs/demo"
    cp "$REPO/common/scripts/demo.sh" "$REPO/common/scripts/outputs.sh" "$REPO/common/scripts/lib.sh" "$t/common/scripts/"
    ln -s "$REPO/common/plan" "$t/common/plan"
    ln -s "$REPO/common/machines" "$t/common/machines"
    echo "$t"
}

@test "every DEMO_* value is checked before anything runs: one line with its range, exit 2, runs/demo kept" {
    local t bad
    t="$(fake_tree)"
    echo "# written by common/scripts/demo.sh (make demo): removed and written again by the next demo" \
        >"$t/runs/demo/demo-info.txt"
    echo "an earlier demo's run" >"$t/runs/demo/kept"
    printf 'not a machine\n' >"$BATS_TEST_TMPDIR/notes.txt"
    for bad in DEMO_REPEATS=0 DEMO_REPEATS=-1 DEMO_REPEATS=abc DEMO_STEPS=0 DEMO_STEPS=1e3 \
        DEMO_CORES=7766279631452241919 DEMO_CORES=0 DEMO_RANKS=two DEMO_GPUS=0 DEMO_DRY_RUN=yes DEMO_DRY_RUN=2 \
        DEMO_DEVICE=tpu DEMO_MACHINE=/nonexistent DEMO_MACHINE="$BATS_TEST_TMPDIR/notes.txt" \
        DEMO_MACHINE="$BATS_TEST_TMPDIR"; do
        run --separate-stderr timeout 20 env "$bad" "$t/common/scripts/demo.sh"
        [ "$status" = 2 ] || { echo "$bad: status $status, stderr: $stderr, stdout: $output"; false; }
        assert_equal "$output" ""
        assert_equal "$(grep -c . <<<"$stderr")" 1
        [[ "$stderr" == "demo: $bad"*"(valid: "* ]] || { echo "$bad: $stderr"; false; }
        assert_equal "$(ls "$t/runs/demo" | tr '\n' ' ')" "demo-info.txt kept "
    done
    # the ranges are said: a huge core count is refused with them, not turned into a thread count
    run --separate-stderr env DEMO_CORES=7766279631452241919 "$t/common/scripts/demo.sh"
    assert_equal "$stderr" "demo: DEMO_CORES=7766279631452241919 (valid: a whole number 1..4096)"
    run --separate-stderr env DEMO_MACHINE="$BATS_TEST_TMPDIR" "$t/common/scripts/demo.sh"
    assert_equal "$stderr" "demo: DEMO_MACHINE=$BATS_TEST_TMPDIR: --machine $BATS_TEST_TMPDIR: is a directory (valid: a machine file)"
}

@test "the demo replaces runs/demo only when it is new, empty or an earlier demo's" {
    local t
    t="$(fake_tree)"
    echo "a learner's notes" >"$t/runs/demo/notes.txt"
    run --separate-stderr timeout 20 "$t/common/scripts/demo.sh"
    assert_equal "$status" 2
    assert_equal "$stderr" "demo: runs/demo: exists and is not demo.sh's output (no demo-info.txt of its own; valid: a new name, an empty directory or an earlier output of demo.sh)"
    assert_equal "$(ls "$t/runs/demo")" "notes.txt"
    # an earlier demo's directory is accepted: removed and begun again (this tree has no programs to
    # run, so the demo stops at its first)
    rm "$t/runs/demo/notes.txt"
    echo "# written by common/scripts/demo.sh (make demo): removed and written again by the next demo" \
        >"$t/runs/demo/demo-info.txt"
    echo "an earlier demo's run" >"$t/runs/demo/old"
    run -127 --separate-stderr timeout 20 "$t/common/scripts/demo.sh" # ./01_single_gpu/train: not found
    [ ! -e "$t/runs/demo/old" ] && [ -d "$t/runs/demo/logs" ] && [ -f "$t/runs/demo/demo-info.txt" ]
}

@test "a dry run prints the demo's plan as written, whatever an earlier demo left in runs/demo" {
    local t
    t="$(fake_tree)"
    for chapter in "$REPO"/0[1-6]_*; do ln -s "$chapter" "$t/$(basename "$chapter")"; done # the demo plans what is built
    mkdir -p "$t/runs/demo/04-schedule-gpipe.r1" "$t/runs/demo/04-3d-pp2-tp2-dp2.r1" "$t/runs/demo/06-01-bf16.r1"
    run --separate-stderr env DEMO_DRY_RUN=1 DEMO_CORES=2 "$t/common/scripts/demo.sh"
    assert_success
    assert_output --partial "plot.py --bubbles runs/demo/04-schedule-gpipe.r* "
    assert_output --partial "plot.py --grid runs/demo/04-3d-pp2-tp2-dp2.r* "
    refute_output --partial "plot.py --bubbles runs/demo/04-schedule-gpipe.r1"
    refute_output --partial "plot.py --plan runs/demo/04-3d-pp2-tp2-dp2.r1"
}
