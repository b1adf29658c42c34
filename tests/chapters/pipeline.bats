#!/usr/bin/env bats
# 04_pipeline: micro-batches through a layer split with GPipe and 1F1B give
# chapter 01's losses; timelines, bubble and activation memory are reported.

load ../helpers

# tiny preset with 4 layers (so 4 stages fit), 4 steps; a private copy of the
# corpus, so that editing course.md during the run cannot change the data
FLAGS="--device cpu --layers 4 --steps 4 --sample 0 --quiet --data $BATS_FILE_TMPDIR/corpus.txt"

setup_file() {
    cp "$REPO/course.md" "$BATS_FILE_TMPDIR/corpus.txt"
    for batch in 8 12 16; do
        "$REPO/01_single_gpu/train" $FLAGS --batch $batch --out "$BATS_FILE_TMPDIR/ref$batch" >/dev/null
    done
}

pipeline() { OMP_NUM_THREADS=1 mpirun_np "$@"; }

# Every step's loss within 1e-4 (relative) of chapter 01's run with the same global batch.
assert_matches_01() {
    assert_losses_match "$BATS_FILE_TMPDIR/ref$1" "$2" 4
}

check_stages() {
    local P="$1"
    for M in 1 2 4 8; do
        for schedule in gpipe 1f1b; do
            out="$BATS_TEST_TMPDIR/p$P-m$M-$schedule"
            pipeline "$P" "$TRAIN04" $FLAGS --batch 8 --micro "$M" --schedule "$schedule" --out "$out" >/dev/null
            assert_matches_01 8 "$out"
        done
    done
}

@test "a 2-stage pipeline matches single-device losses for 1, 2, 4, 8 micro-batches, GPipe and 1F1B" { check_stages 2; }
@test "a 3-stage pipeline matches single-device losses for 1, 2, 4, 8 micro-batches, GPipe and 1F1B" { check_stages 3; }
@test "a 4-stage pipeline matches single-device losses for 1, 2, 4, 8 micro-batches, GPipe and 1F1B" { check_stages 4; }

@test "micro-batches that are not a multiple of the stages (P=2, M=3) match single-device losses" {
    for schedule in gpipe 1f1b; do
        pipeline 2 "$TRAIN04" $FLAGS --batch 12 --micro 3 --schedule "$schedule" --out "$BATS_TEST_TMPDIR/$schedule" >/dev/null
        assert_matches_01 12 "$BATS_TEST_TMPDIR/$schedule"
    done
}

# zb-h1: the backward split into B and W, sends posted; every parameter's
# gradient sums its micro-batches in 1F1B's order, so the losses and norms
# are 1F1B's bit for bit, and chapter 01's within 1e-4
@test "zb-h1 on 2, 3 and 4 stages (M = 3, 4, 8, and 2 < P) matches single-device losses and 1F1B's bit for bit" {
    for run in "2 12 3" "3 8 4" "4 8 8" "4 8 2"; do
        set -- $run
        for schedule in 1f1b zb-h1; do
            pipeline "$1" "$TRAIN04" $FLAGS --batch "$2" --micro "$3" --schedule "$schedule" \
                --out "$BATS_TEST_TMPDIR/p$1-m$3-$schedule" >/dev/null
        done
        assert_matches_01 "$2" "$BATS_TEST_TMPDIR/p$1-m$3-zb-h1"
        assert_equal "$(cut -d, -f2,4 "$BATS_TEST_TMPDIR/p$1-m$3-zb-h1/steps.csv")" \
            "$(cut -d, -f2,4 "$BATS_TEST_TMPDIR/p$1-m$3-1f1b/steps.csv")"
    done
}

@test "zb-h1 with two replicas (P=2, D=2) matches single-device losses" {
    pipeline 4 "$TRAIN04" $FLAGS --batch 16 --micro 4 --dp 2 --schedule zb-h1 --out "$BATS_TEST_TMPDIR/zb" >/dev/null
    assert_matches_01 16 "$BATS_TEST_TMPDIR/zb"
}

