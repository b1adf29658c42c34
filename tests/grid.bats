#!/usr/bin/env bats
# The process grid (common/comm/grid.c): world = dp x pp x tp, tp fastest.

load helpers

@test "the process grid gives every rank its coordinates and groups, for every layout of 1 to 8 ranks" {
    for np in 1 2 3 4 6 8; do
        run env OMP_NUM_THREADS=1 bash -c "$(declare -f mpirun_np); mpirun_np $np '$BUILD/tests/test_grid'"
        assert_success
        assert_output --partial "of $np ranks, 0 failures"
    done
}
