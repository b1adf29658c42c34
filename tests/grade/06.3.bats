#!/usr/bin/env bats
# title: a layout planned by hand
# points: 3
# Exercise 06.3 (common/tools/plan_by_hand.c): the memory, bytes sent and
# step time of `mpirun -np 2 05_zero/train --model tiny --zero 1 --precision
# bf16`, from the course's formulas, graded by the planner's own arithmetic
# (`common/plan --by-hand`: bytes to the byte, the step to a millionth of
# it). The planner's numbers for such a layout are the run's memory.csv and
# bytes_sent_per_step (tests/plan.bats holds them to each other), so the
# grader does not run it; the learner does (course.md). Catches the 16-bit
# parameters counted as fp32, the optimizer state not sharded (12P instead
# of 12P/N), the master weights forgotten (8 bytes instead of 12), an
# all-reduce's 2(N-1)/N in place of the reduce-scatter and all-gather, and
# the latency counted once per step instead of once per unit and collective.

load ../helpers

@test "the numbers planned by hand are the planner's" {
    run env OMP_NUM_THREADS=1 "$REPO/common/plan" --by-hand --machine "$REPO/common/machines/cpu-amd-epyc-2cores.machine"
    assert_success
    assert_output --partial "all agree"
}