# interleaved: V chunks per stage, every micro-batch round the ring V times,
# sends posted; each parameter's gradient sums its micro-batches in order
@test "interleaved (V = 2, 3) on 2, 3 and 4 stages, and with two replicas, matches single-device losses" {
    for run in "2 2 4 8 4 1" "3 2 6 12 6 1" "3 2 6 12 3 1" "4 2 8 8 4 1" "2 3 6 8 4 1" "2 2 4 16 4 2"; do
        set -- $run # P V layers batch micro dp
        ref="$BATS_TEST_TMPDIR/ref-$3-$4" out="$BATS_TEST_TMPDIR/p$1-v$2-l$3-m$5-d$6"
        [ -d "$ref" ] || "$REPO/01_single_gpu/train" $FLAGS --layers "$3" --batch "$4" --out "$ref" >/dev/null
        pipeline $(($1 * $6)) "$TRAIN04" $FLAGS --layers "$3" --batch "$4" --micro "$5" --dp "$6" \
            --schedule interleaved --virtual "$2" --out "$out" >/dev/null
        assert_losses_match "$ref" "$out" 4
    done
}

@test "two pipeline replicas (P=2, D=2) match single-device losses" {
    for schedule in gpipe 1f1b; do
        pipeline 4 "$TRAIN04" $FLAGS --batch 16 --micro 4 --dp 2 --schedule "$schedule" \
            --out "$BATS_TEST_TMPDIR/$schedule" >/dev/null
        assert_matches_01 16 "$BATS_TEST_TMPDIR/$schedule"
        assert_equal "$(csv_column "$BATS_TEST_TMPDIR/$schedule/run.csv" pp),$(csv_column "$BATS_TEST_TMPDIR/$schedule/run.csv" dp)" "2,2"
    done
}

@test "an explicit --split matches single-device losses" {
    pipeline 2 "$TRAIN04" $FLAGS --batch 8 --micro 4 --split 3,1 --out "$BATS_TEST_TMPDIR/split" >/dev/null
    assert_matches_01 8 "$BATS_TEST_TMPDIR/split"
}

# --split flops balances the forward FLOPs a token (layer_split.h): at d 256,
# seq 64 and a vocabulary of 8192 a block is 24C^2 + 4TC = 1.64M and the head
# 2CV = 4.19M, 2.6 blocks' work; 8 blocks on 2 stages split 5 | 3 + head
# (8.2M against 9.1M; 4 | 4 + head is 6.6M against 10.8M, 6 | 2 + head 9.8M
# against 7.5M), where the parameters, the embedding weighing as much as the
# head, split 4 | 4. The planner's bubble (the stages' counted work
# replayed) halves; the losses stay 01's.
@test "--split flops balances the stages' compute: 5 | 3 + head where the parameters split 4 | 4, a smaller planned bubble, 01's losses" {
    local shape="--device cpu --layers 8 --dmodel 256 --heads 4 --seq 64 --vocab 8192 --pp 2 --micro 4 --batch 8"
    bubble_of() { awk '$1 == "bubble" { print $2 }' <<<"$1"; }
    run env OMP_NUM_THREADS=1 "$REPO/common/plan" --chapter 04 $shape --machine "$REPO/common/machines/cpu-amd-epyc-2cores.machine"
    assert_success
    assert_line "  stage 0: blocks 0..3 + embedding"
    local params_bubble="$(bubble_of "$output")"
    run env OMP_NUM_THREADS=1 "$REPO/common/plan" --chapter 04 $shape --split flops --machine "$REPO/common/machines/cpu-amd-epyc-2cores.machine"
    assert_success
    assert_line "  stage 0: blocks 0..4 + embedding"
    assert_line "  stage 1: blocks 5..7 + head"
    awk -v a="$params_bubble" -v b="$(bubble_of "$output")" 'BEGIN { exit !(b < a / 1.5) }' ||
        fail "planned bubble $(bubble_of "$output") ms with --split flops, $params_bubble ms without"
    pipeline 2 "$TRAIN04" $FLAGS --batch 8 --micro 4 --split flops --out "$BATS_TEST_TMPDIR/flops" >/dev/null
    assert_matches_01 8 "$BATS_TEST_TMPDIR/flops"
    run "$TRAIN04" $FLAGS --split flop --out "$BATS_TEST_TMPDIR/bad"
    assert_equal "$status" 2
}

