#!/usr/bin/env bats
# The process grid (common/comm/grid.c): world = dp x pp x cp x tp, tp fastest,
# then cp, then pp, then dp.

load ../helpers

@test "the process grid gives every rank its coordinates and groups, for every layout of 1 to 8 ranks" {
    for np in 1 2 3 4 6 8; do
        run env OMP_NUM_THREADS=1 bash -c "$(declare -f mpirun_np); mpirun_np $np '$BUILD/tests/test_grid'"
        assert_success
        assert_output --partial "of $np ranks, 0 failures"
    done
}

@test "the grid's four axes lay 8 ranks out in 20 ways and 6 ranks in 16, cp > 1 and odd sizes among them" {
    run env OMP_NUM_THREADS=1 bash -c "$(declare -f mpirun_np); mpirun_np 8 '$BUILD/tests/test_grid'"
    assert_success
    assert_output --partial "grid: 20 layouts of 8 ranks, 0 failures"
    run env OMP_NUM_THREADS=1 bash -c "$(declare -f mpirun_np); mpirun_np 6 '$BUILD/tests/test_grid'"
    assert_success
    assert_output --partial "grid: 16 layouts of 6 ranks, 0 failures"
}

@test "a grid that does not fit the job is refused with one message that gives the valid range" {
    run env OMP_NUM_THREADS=1 bash -c "$(declare -f mpirun_np); mpirun_np 2 '$BUILD/tests/test_grid' --problem 2 2 1 1"
    assert_success
    assert_line "dp 2 x pp 2 x cp 1 x tp 1 = 4 ranks, but the job has 2 (valid: mpirun -np 4)"
    run env OMP_NUM_THREADS=1 bash -c "$(declare -f mpirun_np); mpirun_np 2 '$BUILD/tests/test_grid' --problem 2 1 0 1"
    assert_success
    assert_line "the grid's cp axis has 0 ranks (valid: every axis at least 1; dp 2, pp 1, cp 0, tp 1)"
    run env OMP_NUM_THREADS=1 bash -c "$(declare -f mpirun_np); mpirun_np 2 '$BUILD/tests/test_grid' --problem 1 1 2 1"
    assert_success
    assert_line "fits"
}
