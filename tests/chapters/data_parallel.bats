#!/usr/bin/env bats
# 02_data_parallel: N replicas give chapter 01's losses; the collectives and
# the ring all-reduce are right for any world size; bad input is refused.

load ../helpers

COMMBENCH="$REPO/02_data_parallel/commbench"

# Tiny model, 5 steps, a global batch of 12 (divisible by 1, 2, 3, 4 ranks); a
# private copy of the corpus, so that editing course.md meanwhile changes nothing.
FLAGS="--device cpu --steps 5 --batch 12 --sample 0 --quiet --data $BATS_FILE_TMPDIR/corpus.txt"

setup_file() {
    cp "$REPO/course.md" "$BATS_FILE_TMPDIR/corpus.txt"
    "$REPO/01_single_gpu/train" $FLAGS --out "$BATS_FILE_TMPDIR/ref" >/dev/null
    "$REPO/01_single_gpu/train" $FLAGS --micro 2 --out "$BATS_FILE_TMPDIR/ref_micro" >/dev/null
}

# All dp-modes and both all-reduces on `np` ranks.
check_world() {
    local np="$1"
    for mode in naive flat overlap; do
        for ar in library ring; do
            out="$BATS_TEST_TMPDIR/$np-$mode-$ar"
            OMP_NUM_THREADS=1 mpirun_np "$np" "$TRAIN02" $FLAGS --dp-mode "$mode" --allreduce "$ar" \
                --bucket-mb 0.05 --out "$out" >/dev/null
            assert_losses_match "$BATS_FILE_TMPDIR/ref" "$out" 5
        done
    done
}

@test "data parallel on 1 rank matches single-device losses for every dp-mode and all-reduce" { check_world 1; }
@test "data parallel on 2 ranks matches single-device losses for every dp-mode and all-reduce" { check_world 2; }
@test "data parallel on 3 ranks matches single-device losses for every dp-mode and all-reduce" { check_world 3; }
@test "data parallel on 4 ranks matches single-device losses for every dp-mode and all-reduce" { check_world 4; }

@test "data parallel runs without mpirun as a world of one" {
    run "$TRAIN02" $FLAGS --out "$BATS_TEST_TMPDIR/solo"
    assert_success
    assert_losses_match "$BATS_FILE_TMPDIR/ref" "$BATS_TEST_TMPDIR/solo" 5
}

@test "gradient accumulation on 3 ranks x 2 micro-batches matches the single device" {
    OMP_NUM_THREADS=1 mpirun_np 3 "$TRAIN02" $FLAGS --micro 2 --dp-mode overlap --bucket-mb 0.1 \
        --out "$BATS_TEST_TMPDIR/acc" >/dev/null
    assert_losses_match "$BATS_FILE_TMPDIR/ref_micro" "$BATS_TEST_TMPDIR/acc" 5
}

@test "--recompute on 2 ranks gives bit-identical losses, flat and overlapped" {
    for mode in flat overlap; do
        for r in 0 1; do
            OMP_NUM_THREADS=1 mpirun_np 2 "$TRAIN02" $FLAGS --dp-mode $mode --bucket-mb 0.05 --recompute=$r \
                --out "$BATS_TEST_TMPDIR/$mode$r" >/dev/null
        done
        run diff <(csv_column "$BATS_TEST_TMPDIR/${mode}0/steps.csv" loss) \
                 <(csv_column "$BATS_TEST_TMPDIR/${mode}1/steps.csv" loss)
        assert_success
        assert_losses_match "$BATS_FILE_TMPDIR/ref" "$BATS_TEST_TMPDIR/${mode}1" 5
    done
}

@test "replicas stay identical, checked every step" {
    run env OMP_NUM_THREADS=1 bash -c "$(declare -f mpirun_np); mpirun_np 3 '$TRAIN02' $FLAGS --check-replicas 1 \
        --dp-mode overlap --allreduce ring --out '$BATS_TEST_TMPDIR/rep'"
    assert_success
}

@test "a replica that differs aborts the whole job with a message naming the rank" {
    run --separate-stderr env COURSE_FAULT_REPLICA_RANK=2 OMP_NUM_THREADS=1 timeout 60 \
        bash -c "$(declare -f mpirun_np); mpirun_np 3 '$TRAIN02' $FLAGS --check-replicas 2 --out '$BATS_TEST_TMPDIR/bad'"
    assert_failure
    [ "$status" -ne 124 ]   # aborted, not hung until the timeout
    [[ "$stderr" == *"replica check at step 2: rank 2's parameters differ from rank 0's"* ]]
}

