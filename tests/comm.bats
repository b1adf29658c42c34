#!/usr/bin/env bats
# comm.bats: the bucketed collective (common/bucketed.c) and the element
# types of common/comm.h (build/tests/test_comm). The plain collectives and
# the ring are checked in data_parallel.bats.

load helpers

# build/tests/test_comm CHECK passes on 2 and on 3 ranks.
passes_on_2_and_3_ranks() {
    for np in 2 3; do
        run env OMP_NUM_THREADS=1 bash -c "$(declare -f mpirun_np); mpirun_np $np '$BUILD/tests/test_comm' $1"
        assert_success
        assert_output --partial "PASS: $np ranks, 0 failures"
    done
}

@test "bucketed all-reduce, reduce-scatter and all-gather equal the plain collectives on 2 and 3 ranks, padding included" {
    passes_on_2_and_3_ranks bucketed
}

@test "bf16 and fp16 collectives sum, average, gather and scatter on 2 and 3 ranks, counting 2 bytes an element" {
    passes_on_2_and_3_ranks 16bit
}
