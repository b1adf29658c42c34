#!/usr/bin/env bats
# 03_model_parallel: the layer split and tensor parallelism, alone and with
# data parallel replicas, give chapter 01's losses; each rank holds only its
# part of the model; bad layouts are refused.

load ../helpers


# Tiny model, 4 steps, a global batch of 12 (divisible by dp 1, 2); a private
# copy of the corpus, so that editing course.md meanwhile changes nothing.
FLAGS="--device cpu --steps 4 --batch 12 --sample 0 --quiet --data $BATS_FILE_TMPDIR/corpus.txt"

setup_file() {
    local d="$BATS_FILE_TMPDIR"
    cp "$REPO/course.md" "$d/corpus.txt"
    "$TRAIN01" $FLAGS --out "$d/ref" >/dev/null
    "$TRAIN01" $FLAGS --layers 4 --out "$d/ref_l4" >/dev/null
    # tp 3 needs a vocabulary of rows it divides: 384 (256 bytes and 128 more rows)
    "$TRAIN01" $FLAGS --dmodel 48 --heads 3 --vocab 384 --out "$d/ref_h3" >/dev/null
    "$TRAIN01" $FLAGS --dmodel 48 --heads 6 --vocab 384 --out "$d/ref_h6" >/dev/null
}

# run03 NP OUT FLAGS...: chapter 03 on NP ranks, one OpenMP thread each.
run03() {
    local np="$1" out="$2"
    shift 2
    OMP_NUM_THREADS=1 mpirun_np "$np" "$TRAIN03" $FLAGS --out "$out" "$@" >"$out.log"
}

# Peak device params bytes of rank R.
params_bytes() { awk -F, -v r="$2" '$1 == r && $2 == "device" && $3 == "params" { print $4 }' "$1/memory.csv"; }

@test "the layer split on 2 ranks matches single-device losses" {
    run03 2 "$BATS_TEST_TMPDIR/l2"
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$BATS_TEST_TMPDIR/l2" 4
}

@test "the layer split on 3 and 4 ranks matches single-device losses" {
    for np in 3 4; do
        run03 $np "$BATS_TEST_TMPDIR/l$np" --layers 4
        assert_losses_match "$BATS_FILE_TMPDIR/ref_l4" "$BATS_TEST_TMPDIR/l$np" 4
    done
}

@test "--split sets the blocks per stage, and the losses still match" {
    run03 2 "$BATS_TEST_TMPDIR/s31" --layers 4 --split 3,1
    grep -q "layer split, blocks per stage 3,1" "$BATS_TEST_TMPDIR/s31.log"
    assert_losses_match "$BATS_FILE_TMPDIR/ref_l4" "$BATS_TEST_TMPDIR/s31" 4
}

@test "tensor parallel on 2 and 4 ranks matches single-device losses" {
    for tp in 2 4; do
        run03 $tp "$BATS_TEST_TMPDIR/t$tp" --mp tensor --tp $tp
        assert_losses_match "$BATS_FILE_TMPDIR/ref" "$BATS_TEST_TMPDIR/t$tp" 4
    done
}

@test "tensor parallel on 3 ranks matches with 3 and with 6 heads" {
    run03 3 "$BATS_TEST_TMPDIR/h3" --mp tensor --dmodel 48 --heads 3 --vocab 384
    assert_losses_match "$BATS_FILE_TMPDIR/ref_h3" "$BATS_TEST_TMPDIR/h3" 4
    run03 3 "$BATS_TEST_TMPDIR/h6" --mp tensor --dmodel 48 --heads 6 --vocab 384
    assert_losses_match "$BATS_FILE_TMPDIR/ref_h6" "$BATS_TEST_TMPDIR/h6" 4
}

@test "2 data-parallel replicas of a 2-rank layer split or tensor group match single-device losses" {
    run03 4 "$BATS_TEST_TMPDIR/dl" --mp layer --dp 2
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$BATS_TEST_TMPDIR/dl" 4
    assert_equal "$(csv_column "$BATS_TEST_TMPDIR/dl/run.csv" dp)" "2"
    run03 4 "$BATS_TEST_TMPDIR/dt" --mp tensor --dp 2 --tp 2
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$BATS_TEST_TMPDIR/dt" 4
    assert_equal "$(csv_column "$BATS_TEST_TMPDIR/dt/run.csv" tp)" "2"
}

