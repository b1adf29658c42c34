#!/usr/bin/env bats
# title: a layout planned by hand
# points: 3
# Exercise 06.3 (common/tools/plan_by_hand.c): the memory, bytes sent and
# step time of `mpirun -np 2 05_zero/train --model tiny --zero 1 --precision
# bf16`, from the course's formulas, graded by the planner's own arithmetic
# (`common/plan --by-hand`: bytes to the byte, the step to a millionth of
# it); then of layouts and machine files drawn at grading time, which the
# learner has not seen, so numbers copied from `common/plan --time-csv`
# fail. The planner's numbers for such a layout are the run's memory.csv and
# bytes_sent_per_step (tests/tools/plan.bats holds them to each other), so the
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

# draw SEED K DIR: layout K of SEED as plan's flags, on stdout (N = 2, 4 or 8
# ranks; widths that are multiples of 8, so no shard is padded), and its
# machine, DIR/drawn-K.machine, with every rate drawn over decades.
draw() {
    awk -v seed="$1" -v k="$2" -v dir="$3" 'function pick(lo, hi) { return lo + int(rand() * (hi - lo + 1)) }
    function rate(lo, decades) { return sprintf("%.4g", 10 ^ (lo + decades * rand())) }
    BEGIN {
        srand(seed * 100 + k)
        heads = 2 ^ pick(0, 3); ranks = 2 ^ pick(1, 3)
        printf "--vocab %d --seq %d --heads %d --dmodel %d --layers %d --dp %d --batch %d\n", pick(256, 1024),
            8 * pick(1, 12), heads, 8 * heads * pick(1, 6), pick(1, 4), ranks, ranks * pick(1, 4)
        m = dir "/drawn-" k ".machine"
        print "name = drawn-" k >m
        print "flops = " rate(9, 4) >m
        print "alpha_s = " rate(-7, 3) >m
        print "beta_bytes_per_s = " rate(8, 3) >m
        print "h2d_bytes_per_s = " rate(9, 2) >m
        print "d2h_bytes_per_s = " rate(9, 2) >m
        print "cpu_adam_params_per_s = " rate(8, 2) >m
        print "device_adam_params_per_s = " rate(8, 3) >m
        print "device_mem_bytes = " pick(1, 100) "000000000" >m
        print "overlap = " sprintf("%.2f", rand()) >m
    }'
}

@test "the numbers planned by hand are the planner's on layouts and machines drawn now" {
    seed=${GRADE_SEED:-$((RANDOM * 32768 + RANDOM))}
    echo "seed $seed (rerun with GRADE_SEED=$seed bats tests/grade/06.3.bats)"
    for k in 1 2 3 4 5; do
        flags=$(draw "$seed" "$k" "$BATS_TEST_TMPDIR")
        run env OMP_NUM_THREADS=1 "$REPO/common/plan" --by-hand --machine "$BATS_TEST_TMPDIR/drawn-$k.machine" $flags
        assert_success
        assert_output --partial "all agree"
    done
}
