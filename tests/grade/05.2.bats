#!/usr/bin/env bats
# title: the stage-2 reduce-scatter
# points: 3
# Exercise 05.2 (05_zero/zero.c, reduce_scatter_unit): after backward leaves
# a unit, reduce-scatter its padded gradient so that each rank keeps the sum
# of its own slice, at that unit's place in its gradient shard, and adds to
# it on the step's later micro-batches. Graded by the losses of --zero 2 on
# 2 and 3 ranks, with units that do not divide by the ranks, with 1 and 2
# micro-batches, against chapter 01; and by the bytes sent per step, which
# must be an all-reduce's 2(N-1)/N x 4P. Catches a slice written at the
# wrong offset of the shard (or every unit's at offset 0), another rank's
# slice, micro-batches that overwrite instead of adding, and an all-reduce
# of the whole unit in place of the reduce-scatter (1.5 times the bytes).
# Stage 2 updates with 01.2's AdamW and lays out shards with 05.1.

load ../helpers

# A global batch of 12, 4 steps; units of 259*48 + 64*48, 12*48^2 + 13*48
# and 2*48 + 259*48 elements: none divides by 3, the first and last not by 2.
FLAGS="--device cpu --steps 4 --batch 12 --sample 0 --quiet --eval-batches 1 --dmodel 48 --heads 4 --vocab 259"

@test "stage 2 gives chapter 01's losses on 2 and 3 ranks, with 1 and 2 micro-batches" {
    d="$BATS_TEST_TMPDIR"
    for micro in 1 2; do
        "$TRAIN01" $FLAGS --micro $micro --out "$d/ref$micro" >/dev/null
        for np in 2 3; do
            # a failure's output ends with the configuration it checked
            config="--zero 2 on $np ranks with --micro $micro"
            OMP_NUM_THREADS=1 mpirun_np $np "$REPO/05_zero/train" $FLAGS --micro $micro --zero 2 \
                --out "$d/z$np-$micro" >"$d/z$np-$micro.log" 2>&1 ||
                { cat "$d/z$np-$micro.log"; fail "$config: the run failed (its output is above)"; }
            echo "checking $config: chapter 01's losses, then yours, must agree at every step"
            assert_losses_match "$d/ref$micro" "$d/z$np-$micro" 4
        done
    done
}

@test "stage 2 sends an all-reduce's bytes per step: a reduce-scatter, not an all-reduce, of each unit" {
    for np in 2 3; do
        out="$BATS_TEST_TMPDIR/b$np"
        OMP_NUM_THREADS=1 mpirun_np $np "$REPO/05_zero/train" $FLAGS --steps 2 --zero 2 --out "$out" >/dev/null
        P=$(csv_column "$out/run.csv" params)
        sent=$(csv_column "$out/run.csv" bytes_sent_per_step)
        awk -v b="$sent" -v P="$P" -v N="$np" 'BEGIN {
            f = 2 * (N - 1) / N * 4 * P; d = (b - f) / f; if (d < 0) d = -d
            if (d > 0.05) { print "--zero 2 on " N " ranks with --micro 1: " b " bytes sent per step, expected about " f; exit 1 } }'
    done
}