@test "chapter 02's dp-modes and all-reduces sum the replicas of a layer split and of a tensor group" {
    # 03 = 02 + model parallelism: naive and flat, the library's all-reduce and the ring, all kept
    d="$BATS_TEST_TMPDIR"
    run03 4 "$d/ln" --mp layer --dp 2 --dp-mode naive --allreduce ring --check-replicas 1
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$d/ln" 4
    run03 4 "$d/tn" --mp tensor --dp 2 --dp-mode naive --check-replicas 2
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$d/tn" 4
    run03 4 "$d/tr" --mp tensor --dp 2 --allreduce ring
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$d/tr" 4
    csv_column "$d/tr/steps.csv" comm_busy_ms | awk '{ n++; if ($1 < 0) bad = 1 } END { exit bad || n != 4 }'
}

@test "a replica of a model-parallel part that differs aborts the job naming its rank" {
    run --separate-stderr bash -c "$(declare -f mpirun_np); COURSE_FAULT_REPLICA_RANK=3 mpirun_np 4 '$TRAIN03' $FLAGS --out '$BATS_TEST_TMPDIR/o' --dp 2 --check-replicas 1"
    assert_failure
    [[ "$stderr" == *"replica check at step 1: rank 3's parameters differ from rank 1's"* ]]
}

# Chapter 02's overlap on a part of the model: a bucket of the part's
# gradients is all-reduced as soon as the last micro-batch's backward has
# passed its units (a stage's as it goes; tensor slices' after it).
@test "--dp-mode overlap over replicas of a layer split and of tensor slices matches single-device losses, and flat's bit for bit" {
    local d="$BATS_TEST_TMPDIR"
    for mp in layer tensor; do
        run03 4 "$d/flat-$mp" --layers 4 --mp $mp --dp 2 --micro 2
        run03 4 "$d/overlap-$mp" --layers 4 --mp $mp --dp 2 --micro 2 --dp-mode overlap --bucket-mb 0.05
        assert_losses_match "$BATS_FILE_TMPDIR/ref_l4" "$d/overlap-$mp" 4
        assert_equal "$(cut -d, -f2,4 "$d/overlap-$mp/steps.csv")" "$(cut -d, -f2,4 "$d/flat-$mp/steps.csv")"
    done
}

@test "--recompute gives bit-identical losses in the layer split and in tensor parallel" {
    d="$BATS_TEST_TMPDIR"
    for mp in layer tensor; do
        run03 2 "$d/${mp}0" --layers 4 --mp $mp
        run03 2 "$d/${mp}1" --layers 4 --mp $mp --recompute
        run diff <(csv_column "$d/${mp}0/steps.csv" loss) <(csv_column "$d/${mp}1/steps.csv" loss)
        assert_success
    done
    # tensor parallel: 4 blocks' values become one set, so activations shrink
    act() { awk -F, '$1 == 0 && $2 == "device" && $3 == "activations" { print $4 }' "$1/memory.csv"; }
    [ "$(act "$d/tensor1")" -lt "$(act "$d/tensor0")" ]
}

@test "each stage of the layer split holds exactly its layers' parameters" {
    out="$BATS_TEST_TMPDIR/mem"
    run03 2 "$out" --layers 4 --split 3,1
    # tiny: V 256, T 64, C 64; a block has 12C^2 + 13C parameters
    V=256 T=64 C=64
    block=$((12 * C * C + 13 * C))
    assert_equal "$(params_bytes "$out" 0)" "$((4 * ((V + T) * C + 3 * block)))"
    assert_equal "$(params_bytes "$out" 1)" "$((4 * (block + 2 * C + V * C)))"
    # Adam's m and v: 8 bytes per parameter held
    assert_equal "$(awk -F, '$1 == 1 && $2 == "device" && $3 == "optimizer" { print $4 }' "$out/memory.csv")" \
        "$((8 * (block + 2 * C + V * C)))"
}

@test "tensor parallel ranks hold 1/tp of the block matrices and of the vocabulary's rows, and the replicated rest whole" {
    out="$BATS_TEST_TMPDIR/tmem"
    run03 4 "$out" --mp tensor
    V=256 T=64 C=64 L=2 tp=4
    sliced=$((12 * C * C + 7 * C))   # qkvw, qkvb, attprojw, fcw, fcb, fcprojw
    replicated=$((6 * C))            # ln1, ln2 (weight and bias), attprojb, fcprojb
    expected=$((4 * ((V / tp + T) * C + L * (sliced / tp + replicated) + 2 * C + V / tp * C))) # wte, lm_head
    for r in 0 1 2 3; do
        assert_equal "$(params_bytes "$out" $r)" "$expected"
    done
    assert_equal "$(csv_column "$out/run.csv" params)" "$(((V + T) * C + L * (sliced + replicated) + 2 * C + V * C))"
}