@test "--recompute on 2 stages gives bit-identical losses, GPipe, 1F1B, zb-h1 (whose W recomputes too) and interleaved" {
    for schedule in gpipe 1f1b zb-h1 interleaved; do
        for r in 0 1; do
            pipeline 2 "$TRAIN04" $FLAGS --batch 8 --micro 4 --schedule $schedule --recompute=$r \
                --virtual $([ $schedule = interleaved ] && echo 2 || echo 1) --out "$BATS_TEST_TMPDIR/$schedule$r" >/dev/null
        done
        run diff <(csv_column "$BATS_TEST_TMPDIR/${schedule}0/steps.csv" loss) \
                 <(csv_column "$BATS_TEST_TMPDIR/${schedule}1/steps.csv" loss)
        assert_success
    done
}

@test "--recompute: each slot of a stage keeps its block inputs, and the stage one recomputed block" {
    out="$BATS_TEST_TMPDIR/gpipe"
    pipeline 2 "$TRAIN04" $FLAGS --batch 8 --micro 4 --split 2,2 --schedule gpipe --recompute --out "$out" >/dev/null
    # stage 0 (rank 0): embedding + blocks 0, 1; GPipe keeps all M = 4 micro-batches of B = 2
    C=64 NH=4 T=64 B=2 M=4 blocks=2
    BT=$((B * T))
    slot=$(( 2*BT + BT*C + blocks*BT*C ))      # tokens, targets, encoded, each block's output
    one_block=$(( BT*(11*C + 4) + B*NH*T ))    # shared by all slots and blocks
    got=$(awk -F, '$1 == 0 && $2 == "device" && $3 == "activations" { print $4 }' "$out/memory.csv")
    assert_equal "$got" "$(( 4 * (M*slot + one_block) ))"
}

@test "timeline.csv records every action of every rank and trace.json is a valid Chrome trace" {
    out="$BATS_TEST_TMPDIR/tl"
    pipeline 2 "$TRAIN04" $FLAGS --batch 8 --micro 4 --out "$out" >/dev/null
    assert_equal "$(head -1 "$out/timeline.csv")" "rank,step,micro,op,start_us,end_us"
    # per step: 4 forwards and 4 backwards on each of 2 ranks
    assert_equal "$(grep -c ',fwd,' "$out/timeline.csv")" "32"
    assert_equal "$(grep -c ',bwd,' "$out/timeline.csv")" "32"
    awk -F, 'NR > 1 && $6 < $5 { bad = 1 } END { exit bad }' "$out/timeline.csv"
    run python3 -c "import json, sys; t = json.load(open('$out/trace.json'))['traceEvents']; \
        print(sum(1 for e in t if e.get('ph') == 'X'), sorted({e['tid'] for e in t}))"
    assert_success
    assert_output --partial "[0, 1]"
}

@test "run.csv reports the measured bubble next to the formula (P-1)/(M+P-1)" {
    out="$BATS_TEST_TMPDIR/bubble"
    pipeline 2 "$TRAIN04" $FLAGS --batch 8 --micro 4 --out "$out" >/dev/null
    assert_equal "$(csv_column "$out/run.csv" bubble_theory)" "0.2000"
    measured=$(csv_column "$out/run.csv" bubble_measured)
    awk -v b="$measured" 'BEGIN { exit !(b > 0 && b < 1) }'
    # the chapter's columns: 03's idle_fraction, its own bubble, 03's ep_rows_max and ep_rows_mean, then
    # 02's comm_busy_ms (harness.h's order)
    head -1 "$out/steps.csv" | grep -q ',idle_fraction,ep_rows_max,ep_rows_mean,bubble,comm_busy_ms$'
}

# Activation bytes of rank r in a run's memory.csv.
activations_of() { awk -F, -v r="$2" '$1 == r && $2 == "device" && $3 == "activations" { print $4 }' "$1/memory.csv"; }

