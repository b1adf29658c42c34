#!/usr/bin/env bats
# title: the ZB-H1 action list
# points: 3
# Exercise 04.3 (04_pipeline/schedule.c, build_zb_h1): graded by executing
# the schedule: (1) simulated for P = 1..6 stages, M = 1..12 micro-batches
# and four (tf, tb, tw) with tw <= tb, it must never deadlock, run every
# micro-batch's F, B and W once in dependency order (W after its B, B after
# its gradient arrives, sends after what they send is made), hold no more
# than 1F1B's peak, min(P, M), on any stage, and idle exactly
# (P-1)(tf+tb-tw) / (M(tf+tb+tw) + (P-1)(tf+tb-tw)) when M >= P (and no more
# than 1F1B's (P-1)/(M+P-1) when M < P); (2) run by the real pipeline trainer
# for P = 2, M = 4 and P = 3, M = 5, its losses must equal those of 1F1B.
# Catches a W missing, a W before its B, blocking sends where posted ones
# are needed, and W's not deferred (whose bubble is 1F1B's). The list keeps
# 1F1B's order of forwards and backwards (build_1f1b): do 04.2 first.

load ../helpers

@test "the ZB-H1 list never deadlocks, runs F, B and W once in order, and idles as its formula says" {
    run "$BUILD/tests/test_schedule" --only zb-h1
    assert_success
    assert_output --partial "PASS: 0 failures"
}

@test "the ZB-H1 list, executed by the trainer, gives 1F1B's losses" {
    d="$BATS_TEST_TMPDIR"
    for case in "2 4 8" "3 5 10"; do
        set -- $case
        for schedule in 1f1b zb-h1; do
            OMP_NUM_THREADS=1 mpirun_np $1 "$REPO/04_pipeline/train" --device cpu --layers 4 --steps 3 \
                --batch $3 --micro $2 --schedule $schedule --sample 0 --quiet --out "$d/$schedule$1" >/dev/null
        done
        assert_losses_match "$d/1f1b$1" "$d/zb-h1$1" 3
    done
}
