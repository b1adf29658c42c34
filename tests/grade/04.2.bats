#!/usr/bin/env bats
# title: the 1F1B schedule
# points: 4
# Exercise 04.2 (04_pipeline/schedule.c, build_1f1b): graded by executing
# the schedule: (1) simulated with blocking messages for P = 1..6 and
# M = 1..10, it must never deadlock, run every micro-batch's forward and
# backward once, hold at most min(P - s, M) micro-batches on stage s and
# idle exactly (P-1)/(M+P-1); (2) run by the real pipeline trainer for
# P = 2, M = 4 and P = 3, M = 5, its losses must equal chapter 01's.
# (The trainer reports the bubble with exercise 04.1: do that one first.)
# The simulator checks every schedule but zb-h1, which is exercise 04.3.

load ../helpers

@test "the 1F1B schedule never deadlocks and keeps within its in-flight bound" {
    run "$BUILD/tests/test_schedule" --except zb-h1
    assert_success
    assert_output --partial "PASS: 0 failures"
}

@test "the 1F1B schedule, executed by the trainer, gives chapter 01's losses" {
    d="$BATS_TEST_TMPDIR"
    for case in "2 4 8" "3 5 10"; do
        set -- $case
        "$REPO/01_single_gpu/train" --device cpu --layers 4 --steps 3 --batch $3 --sample 0 --quiet \
            --out "$d/ref$1" >/dev/null
        OMP_NUM_THREADS=1 mpirun_np $1 "$REPO/04_pipeline/train" --device cpu --layers 4 --steps 3 --batch $3 \
            --micro $2 --schedule 1f1b --sample 0 --quiet --out "$d/p$1" >/dev/null
        paste -d, <(csv_column "$d/ref$1/steps.csv" loss) <(csv_column "$d/p$1/steps.csv" loss) |
            awk -F, '{ n++; r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > 1e-4) bad = 1 } END { exit bad || n != 3 }'
    done
}
