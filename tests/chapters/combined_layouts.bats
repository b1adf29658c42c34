#!/usr/bin/env bats
# Cumulative chapters (issue 27): 04 is 03 plus micro-batch schedules, so it
# keeps tensor parallelism inside each stage and chapter 02's data
# parallelism around it: `04_pipeline/train --pp P --tp T` on P x T x D ranks
# gives chapter 01's losses (fp32 within 1e-4, bf16 within 1e-2 of 01's bf16
# run), and its checkpoints resume in 01's layout and back. 05 is 04 plus
# ZeRO over the data-parallel axis: stages 1-2 inside each pipeline stage
# give 01's losses too, and their checkpoints resume in 01's layout and back
# (with --tp, each rank shards its tensor-parallel slices over its dp group,
# as Megatron's distributed optimizer does, and the gradient norm counts the
# tp-replicated tensors once); what is not written (or unsound) is refused.
# 06 is 05 plus ZeRO-Offload: without --offload it is 05 (every layout), and
# --offload runs 05's pipeline layouts (uneven --split, any stage count,
# --tp) with the optimizer on the host, equal to 01 too.

load ../helpers

# Tiny model with 4 layers, 4 steps, a global batch of 8 (2 replicas x 2
# micro-batches x 2 sequences); a private copy of the corpus.
FLAGS="--device cpu --layers 4 --steps 4 --batch 8 --sample 0 --quiet --data $BATS_FILE_TMPDIR/corpus.txt"
export OMP_NUM_THREADS=1

setup_file() {
    local d="$BATS_FILE_TMPDIR"
    cp "$REPO/course.md" "$d/corpus.txt"
    "$TRAIN01" $FLAGS --out "$d/ref" >/dev/null
    "$TRAIN01" $FLAGS --precision bf16 --out "$d/ref_bf16" >/dev/null
    # 6 heads for tp 3, and a vocabulary of 384 rows, which 3 divides (256 does not)
    "$TRAIN01" $FLAGS --dmodel 48 --heads 6 --vocab 384 --out "$d/ref_h6" >/dev/null
}

# run04 NP OUT FLAGS...: chapter 04 on NP ranks.
run04() {
    local np="$1" out="$2"
    shift 2
    mpirun_np "$np" "$TRAIN04" $FLAGS --out "$out" "$@" >"$out.log"
}

# run05 NP OUT FLAGS...: chapter 05 on NP ranks.
run05() {
    local np="$1" out="$2"
    shift 2
    mpirun_np "$np" "$TRAIN05" $FLAGS --out "$out" "$@" >"$out.log"
}

# run06 NP OUT FLAGS...: chapter 06 on NP ranks.
run06() {
    local np="$1" out="$2"
    shift 2
    mpirun_np "$np" "$TRAIN06" $FLAGS --out "$out" "$@" >"$out.log"
}

@test "04 --pp 2 --tp 2 on 4 ranks matches single-device losses, 1F1B and GPipe" {
    for schedule in 1f1b gpipe; do
        run04 4 "$(scratch)/$schedule" --pp 2 --tp 2 --micro 2 --schedule $schedule
        assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/$schedule" 4
    done
    assert_equal "$(csv_column "$(scratch)/1f1b/run.csv" pp),$(csv_column "$(scratch)/1f1b/run.csv" tp)" "2,2"
    grep -q "4 ranks = 2 stages x 2 tensor-parallel x 1 replicas" "$(scratch)/1f1b.log"
}

# assert_axis_bytes RUN P V T D M: run.csv's bytes per step of each grid axis, summed over the ranks,
# against the formulas for the tiny model with 4 layers, a batch of 8 and M micro-batches per replica
# (N = 8 / (D M) x 64 tokens of C = 64 per micro-batch, fp32):
#   tp  4 all-reduces per block and micro-batch (2 forward, 2 backward), each 2(T-1)/T x N C x 4 bytes
#       per rank: D x T x 4 layers x M x 4 x 2(T-1)/T x 4NC; and the vocabulary split's: the
#       embedding's output and the head's input gradient all-reduced (N C each, on the first and the
#       last stage), each row's maximum all-gathered ((T-1) x 4N sent) and its sum of exponentials
#       and target logit all-reduced (2N): D x T x M x (2 x 2(T-1)/T x 4NC + (T-1) 4N + 2(T-1)/T x 8N)
#   pp  each micro-batch's activations and their gradient across the P V - 1 piece boundaries, sent
#       by every tp rank: D x T x M x 2(PV-1) x 4NC
#   dp  every rank's ring all-reduce of its gradients: 2(D-1)/D x its grads bytes (memory.csv)
assert_axis_bytes() {
    local run="$1" P="$2" V="$3" T="$4" D="$5" M="$6" NC4 N4 grads
    NC4=$((8 / (D * M) * 64 * 64 * 4)) N4=$((8 / (D * M) * 64 * 4))
    grads=$(awk -F, '$2 == "device" && $3 == "grads" { s += $4 } END { print s }' "$run/memory.csv")
    local vocab=$((D * T * M * (2 * 2 * (T - 1) * NC4 / T + (T - 1) * N4 + 2 * (T - 1) * 2 * N4 / T)))
    assert_equal "$(csv_column "$run/run.csv" bytes_tp_per_step)" "$((D * T * 4 * M * 4 * 2 * (T - 1) * NC4 / T + vocab))"
    assert_equal "$(csv_column "$run/run.csv" bytes_pp_per_step)" "$((D * T * M * 2 * (P * V - 1) * NC4))"
    assert_equal "$(csv_column "$run/run.csv" bytes_dp_per_step)" "$((2 * (D - 1) * grads / D))"
    assert_equal "$(csv_column "$run/run.csv" bytes_cp_per_step)" "0"
}

