#!/usr/bin/env bats
# comm.bats: the bucketed collective (common/bucketed.c) and the element
# types of common/comm.h (build/tests/test_comm). The plain collectives and
# the ring are checked in data_parallel.bats.

load helpers

@test "bucketed all-reduce, reduce-scatter and all-gather equal the plain collectives on 2 and 3 ranks, padding included" {
    for np in 2 3; do
        run env OMP_NUM_THREADS=1 bash -c "$(declare -f mpirun_np); mpirun_np $np '$BUILD/tests/test_comm' bucketed"
        assert_success
        assert_output --partial "PASS: $np ranks, 0 failures"
    done
}

@test "a bf16 collective is refused, naming mixed precision, on every rank" {
    run --separate-stderr env OMP_NUM_THREADS=1 timeout 60 \
        bash -c "$(declare -f mpirun_np); mpirun_np 2 '$BUILD/tests/test_comm' bf16"
    assert_failure
    [ "$status" -ne 124 ]
    [[ "$stderr" == *"comm_allreduce: bf16 buffers are not supported yet: 16-bit communication arrives with mixed precision"* ]]
}