@test "comm_ms counts the messages, and busy.csv records every rank's busy time" {
    for mode in layer tensor; do
        out="$BATS_TEST_TMPDIR/busy-$mode"
        run03 2 "$out" --mp $mode
        csv_column "$out/steps.csv" comm_ms | awk '{ n++; if ($1 <= 0) bad = 1 } END { exit bad || n != 4 }'
        csv_column "$out/steps.csv" idle_fraction | awk '{ n++; if ($1 < 0 || $1 >= 1) bad = 1 } END { exit bad || n != 4 }'
        assert_equal "$(head -1 "$out/busy.csv")" "rank,step,busy_ms,step_ms"
        assert_equal "$(tail -n +2 "$out/busy.csv" | wc -l)" "8"   # 2 ranks x 4 steps
        awk -F, 'NR > 1 { if ($3 <= 0 || $3 > $4) bad = 1 } END { exit bad }' "$out/busy.csv"
    done
}

@test "the split model writes chapter 01's validation loss and text sample" {
    d="$BATS_TEST_TMPDIR" corpus="$BATS_FILE_TMPDIR/corpus.txt"
    "$TRAIN01" --device cpu --steps 2 --batch 4 --sample 24 --quiet --data "$corpus" --out "$d/ref" |
        grep '^sample:' >"$d/ref.txt"
    for mode in layer tensor; do
        OMP_NUM_THREADS=1 mpirun_np 2 "$TRAIN03" --device cpu --steps 2 --batch 4 --sample 24 --quiet \
            --data "$corpus" --mp $mode \
            --out "$d/$mode" | grep '^sample:' >"$d/$mode.txt"
        assert_equal "$(cat "$d/$mode.txt")" "$(cat "$d/ref.txt")"
        paste -d, <(csv_column "$d/ref/steps.csv" val_loss) <(csv_column "$d/$mode/steps.csv" val_loss) | tail -1 |
            awk -F, '{ r = ($1 - $2) / $1; if (r < 0) r = -r; ok = $1 > 0 && r < 1e-4 } END { exit !ok }'
    done
}

@test "heads not divisible by tp are refused" {
    run --separate-stderr bash -c "$(declare -f mpirun_np); mpirun_np 3 '$TRAIN03' $FLAGS --mp tensor"
    assert_failure
    [[ "$stderr" == *"--tp 3 does not divide --heads 4"* ]]
}

@test "a world that is not dp x model-parallel ranks is refused" {
    run --separate-stderr bash -c "$(declare -f mpirun_np); mpirun_np 3 '$TRAIN03' $FLAGS --mp tensor --tp 2"
    assert_failure
    [[ "$stderr" == *"--dp 1 x --tp 2 = 2 ranks, but the job has 3 (valid: mpirun -np 2)"* ]]
    run --separate-stderr bash -c "$(declare -f mpirun_np); mpirun_np 3 '$TRAIN03' $FLAGS --dp 2"
    assert_failure
    [[ "$stderr" == *"a job of 3 ranks cannot hold --dp 2 replicas"* ]]
}

@test "a bad --split is refused" {
    run --separate-stderr timeout 10 "$TRAIN03" $FLAGS --split 1,1
    assert_equal "$status" 2
    [[ "$stderr" == *"--split 1,1 names 2 stages but the job has 1"* ]]
    run --separate-stderr timeout 10 "$TRAIN03" $FLAGS --split 3
    assert_equal "$status" 2
    [[ "$stderr" == *"--split 3 holds 3 layers but the model has 2"* ]]
    run --separate-stderr timeout 10 "$TRAIN03" $FLAGS --split 0,2
    assert_equal "$status" 2
    [[ "$stderr" == *"--split: 0 is out of range"* ]]
    run --separate-stderr timeout 10 "$TRAIN03" $FLAGS --mp tensor --split 2
    assert_equal "$status" 2
    [[ "$stderr" == *"--split is for --mp layer"* ]]
}

@test "more stages than layers and --tp with the layer split are refused" {
    run --separate-stderr bash -c "$(declare -f mpirun_np); mpirun_np 3 '$TRAIN03' $FLAGS"
    assert_failure
    [[ "$stderr" == *"3 stages but the model has 2 layers"* ]]
    run --separate-stderr timeout 10 "$TRAIN03" $FLAGS --tp 1
    assert_equal "$status" 2
    [[ "$stderr" == *"--tp is for --mp tensor"* ]]
}