@test "steps.csv adds comm_busy_ms; run.csv and memory.csv describe every rank" {
    out="$BATS_TEST_TMPDIR/csv"
    OMP_NUM_THREADS=1 mpirun_np 4 "$TRAIN02" $FLAGS --out "$out" >/dev/null
    assert_equal "$(head -1 "$out/steps.csv")" \
        "step,loss,lr,grad_norm,step_ms,fwd_ms,bwd_ms,comm_ms,opt_ms,tokens_per_s,val_loss,comm_busy_ms"
    assert_equal "$(csv_column "$out/run.csv" world_size)" "4"
    assert_equal "$(csv_column "$out/run.csv" dp)" "4"
    # 4 ranks x 2 spaces x 8 categories, each rank holding 16 bytes per parameter
    assert_equal "$(tail -n +2 "$out/memory.csv" | wc -l)" "64"
    P=$(csv_column "$out/run.csv" params)
    for r in 0 1 2 3; do
        assert_equal "$(awk -F, -v r=$r '$1 == r && $2 == "device" && $3 == "optimizer" { print $4 }' "$out/memory.csv")" \
            "$((8 * P))"
    done
    # flat: the step waits for every millisecond the communication runs
    paste -d, <(csv_column "$out/steps.csv" comm_ms) <(csv_column "$out/steps.csv" comm_busy_ms) |
        awk -F, '{ n++; if ($1 != $2) bad = 1 } END { exit bad || !n }'
}

@test "the collectives and the ring all-reduce are exact for 1 to 5 ranks and awkward counts" {
    for np in 1 2 3 4 5; do
        run env OMP_NUM_THREADS=1 bash -c "$(declare -f mpirun_np); mpirun_np $np '$BUILD/tests/test_comm'"
        assert_success
        assert_output --partial "PASS: $np ranks, 0 failures"
    done
}

@test "commbench reports size, count, time, algbw and busbw for every operation" {
    out="$BATS_TEST_TMPDIR/bench.csv"
    run env OMP_NUM_THREADS=1 bash -c "$(declare -f mpirun_np); mpirun_np 3 '$COMMBENCH' --device cpu \
        --min-bytes 4K --max-bytes 64K --out '$out'"
    assert_success
    assert_equal "$(head -1 "$out")" "op,ranks,transport,size_bytes,count,time_us,algbw_GBps,busbw_GBps"
    for op in allreduce ring_allreduce reduce_scatter allgather alltoall; do
        [ "$(grep -c "^$op,3," "$out")" -eq 3 ]   # 4K, 16K, 64K
    done
    # busbw = algbw * 2(n-1)/n for an all-reduce, (n-1)/n for the others
    awk -F, 'NR > 1 { f = ($1 ~ /allreduce/) ? 4 / 3 : 2 / 3; r = $8 / ($7 * f);
                      if (r < 0.99 || r > 1.01) bad = 1 } END { exit bad }' "$out"
}

@test "a global batch not divisible by ranks x micro-batches is refused" {
    run --separate-stderr bash -c "$(declare -f mpirun_np); mpirun_np 2 '$TRAIN02' $FLAGS --batch 12 --micro 4"
    assert_failure
    [[ "$stderr" == *"--batch 12 is not divisible by 2 ranks x --micro 4 (valid: a multiple of 8)"* ]]
}

@test "more ranks than sequences are refused" {
    run --separate-stderr bash -c "$(declare -f mpirun_np); mpirun_np 3 '$TRAIN02' $FLAGS --batch 2"
    assert_failure
    [[ "$stderr" == *"3 ranks but a global batch of 2 sequences"* ]]
}

@test "an unknown dp-mode is refused" {
    run --separate-stderr timeout 5 "$TRAIN02" $FLAGS --dp-mode fast
    assert_equal "$status" 2
    [[ "$stderr" == *"--dp-mode: unknown mode 'fast' (valid: naive, flat, overlap)"* ]]
}

@test "--comm nccl on the CPU is refused" {
    run --separate-stderr timeout 5 "$TRAIN02" $FLAGS --comm nccl
    assert_equal "$status" 2
    [[ "$stderr" == *"--comm nccl needs --device cuda"* ]]
}