@test "1F1B holds at most P micro-batches of activations on the first stage; GPipe holds all M" {
    d="$BATS_TEST_TMPDIR"
    # micro-batches of 2 sequences in every run, so one micro-batch's activations are comparable
    pipeline 2 "$TRAIN04" $FLAGS --batch 2 --micro 1 --out "$d/m1" >/dev/null
    pipeline 2 "$TRAIN04" $FLAGS --batch 16 --micro 8 --schedule gpipe --out "$d/gpipe" >/dev/null
    pipeline 2 "$TRAIN04" $FLAGS --batch 16 --micro 8 --schedule 1f1b --out "$d/1f1b" >/dev/null
    for r in 0 1; do
        one=$(activations_of "$d/m1" $r)
        assert_equal "$(activations_of "$d/gpipe" $r)" "$((8 * one))"
    done
    assert_equal "$(activations_of "$d/1f1b" 0)" "$((2 * $(activations_of "$d/m1" 0)))"   # P = 2 on stage 0
    assert_equal "$(activations_of "$d/1f1b" 1)" "$((1 * $(activations_of "$d/m1" 1)))"   # P - 1 stages later
}

@test "zb-h1 holds P micro-batches on every stage, each with the output gradients its W reads" {
    d="$BATS_TEST_TMPDIR"
    # 2 stages of 2 blocks (tiny: C 64, T 64, V 256), micro-batches of 2 sequences
    pipeline 2 "$TRAIN04" $FLAGS --split 2,2 --batch 2 --micro 1 --out "$d/m1" >/dev/null
    pipeline 2 "$TRAIN04" $FLAGS --split 2,2 --batch 16 --micro 8 --schedule zb-h1 --out "$d/zb" >/dev/null
    tokens=$((2 * 64))
    kept0=$((4 * tokens * 2 * 9 * 64))                     # 9C floats per token per block
    kept1=$((kept0 + 4 * tokens * 256))                    # and V for the head
    assert_equal "$(activations_of "$d/zb" 0)" "$((2 * ($(activations_of "$d/m1" 0) + kept0)))"   # P = 2
    assert_equal "$(activations_of "$d/zb" 1)" "$((2 * ($(activations_of "$d/m1" 1) + kept1)))"   # P, not P - 1
}

# One micro-batch's slot on a piece of the tiny 4-layer model with micro-batches of 2 sequences, as
# test_memory computes it with model.h's size functions: piece_bytes FIRST_BLOCK LAST_BLOCK PIECE PIECES
# prints activation_bytes_range's bytes, kept_bytes the same piece's output gradients for W (kept_grads_bytes).
piece_bytes() { "$BUILD/tests/test_memory" piece 4 64 4 256 64 2 "$@" | awk '{ print $2 }'; }
kept_bytes() { "$BUILD/tests/test_memory" piece 4 64 4 256 64 2 "$@" | awk '{ print $4 }'; }

@test "activations per stage follow each schedule's formula: GPipe M, 1F1B P - s, interleaved its chunks' in-flight slots, ZB-H1 P with W's gradients" {
    d="$BATS_TEST_TMPDIR"
    P=2 M=8
    for schedule in gpipe 1f1b zb-h1; do
        pipeline $P "$TRAIN04" $FLAGS --split 2,2 --batch 16 --micro $M --schedule $schedule --out "$d/$schedule" >/dev/null
    done
    pipeline $P "$TRAIN04" $FLAGS --split 1,1,1,1 --batch 16 --micro $M --schedule interleaved --virtual 2 \
        --out "$d/interleaved" >/dev/null
    # interleaved: the simulator's most chunk-micro-batches in flight on stage s, 2(P-1-s) + (V-1)P + 1, and
    # the slots each chunk's own list needs, which the stage allocates (chunk by chunk, so their sum can pass it)
    run "$BUILD/tests/test_schedule" --live interleaved $P 2 $M
    assert_line "stage 0: in flight 5, slots per chunk 4 2"
    assert_line "stage 1: in flight 3, slots per chunk 3 1"
    for s in 0 1; do
        one=$(piece_bytes $((2 * s)) $((2 * s + 1)) $s $P) kept=$(kept_bytes $((2 * s)) $((2 * s + 1)) $s $P)
        assert_equal "$(activations_of "$d/gpipe" $s)" "$((M * one))"
        assert_equal "$(activations_of "$d/1f1b" $s)" "$(((P - s) * one))"
        assert_equal "$(activations_of "$d/zb-h1" $s)" "$((P * (one + kept)))"
        read -r chunk0 chunk1 <<<"$(sed -n "s/^stage $s: .*slots per chunk //p" <<<"$output")"
        # chunk c of stage s is piece cP + s, one block each
        assert_equal "$(activations_of "$d/interleaved" $s)" \
            "$((chunk0 * $(piece_bytes $s $s $s 4) + chunk1 * $(piece_bytes $((P + s)) $((P + s)) $((P + s)) 4)))"
    done
}