@test "04 --pp 2 --tp 2 on 8 ranks takes dp 2 from the rank count, matches single-device losses and counts each axis's bytes" {
    run04 8 "$(scratch)/3d" --pp 2 --tp 2 --micro 2
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/3d" 4
    assert_equal "$(csv_column "$(scratch)/3d/run.csv" dp)" "2"
    assert_equal "$(csv_column "$(scratch)/3d/run.csv" world_size)" "8"
    assert_axis_bytes "$(scratch)/3d" 2 1 2 2 2
}

@test "odd sizes: 3 stages, and tp 3 inside 1 stage and inside 2 stages, match single-device losses" {
    run04 3 "$(scratch)/pp3" --pp 3
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/pp3" 4
    run04 3 "$(scratch)/tp3" --tp 3 --dmodel 48 --heads 6 --vocab 384
    assert_losses_match "$BATS_FILE_TMPDIR/ref_h6" "$(scratch)/tp3" 4
    run04 6 "$(scratch)/pp2tp3" --pp 2 --tp 3 --dmodel 48 --heads 6 --vocab 384 --micro 2 --recompute
    assert_losses_match "$BATS_FILE_TMPDIR/ref_h6" "$(scratch)/pp2tp3" 4
}

# Peak device bytes of CATEGORY on rank R.
device_bytes() { awk -F, -v r="$2" -v c="$3" '$1 == r && $2 == "device" && $3 == c { print $4 }' "$1/memory.csv"; }

@test "pp 2 x tp 2: each rank holds its stage's units, the block matrices and the vocabulary's rows 1/tp, the rest whole" {
    run04 4 "$(scratch)/mem" --pp 2 --tp 2 --split 3,1
    V=256 T=64 C=64 tp=2
    sliced=$((12 * C * C + 7 * C)) # qkvw, qkvb, attprojw, fcw, fcb, fcprojw
    replicated=$((6 * C))          # ln1, ln2 (weight and bias), attprojb, fcprojb
    block=$((sliced / tp + replicated))
    # wte and the head: V / tp rows each (vocab-parallel); wpe and ln_f whole
    stage0=$(((V / tp + T) * C + 3 * block)) stage1=$((block + 2 * C + V / tp * C)) # rank = stage x tp + t
    for r in 0 1; do assert_equal "$(device_bytes "$(scratch)/mem" $r params)" "$((4 * stage0))"; done
    for r in 2 3; do assert_equal "$(device_bytes "$(scratch)/mem" $r params)" "$((4 * stage1))"; done
    assert_equal "$(device_bytes "$(scratch)/mem" 3 optimizer)" "$((8 * stage1))" # Adam's m and v
    assert_equal "$(csv_column "$(scratch)/mem/run.csv" params)" "$(((V + T) * C + 4 * (sliced + replicated) + 2 * C + V * C))"
}

@test "bf16: --pp 2 --tp 2 is within 1e-2 of chapter 01's bf16 run, 1F1B, zb-h1 and interleaved (1F1B's bit for bit)" {
    for schedule in 1f1b zb-h1 interleaved; do
        run04 4 "$(scratch)/bf16-$schedule" --pp 2 --tp 2 --micro 2 --precision bf16 --schedule $schedule \
            --virtual $([ $schedule = interleaved ] && echo 2 || echo 1)
        assert_losses_within "$BATS_FILE_TMPDIR/ref_bf16" "$(scratch)/bf16-$schedule" 4 1e-2
    done
    assert_equal "$(cut -d, -f2,4 "$(scratch)/bf16-zb-h1/steps.csv")" "$(cut -d, -f2,4 "$(scratch)/bf16-1f1b/steps.csv")"
    assert_equal "$(cut -d, -f2,4 "$(scratch)/bf16-interleaved/steps.csv")" "$(cut -d, -f2,4 "$(scratch)/bf16-1f1b/steps.csv")"
    # interleaved's 16-bit storage: stage 0's chunks (embedding and block 0, block 2) in 2 bytes a parameter
    V=256 T=64 C=64
    assert_equal "$(device_bytes "$(scratch)/bf16-interleaved" 0 params)" "$((2 * ((V / 2 + T) * C + 2 * ((12 * C * C + 7 * C) / 2 + 6 * C))))"
}