@test "--print-schedule prints every stage's actions" {
    run "$TRAIN04" --layers 4 --pp 1 --micro 2 --print-schedule
    assert_success
    assert_line "stage 0: F0 B0 F1 B1"
    run bash -c "$(declare -f mpirun_np); mpirun_np 2 '$TRAIN04' --layers 4 --batch 6 --micro 3 --schedule 1f1b \
        --print-schedule"
    assert_success
    assert_line "stage 0: F0 sa0 F1 sa1|rg0 B0 F2 sa2|rg1 B1 rg2 B2"
    assert_line "stage 1: ra0 F0 B0 sg0|ra1 F1 B1 sg1|ra2 F2 B2 sg2"
}

@test "micro-batches that do not divide each replica's share of the batch are refused" {
    # 12 sequences over 2 replicas: 6 each, which 4 micro-batches do not divide
    run --separate-stderr bash -c "$(declare -f mpirun_np); mpirun_np 2 '$TRAIN04' $FLAGS --pp 1 --dp 2 --batch 12 \
        --micro 4"
    assert_failure
    [[ "$stderr" == *"--micro 4 does not divide the 6 sequences of each of the 2 replicas"* ]]
}

@test "more stages than layers are refused" {
    run --separate-stderr bash -c "$(declare -f mpirun_np); mpirun_np 3 '$TRAIN04' $FLAGS --layers 2"
    assert_failure
    [[ "$stderr" == *"--pp 3 stages for a model of 2 layers (valid: 1..2, every stage needs a block)"* ]]
}

@test "an unknown schedule is refused" {
    run --separate-stderr timeout 5 "$TRAIN04" $FLAGS --schedule zigzag
    assert_equal "$status" 2
    [[ "$stderr" == *"--schedule: unknown schedule 'zigzag' (valid: gpipe, 1f1b, interleaved, zb-h1)"* ]]
}

@test "interleaved and zb-h1 are printed, with chunks and B/W, and more pieces than blocks are refused in one line" {
    run bash -c "$(declare -f mpirun_np); mpirun_np 2 '$TRAIN04' --layers 4 --batch 8 --micro 4 \
        --schedule interleaved --virtual 2 --print-schedule"
    assert_success
    assert_line "stage 1: ra0 F0 pa0 ra1 F1 pa1 ra0c1 F0c1 B0c1 pg0c1 ra1c1 F1c1 B1c1 pg1c1 ra2 F2 pa2 rg0 B0 pg0 ra3 F3 pa3 rg1 B1 pg1 ra2c1 F2c1 B2c1 pg2c1 ra3c1 F3c1 B3c1 pg3c1 rg2 B2 pg2 rg3 B3 pg3"
    run bash -c "$(declare -f mpirun_np); mpirun_np 2 '$TRAIN04' --layers 4 --batch 8 --micro 4 --schedule zb-h1 \
        --print-schedule"
    assert_success
    assert_line "stage 1: ra0 F0 B0 pg0 ra1 F1 B1 pg1 W0 ra2 F2 B2 pg2 W1 ra3 F3 B3 pg3 W2 W3"
    run --separate-stderr bash -c "$(declare -f mpirun_np); mpirun_np 2 '$TRAIN04' $FLAGS --batch 8 --micro 4 \
        --schedule interleaved --virtual 3"
    assert_failure
    [[ "$stderr" == *"error: --pp 2 x --virtual 3 = 6 pieces need at least 6 layers; the model has 4 (valid: --virtual 2 with --pp 2 here, every piece needs a block)"* ]]
}