# The schedules past 1F1B keep tensor parallelism inside the stages: zb-h1's
# B of a sliced block has its two all-reduces and its W none; interleaved
# holds each chunk's slices in one buffer.
@test "04 --pp 2 --tp 2 with zb-h1 (1F1B's bit for bit) and interleaved --virtual 2 match single-device losses, with --recompute bit for bit" {
    for schedule in 1f1b zb-h1 interleaved; do
        run04 4 "$(scratch)/$schedule" --pp 2 --tp 2 --micro 2 --schedule $schedule \
            $([ $schedule = interleaved ] && echo --virtual 2)
        assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/$schedule" 4
    done
    assert_equal "$(cut -d, -f2,4 "$(scratch)/zb-h1/steps.csv")" "$(cut -d, -f2,4 "$(scratch)/1f1b/steps.csv")"
    run04 4 "$(scratch)/zb-recompute" --pp 2 --tp 2 --micro 2 --schedule zb-h1 --recompute # B and W recompute
    assert_equal "$(cut -d, -f2,4 "$(scratch)/zb-recompute/steps.csv")" "$(cut -d, -f2,4 "$(scratch)/1f1b/steps.csv")"
    run04 4 "$(scratch)/il-recompute" --pp 2 --tp 2 --micro 2 --schedule interleaved --virtual 2 --recompute
    assert_equal "$(cut -d, -f2,4 "$(scratch)/il-recompute/steps.csv")" "$(cut -d, -f2,4 "$(scratch)/interleaved/steps.csv")"
    # interleaved: stage 0 holds the embedding, blocks 0 and 2; stage 1 blocks 1 and 3 and the head
    V=256 T=64 C=64 tp=2
    block=$(((12 * C * C + 7 * C) / tp + 6 * C))
    for r in 0 1; do assert_equal "$(device_bytes "$(scratch)/interleaved" $r params)" "$((4 * ((V / tp + T) * C + 2 * block)))"; done
    for r in 2 3; do assert_equal "$(device_bytes "$(scratch)/interleaved" $r params)" "$((4 * (2 * block + 2 * C + V / tp * C)))"; done
}

@test "04 pp 2 x tp 2 x dp 2 on 8 ranks with zb-h1 and interleaved --virtual 2 matches single-device losses" {
    run04 8 "$(scratch)/zb" --pp 2 --tp 2 --micro 2 --schedule zb-h1
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/zb" 4
    run04 8 "$(scratch)/il" --pp 2 --tp 2 --micro 2 --schedule interleaved --virtual 2
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/il" 4
    assert_axis_bytes "$(scratch)/zb" 2 1 2 2 2 # zb-h1: 1F1B's messages, posted
    assert_axis_bytes "$(scratch)/il" 2 2 2 2 2 # interleaved: V times the messages between stages
    grep -q "8 ranks = 2 stages x 2 tensor-parallel x 2 replicas | schedule interleaved" "$(scratch)/il.log"
}

# An interleaved stage's tp slices lie in one buffer chunk after chunk: the
# replicas' naive and overlapped sums find each tensor where it lies
# (gpt_held_offset through the model's unit_at).
@test "04 pp 2 x tp 2 x dp 2 interleaved with --dp-mode naive and overlap matches single-device losses, the replicas equal" {
    # shown to fail: with the tp model's unit_at left unset, naive summed the second chunk's gradients at the
    # wrong offsets, past the buffer (other losses, then "double free or corruption" on every rank), and
    # overlap ended on "gradient buckets: no held tensor ends at element 58688"
    local mode
    for mode in naive overlap; do
        run04 8 "$(scratch)/il-$mode" --pp 2 --tp 2 --micro 2 --schedule interleaved --virtual 2 \
            --dp-mode $mode --bucket-mb 0.05 --check-replicas 1
        assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/il-$mode" 4
    done
}