@test "interleaved refuses micro-batches that are not a multiple of the stages, and --virtual with another schedule" {
    run --separate-stderr bash -c "$(declare -f mpirun_np); mpirun_np 3 '$TRAIN04' $FLAGS --batch 12 --micro 4 \
        --schedule interleaved --virtual 2 --print-schedule"
    assert_failure
    [[ "$stderr" == *"interleaved needs the micro-batches M = 4 to be a multiple of the stages P = 3, as Megatron's interleaved schedule does"* ]]
    run --separate-stderr bash -c "$(declare -f mpirun_np); mpirun_np 2 '$TRAIN04' $FLAGS --batch 8 --micro 4 \
        --virtual 2"
    assert_failure
    [[ "$stderr" == *"1f1b holds one chunk of layers per stage (here 2); only interleaved holds more"* ]]
}

@test "bubble_bench.sh measures the four schedules against their formulas, and refuses bad settings" {
    run env BUBBLE_STEPS=2 "$REPO/common/scripts/bubble_bench.sh"
    assert_failure 2
    assert_output "bubble_bench: BUBBLE_STEPS=2 (valid: 3 or more)"
    local out="$BATS_TEST_TMPDIR/bubbles"
    run env BUBBLE_REPEATS=1 BUBBLE_STEPS=3 BUBBLE_LAYERS=4 BUBBLE_OUT="$out" "$REPO/common/scripts/bubble_bench.sh"
    assert_success
    assert_equal "$(head -1 "$out/bubbles.csv")" "schedule,repeat,load,bubble_theory,bubble_measured,median_step_ms"
    # the formulas for P 2, M 8: (P-1)/(M+P-1) = 1/9; interleaved V 2: (P-1)/(VM+P-1) = 1/17; zb-h1: 1/25
    assert_equal "$(cut -d, -f1,2 "$out/bubbles_summary.csv" | tail -4 | tr '\n' ' ')" \
        "gpipe,0.1111 1f1b,0.1111 interleaved,0.0588 zb-h1,0.0400 "
    awk -F, 'NR > 1 { if (!($5 > 0 && $5 < 1 && $6 > 0)) { print "bad row: " $0; exit 1 } }' "$out/bubbles.csv"
    # zb-h1 also at the F, B, W its timeline measured (pipeline_bubble.py): a fraction, the others none;
    # every schedule replayed at its timeline's times: a fraction, and the measured median's excess over it
    awk -F, '$1 == "zb-h1" { ok = $7 > 0 && $7 < 1 } $1 == "1f1b" { none = $7 == "" } END { exit !(ok && none) }' \
        "$out/bubbles_summary.csv"
    awk -F, 'NR > 1 { n++; d = $3 / $9 - 1 - $10; if (!($9 > 0 && $9 < 1) || d > 0.006 || d < -0.006) { print "bad: " $0; exit 1 } }
        END { exit n != 4 }' "$out/bubbles_summary.csv"
}

@test "the measured bubble is within 25% of (P-1)/(M+P-1) on balanced stages (P=2, M=2, one thread per rank)" {
    # the issue's conditions: M >= P, no more ranks than cores, one OpenMP
    # thread per rank, MPI yielding its core while it waits
    for schedule in gpipe 1f1b; do
        out="$BATS_TEST_TMPDIR/$schedule"
        OMPI_MCA_mpi_yield_when_idle=1 pipeline 2 "$TRAIN04" --device cpu --model small --steps 6 --batch 32 \
            --micro 2 --schedule "$schedule" --sample 0 --quiet --eval-batches 1 \
            --data "$BATS_FILE_TMPDIR/corpus.txt" --out "$out" >/dev/null
        measured=$(csv_column "$out/run.csv" bubble_measured)
        theory=$(csv_column "$out/run.csv" bubble_theory)
        echo "$schedule: measured $measured, formula $theory"
        awk -v m="$measured" -v t="$theory" 'BEGIN { r = (m - t) / t; if (r < 0) r = -r; exit !(r <= 0.25) }'
    done
}