# Chapter 02's overlap inside the stages: each bucket of a stage's gradients
# is all-reduced once its units' last backward of the step has run (zb-h1:
# W; interleaved: chunk by chunk; a tied embedding after the two ends summed
# it). Small buckets, so that every stage has several.
@test "04 --dp-mode overlap across replicas of a pipeline matches single-device losses, and flat's bit for bit" {
    local d="$(scratch)" o="--dp-mode overlap --bucket-mb 0.05"
    for layout in "4 --pp 2 --micro 2" "4 --pp 2 --micro 2 --schedule zb-h1" \
        "4 --pp 2 --micro 2 --schedule interleaved --virtual 2" "8 --pp 2 --tp 2 --micro 2"; do
        local name="${layout// /}"
        run04 ${layout%% *} "$d/flat$name" ${layout#* }
        run04 ${layout%% *} "$d/overlap$name" ${layout#* } $o
        assert_losses_match "$BATS_FILE_TMPDIR/ref" "$d/overlap$name" 4
        assert_equal "$(cut -d, -f2,4 "$d/overlap$name/steps.csv")" "$(cut -d, -f2,4 "$d/flat$name/steps.csv")"
    done
    run04 4 "$d/buckets" --pp 2 --micro 2 $o --print-buckets
    [ "$(grep -c '^ *[0-9]*  \[' "$d/buckets.log")" -gt 2 ] # stage 0's buckets, several
    run04 4 "$d/tied-flat" --pp 2 --micro 2 --tie-embeddings
    run04 4 "$d/tied" --pp 2 --micro 2 --tie-embeddings $o
    assert_equal "$(cut -d, -f2,4 "$d/tied/steps.csv")" "$(cut -d, -f2,4 "$d/tied-flat/steps.csv")"
    run04 4 "$d/bf16" --pp 2 --micro 2 --precision bf16 $o
    assert_losses_within "$BATS_FILE_TMPDIR/ref_bf16" "$d/bf16" 4 1e-2
    run05 4 "$d/z0" --zero 0 --pp 2 --micro 2 $o # chapter 05's --zero 0 is chapter 04
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$d/z0" 4
}

# Chapter 03's context parallelism inside the stages (Megatron runs cp under
# pp): each stage's cp ranks hold T/cp positions of every sequence and pass
# keys and values round a ring in every attention; the stages exchange the
# activations of those positions only. The grid is pp x cp x tp x dp.
@test "04 --cp 2 inside 2 stages (1F1B, zb-h1, interleaved, --recompute; with tp 2, dp 2, overlap) matches single-device losses" {
    local d="$(scratch)"
    for layout in "4 --pp 2 --cp 2 --micro 2" "4 --pp 2 --cp 2 --micro 2 --schedule zb-h1" \
        "4 --pp 2 --cp 2 --micro 2 --schedule interleaved --virtual 2" "4 --pp 2 --cp 2 --micro 2 --recompute" \
        "8 --pp 2 --cp 2 --tp 2 --micro 2" "8 --pp 2 --cp 2 --micro 2 --dp-mode overlap --cp-order contiguous"; do
        local name="${layout// /}"
        run04 ${layout%% *} "$d/$name" ${layout#* }
        assert_losses_match "$BATS_FILE_TMPDIR/ref" "$d/$name" 4
    done
    grep -q "8 ranks = 2 stages x 2 context-parallel (zigzag) x 2 tensor-parallel x 1 replicas" "$d/8--pp2--cp2--tp2--micro2.log"
    # run.csv, summed over the ranks, for pp 2 x cp 2 x tp 2 (N = 2 cp ranks, T = 2 tp ranks, D = 1,
    # M = 2 micro-batches of B = 4 sequences, 4 layers, seq 64, C = 64, fp32; context_parallel.h):
    #   cp  every rank, every layer and micro-batch: (N-1) S forward, (N-1) S + N S backward, with
    #       S = B x (seq/N) x 2 (C/T) x 4 its heads' keys and values: D T N x 4 x M x (3N-2) S
    #   pp  the activations of T/N positions and their gradient, by each cp and tp rank: D T N M x 2 x B (seq/N) C x 4
    local run="$d/8--pp2--cp2--tp2--micro2" S=$((4 * 32 * 2 * 32 * 4))
    assert_equal "$(csv_column "$run/run.csv" bytes_cp_per_step)" "$((2 * 2 * 4 * 2 * 4 * S))"
    assert_equal "$(csv_column "$run/run.csv" bytes_pp_per_step)" "$((2 * 2 * 2 * 2 * 4 * 32 * 64 * 4))"
}

# Chapter 03's sequence parallelism inside the stages' tensor groups: each
# stage's first block takes its rows of the stage's whole input, its last
# gathers the output whole for the next stage (tensor_parallel.h).
@test "04 --sp inside 2 stages (1F1B, GPipe with dp 2), 05 --zero 2 and 06 --offload with it match single-device losses and norms" {
    local d="$(scratch)"
    run04 4 "$d/sp" --pp 2 --tp 2 --sp --micro 2
    run04 8 "$d/sp-gpipe" --pp 2 --tp 2 --sp --micro 2 --schedule gpipe
    run05 8 "$d/z2" --zero 2 --pp 2 --tp 2 --sp --micro 2
    run06 4 "$d/off" --offload --pp 2 --tp 2 --sp --micro 2
    for run in sp sp-gpipe z2 off; do
        assert_losses_match "$BATS_FILE_TMPDIR/ref" "$d/$run" 4
        assert_norms_match "$BATS_FILE_TMPDIR/ref" "$d/$run" 4
    done
    # the layernorm and residual regions in rows: fewer activation bytes than tp alone
    run04 4 "$d/tp" --pp 2 --tp 2 --micro 2
    [ "$(device_bytes "$d/sp" 0 activations)" -lt "$(device_bytes "$d/tp" 0 activations)" ]
}

# The cp ranks of a stage hold the same weights, as replicas do: they share
# the writing of the stage's part (checkpoint.h), each element written once.
@test "a pp 2 x cp 2 checkpoint resumes in chapter 01's layout, and 01's in pp 2 x cp 2 x tp 2" {
    local d="$(scratch)"
    run04 4 "$d/first" --pp 2 --cp 2 --micro 2 --stop-after 2 --save "$d/ckcp"
    "$TRAIN01" $FLAGS --resume "$d/ckcp" --out "$d/one" >/dev/null
    "$TRAIN01" $FLAGS --stop-after 2 --save "$d/ck01" --out "$d/first01" >/dev/null
    run04 8 "$d/back" --pp 2 --cp 2 --tp 2 --micro 2 --resume "$d/ck01"
    mkdir "$d/ref" # steps 3-4 of the uninterrupted run
    { echo loss; csv_column "$BATS_FILE_TMPDIR/ref/steps.csv" loss | tail -2; } >"$d/ref/steps.csv"
    assert_losses_within "$d/ref" "$d/one" 2 1e-5
    assert_losses_within "$d/ref" "$d/back" 2 1e-5
}

@test "chapter 02's and 03's flags stay: naive and ring all-reduces, the replica check, --mp tensor, --split" {
    run04 4 "$(scratch)/naive" --pp 2 --dp-mode naive --allreduce ring --check-replicas 1 --split 3,1
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/naive" 4
    # interleaved's stage holds two runs of units: naive all-reduces each tensor where unit_at puts it
    run04 4 "$(scratch)/naive-il" --pp 2 --micro 2 --schedule interleaved --virtual 2 --dp-mode naive
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/naive-il" 4
    grep -q "stage 0: blocks 0..2 + embedding" "$(scratch)/naive.log"
    run04 2 "$(scratch)/tensor" --mp tensor
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/tensor" 4
    assert_equal "$(csv_column "$(scratch)/tensor/run.csv" tp)" "2"
    assert_equal "$(head -1 "$(scratch)/tensor/busy.csv")" "rank,step,busy_ms,step_ms"
}

@test "pp 2 x tp 2 writes chapter 01's validation loss and text sample, as chapter 03 does" {
    local d="$(scratch)" f="--device cpu --layers 4 --steps 2 --batch 4 --sample 24 --quiet"
    "$TRAIN01" $f --data "$BATS_FILE_TMPDIR/corpus.txt" --out "$d/ref" | grep '^sample:' >"$d/ref.txt"
    mpirun_np 4 "$TRAIN04" $f --data "$BATS_FILE_TMPDIR/corpus.txt" --pp 2 --tp 2 --out "$d/3d" |
        grep '^sample:' >"$d/3d.txt"
    assert_equal "$(cat "$d/3d.txt")" "$(cat "$d/ref.txt")"
    paste -d, <(csv_column "$d/ref/steps.csv" val_loss) <(csv_column "$d/3d/steps.csv" val_loss) | tail -1 |
        awk -F, '{ r = ($1 - $2) / $1; if (r < 0) r = -r; ok = $1 > 0 && r < 1e-4 } END { exit !ok }'
}

@test "a pp 2 x tp 2 checkpoint resumes in chapter 01's layout, and 01's in pp 2 x tp 2" {
    local d="$(scratch)"
    run04 4 "$d/first" --pp 2 --tp 2 --stop-after 2 --save "$d/ck3d"
    "$TRAIN01" $FLAGS --resume "$d/ck3d" --out "$d/one" >/dev/null
    "$TRAIN01" $FLAGS --stop-after 2 --save "$d/ck01" --out "$d/first01" >/dev/null
    run04 4 "$d/back" --pp 2 --tp 2 --resume "$d/ck01"
    mkdir "$d/ref" # steps 3-4 of the uninterrupted run
    { echo loss; csv_column "$BATS_FILE_TMPDIR/ref/steps.csv" loss | tail -2; } >"$d/ref/steps.csv"
    assert_losses_within "$d/ref" "$d/one" 2 1e-5
    assert_losses_within "$d/ref" "$d/back" 2 1e-5
}

# interleaved: a stage's chunks are several runs of the table (model.unit_at, tp_model_create_chunks)
@test "an interleaved checkpoint (pp 2 x tp 2 x dp 2, V = 2) resumes in chapter 01's layout, and 01's in interleaved pp 2 x dp 2" {
    local d="$(scratch)"
    run04 8 "$d/first" --pp 2 --tp 2 --micro 2 --schedule interleaved --virtual 2 --stop-after 2 --save "$d/ck-il"
    "$TRAIN01" $FLAGS --resume "$d/ck-il" --out "$d/one" >/dev/null
    "$TRAIN01" $FLAGS --stop-after 2 --save "$d/ck01" --out "$d/first01" >/dev/null
    run04 4 "$d/back" --pp 2 --micro 2 --schedule interleaved --virtual 2 --resume "$d/ck01"
    mkdir "$d/ref" # steps 3-4 of the uninterrupted run
    { echo loss; csv_column "$BATS_FILE_TMPDIR/ref/steps.csv" loss | tail -2; } >"$d/ref/steps.csv"
    assert_losses_within "$d/ref" "$d/one" 2 1e-5
    assert_losses_within "$d/ref" "$d/back" 2 1e-5
}

@test "layouts that do not fit are refused with the rule: the world, --mp tensor with stages, heads" {
    run --separate-stderr bash -c "$(declare -f mpirun_np); mpirun_np 4 '$TRAIN04' $FLAGS --pp 2 --tp 2 --dp 2"
    assert_equal "$status" 2
    [[ "$stderr" == *"4 ranks cannot hold 2 pipeline stages x --tp 2 x --dp 2 (valid: mpirun -np 8, world = pp x tp x dp)"* ]]
    run --separate-stderr bash -c "$(declare -f mpirun_np); mpirun_np 2 '$TRAIN04' $FLAGS --mp tensor --pp 2"
    assert_equal "$status" 2
    [[ "$stderr" == *"--mp tensor slices every layer over all of a replica's ranks, so it has one stage"* ]]
    run --separate-stderr bash -c "$(declare -f mpirun_np); mpirun_np 3 '$TRAIN04' $FLAGS --tp 3"
    assert_equal "$status" 2
    [[ "$stderr" == *"--tp 3 does not divide --heads 4"* ]]
}

@test "05 --zero 1 and --zero 2 with --pp 2 on 4 ranks (dp 2 inside each stage) match single-device losses" {
    for stage in 1 2; do
        run05 4 "$(scratch)/z$stage" --zero $stage --pp 2 --micro 2
        assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/z$stage" 4
        assert_equal "$(csv_column "$(scratch)/z$stage/run.csv" pp),$(csv_column "$(scratch)/z$stage/run.csv" dp)" "2,2"
    done
}

@test "05 --zero 2 with 3 uneven stages x dp 2 on 6 ranks, GPipe and --recompute, matches single-device losses" {
    run05 6 "$(scratch)/pp3" --zero 2 --pp 3 --split 2,1,1 --micro 2 --schedule gpipe --recompute
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/pp3" 4
}

@test "05 --zero 1 with --pp 2 shards each stage's optimizer state over its dp group" {
    run05 4 "$(scratch)/mem" --zero 1 --pp 2 --split 3,1
    V=256 T=64 C=64
    block=$((12 * C * C + 13 * C))
    stage0=$(((V + T) * C + 3 * block)) stage1=$((block + 2 * C + V * C)) # rank = d x pp + stage
    for r in 0 2; do
        assert_equal "$(device_bytes "$(scratch)/mem" $r params)" "$((4 * stage0))"
        assert_equal "$(device_bytes "$(scratch)/mem" $r grads)" "$((4 * stage0))"
        assert_equal "$(device_bytes "$(scratch)/mem" $r optimizer)" "$((8 * stage0 / 2))" # m, v: half the units
    done
    for r in 1 3; do
        assert_equal "$(device_bytes "$(scratch)/mem" $r params)" "$((4 * stage1))"
        assert_equal "$(device_bytes "$(scratch)/mem" $r optimizer)" "$((8 * stage1 / 2))"
    done
}

# assert_norms_match REF RUN STEPS: the gradient norms agree within 1e-4 (a
# norm that counted the tp-replicated tensors tp times moves the losses by
# less than that in 4 steps, the norm by a third).
assert_norms_match() { assert_column_match grad_norm "$@"; }

@test "05 --zero 1 and --zero 2 with --pp 2 --tp 2 x dp 2 on 8 ranks match single-device losses and norms" {
    for stage in 1 2; do
        run05 8 "$(scratch)/z$stage" --zero $stage --pp 2 --tp 2 --micro 2
        assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/z$stage" 4
        assert_norms_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/z$stage" 4
    done
    assert_equal "$(csv_column "$(scratch)/z2/run.csv" tp),$(csv_column "$(scratch)/z2/run.csv" dp)" "2,2"
    # stage 2: each rank holds its tp slices of its stage's units, and 1/dp of
    # their gradients and optimizer state (rank = d x 4 + stage x 2 + t)
    V=256 T=64 C=64
    block=$((6 * C * C + 19 * C / 2)) # the matrices and column biases 1/tp, the rest whole
    stage0=$(((V / 2 + T) * C + 2 * block)) stage1=$((2 * block + 2 * C + V / 2 * C)) # wte, lm_head: V/tp rows
    for r in 0 1 4 5; do
        assert_equal "$(device_bytes "$(scratch)/z2" $r params)" "$((4 * stage0))"
        assert_equal "$(device_bytes "$(scratch)/z2" $r grads)" "$((4 * stage0 / 2))"
        assert_equal "$(device_bytes "$(scratch)/z2" $r optimizer)" "$((8 * stage0 / 2))"
    done
    for r in 2 3 6 7; do
        assert_equal "$(device_bytes "$(scratch)/z2" $r grads)" "$((4 * stage1 / 2))"
        assert_equal "$(device_bytes "$(scratch)/z2" $r optimizer)" "$((8 * stage1 / 2))"
    done
}

@test "05 --zero 2 --tp 2 on 4 ranks (one stage, dp 2) matches single-device losses and norms, and with zb-h1 bit for bit" {
    run05 4 "$(scratch)/tp" --zero 2 --tp 2 --micro 2
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/tp" 4
    assert_norms_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/tp" 4
    assert_equal "$(csv_column "$(scratch)/tp/run.csv" pp),$(csv_column "$(scratch)/tp/run.csv" zero)" "1,2"
    run05 4 "$(scratch)/zb" --zero 2 --tp 2 --micro 2 --schedule zb-h1 # the sliced blocks' B and W, ZeRO around both
    assert_equal "$(cut -d, -f2,4 "$(scratch)/zb/steps.csv")" "$(cut -d, -f2,4 "$(scratch)/tp/steps.csv")"
}

@test "bf16: 05 --zero 2 --tp 2 on 4 ranks is within 1e-2 of chapter 01's bf16 run; 16-bit slices, 1/dp of their gradients and of the fp32 state" {
    run05 4 "$(scratch)/bf16" --zero 2 --tp 2 --micro 2 --precision bf16
    assert_losses_within "$BATS_FILE_TMPDIR/ref_bf16" "$(scratch)/bf16" 4 1e-2
    V=256 T=64 C=64
    held=$(((V / 2 + T) * C + 4 * (6 * C * C + 19 * C / 2) + 2 * C + V / 2 * C)) # tp 2: each rank's slices of the model
    for r in 0 1 2 3; do
        assert_equal "$(device_bytes "$(scratch)/bf16" $r params)" "$((2 * held))"
        assert_equal "$(device_bytes "$(scratch)/bf16" $r grads)" "$((2 * held / 2))"
        assert_equal "$(device_bytes "$(scratch)/bf16" $r optimizer)" "$((12 * held / 2))" # master, m, v
    done
}

@test "a ZeRO-2 checkpoint of pp 2 x tp 2 x dp 2 resumes in chapter 01's layout, and 01's in ZeRO-1 over tp 2 x dp 2" {
    local d="$(scratch)"
    run05 8 "$d/first" --zero 2 --pp 2 --tp 2 --micro 2 --stop-after 2 --save "$d/ckz"
    "$TRAIN01" $FLAGS --resume "$d/ckz" --out "$d/one" >/dev/null
    "$TRAIN01" $FLAGS --stop-after 2 --save "$d/ck01" --out "$d/first01" >/dev/null
    run05 4 "$d/back" --zero 1 --tp 2 --micro 2 --resume "$d/ck01"
    mkdir "$d/ref" # steps 3-4 of the uninterrupted run
    { echo loss; csv_column "$BATS_FILE_TMPDIR/ref/steps.csv" loss | tail -2; } >"$d/ref/steps.csv"
    assert_losses_within "$d/ref" "$d/one" 2 1e-5
    assert_losses_within "$d/ref" "$d/back" 2 1e-5
}

# zb-h1 under ZeRO: ZeRO's calls around a unit are its storage's (model.h), so
# the split backward runs them around each unit's B and again around its W;
# stage 2 reduce-scatters after each, the other half's elements zeros, which
# add nothing: 1F1B's sums in 1F1B's order, bit for bit, in fp32 and in bf16
# (whose 16-bit path through the storage calls ZeRO-1 takes too).
@test "05 --zero 2 --pp 2 x dp 2 with zb-h1 matches single-device losses and norms, and 1F1B's bit for bit in fp32 and bf16" {
    for precision in fp32 bf16; do
        for schedule in 1f1b zb-h1; do
            run05 4 "$(scratch)/$precision-$schedule" --zero 2 --pp 2 --micro 2 --schedule $schedule --precision $precision
        done
        assert_equal "$(cut -d, -f2,4 "$(scratch)/$precision-zb-h1/steps.csv")" "$(cut -d, -f2,4 "$(scratch)/$precision-1f1b/steps.csv")"
    done
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/fp32-zb-h1" 4
    assert_norms_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/fp32-zb-h1" 4
    assert_losses_within "$BATS_FILE_TMPDIR/ref_bf16" "$(scratch)/bf16-zb-h1" 4 1e-2
    assert_equal "$(csv_column "$(scratch)/fp32-zb-h1/run.csv" zero),$(csv_column "$(scratch)/fp32-zb-h1/run.csv" schedule)" "2,zb-h1"
}

@test "05 --zero 0 with --pp 2 --tp 2 is chapter 04's step, and matches single-device losses" {
    run05 4 "$(scratch)/z0" --zero 0 --pp 2 --tp 2 --micro 2 --dp-mode naive
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/z0" 4
}

# 05 and 06 keep chapter 04's steps.csv columns: the ranks' idle fraction
# and the stages' bubble (0 with one stage), before their own.
@test "05 and 06 keep chapter 04's idle_fraction and bubble columns, with stages and with one" {
    local d="$(scratch)"
    run05 4 "$d/z1pp" --zero 1 --pp 2 --micro 2
    run05 2 "$d/z2" --zero 2
    run06 2 "$d/off" --offload --pp 2 --micro 2
    for run in z1pp z2 off; do
        head -1 "$d/$run/steps.csv" | grep -q ',idle_fraction,ep_rows_max,ep_rows_mean,bubble,' || { head -1 "$d/$run/steps.csv"; false; }
        csv_column "$d/$run/steps.csv" idle_fraction |
            awk '{ n++; if ($1 < 0 || $1 >= 1) bad = 1 } END { exit bad || n != 4 }'
        assert_equal "$(tail -n +2 "$d/$run/busy.csv" | wc -l)" "$(($(csv_column "$d/$run/run.csv" world_size) * 4))"
    done
    for run in z1pp off; do # 2 stages, 2 micro-batches: the stages wait
        csv_column "$d/$run/steps.csv" bubble | awk '{ n++; if ($1 <= 0 || $1 >= 1) bad = 1 } END { exit bad || n != 4 }'
    done
    assert_equal "$(csv_column "$d/z2/steps.csv" bubble | sort -u)" "0.0000" # one stage: no bubble
}

# 05 and 06 keep 04's context parallelism: the cp ranks of a stage hold the
# same weights, so ZeRO shards them (and 06 offloads them) over the dp x cp
# ranks, as Megatron's distributed optimizer does; one stage with --cp runs
# 04's schedule, not ZeRO's own step.
@test "05 --zero 1/2 and 06 --offload with --cp 2 (one stage, 2 stages, tp 2) match single-device losses and norms, and resume in 01" {
    local d="$(scratch)"
    run05 4 "$d/z1" --zero 1 --cp 2
    run05 8 "$d/z2pp" --zero 2 --pp 2 --cp 2 --micro 2 --stop-after 2 --save "$d/ck"
    run05 8 "$d/z2tp" --zero 2 --tp 2 --cp 2 --micro 2
    run06 4 "$d/off" --offload --cp 2
    run06 8 "$d/offpp" --offload --pp 2 --cp 2 --micro 2
    for run in z1 z2tp off offpp; do
        assert_losses_match "$BATS_FILE_TMPDIR/ref" "$d/$run" 4
        assert_norms_match "$BATS_FILE_TMPDIR/ref" "$d/$run" 4
    done
    "$TRAIN01" $FLAGS --resume "$d/ck" --out "$d/one" >/dev/null
    mkdir "$d/ref" # steps 3-4 of the uninterrupted run
    { echo loss; csv_column "$BATS_FILE_TMPDIR/ref/steps.csv" loss | tail -2; } >"$d/ref/steps.csv"
    assert_losses_within "$d/ref" "$d/one" 2 1e-5
}

@test "05 refuses ZeRO-3 across pipeline stages with DeepSpeed's reason, ZeRO-3 with tp, and what is not written yet (interleaved chunks) in one line" {
    refused05() {
        run --separate-stderr bash -c "$(declare -f mpirun_np); mpirun_np 4 '$TRAIN05' $FLAGS $*"
        assert_equal "$status" 2
        assert_equal "$(printf '%s\n' "$stderr" | grep -c '^error:')" 1
    }
    refused05 --zero 3 --pp 2
    [[ "$stderr" == *"--zero 3 with --pp 2 is refused: every stage would re-gather its parameters for every micro-batch's forward and backward"* ]]
    refused05 --zero 3 --tp 2
    [[ "$stderr" == *"--zero 3 with --tp 2 is not written: stage 3's gather/free schedule runs in ZeRO's one-stage trainer"* ]]
    refused05 --zero 1 --pp 2 --dp-mode naive
    [[ "$stderr" == *"--dp-mode is chapter 04's, for whole replicas"* ]]
    refused05 --zero 1 --pp 2 --micro 2 --schedule interleaved --virtual 2
    [[ "$stderr" == *"--virtual (interleaved chunks) with ZeRO is not written yet: a stage's shards are one range of units"* ]]
    refused05 --zero 2 --schedule gpipe # one stage: ZeRO's own step, no schedule to follow
    [[ "$stderr" == *"--schedule orders pipeline stages; with --pp 1 --tp 1 ZeRO runs its own one-stage step"* ]]
}

@test "06 without --offload is chapter 05: ZeRO-1 over 2 stages and over tp slices, pp 2 x tp 2, and interleaved stages match single-device losses" {
    run06 4 "$(scratch)/z1" --zero 1 --pp 2 --micro 2
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/z1" 4
    run06 4 "$(scratch)/tp" --zero 0 --pp 2 --tp 2 --micro 2 --dp-mode naive
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/tp" 4
    assert_equal "$(csv_column "$(scratch)/tp/run.csv" tp),$(csv_column "$(scratch)/tp/run.csv" zero)" "2,0"
    run06 4 "$(scratch)/ztp" --zero 1 --tp 2 --micro 2 # ZeRO over the tp slices
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/ztp" 4
    run06 2 "$(scratch)/v2" --zero 0 --pp 2 --schedule interleaved --virtual 2 --micro 2
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/v2" 4
}

@test "06 --offload --tp 2 on 4 ranks: the host holds 1/dp of each rank's slices' state; 01's losses and norms, and its checkpoint resumes in 01" {
    local d="$(scratch)"
    run06 4 "$d/tp" --offload --tp 2 --micro 2 --stop-after 2 --save "$d/ck"
    mkdir "$d/ref12" # steps 1-2 of the uninterrupted run
    head -3 "$BATS_FILE_TMPDIR/ref/steps.csv" >"$d/ref12/steps.csv"
    assert_losses_match "$d/ref12" "$d/tp" 2
    assert_norms_match "$d/ref12" "$d/tp" 2
    grep -q "4 ranks = 1 stages x 2 tensor-parallel x 2 replicas" "$d/tp.log"
    "$TRAIN01" $FLAGS --resume "$d/ck" --out "$d/one" >/dev/null
    mkdir "$d/ref" # steps 3-4 of the uninterrupted run
    { echo loss; csv_column "$BATS_FILE_TMPDIR/ref/steps.csv" loss | tail -2; } >"$d/ref/steps.csv"
    assert_losses_within "$d/ref" "$d/one" 2 1e-5
    V=256 T=64 C=64
    held=$(((V / 2 + T) * C + 4 * (6 * C * C + 19 * C / 2) + 2 * C + V / 2 * C)) # tp 2: each rank's slices
    host_bytes() { awk -F, -v r="$2" -v c="$3" '$1 == r && $2 == "host" && $3 == c { print $4 }' "$1/memory.csv"; }
    for r in 0 1 2 3; do
        assert_equal "$(device_bytes "$d/tp" $r params)" "$((4 * held))"
        assert_equal "$(host_bytes "$d/tp" $r grads)" "$((4 * held / 2))"
        assert_equal "$(host_bytes "$d/tp" $r optimizer)" "$((12 * held / 2))" # master, m, v
    done
}

@test "06 --offload takes 05's pipeline layouts: uneven --split 3,1 on 2 stages and 3 stages on 3 ranks match single-device losses" {
    run06 2 "$(scratch)/split" --offload --pp 2 --split 3,1 --micro 2
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/split" 4
    assert_equal "$(csv_column "$(scratch)/split/run.csv" offload),$(csv_column "$(scratch)/split/run.csv" pp)" "1,2"
    run06 3 "$(scratch)/pp3" --offload --pp 3 --schedule gpipe --micro 2
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$(scratch)/pp3" 4
}
