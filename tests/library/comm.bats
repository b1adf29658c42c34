#!/usr/bin/env bats
# comm.bats: the bucketed collective (02_data_parallel/bucketed.c), the element
# types of common/comm/comm.h and the all-to-all (comm.h's and
# 03_model_parallel/alltoall.c's) (build/tests/test_comm). The plain collectives and
# the ring are checked in data_parallel.bats.

load ../helpers

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

@test "the all-to-all, the library's and chapter 03's pairwise one, delivers every block to its rank on 2 and 3 ranks, in fp32, bf16 and fp16, counting (size - 1) blocks sent" {
    passes_on_2_and_3_ranks alltoall
}

# comm.h, "Cores": without OMP_NUM_THREADS a rank gets cores / ranks on the
# machine OpenMP threads (at least one), not every core it may run on; MPI
# yields the core while it waits unless the user said otherwise.
@test "without OMP_NUM_THREADS each of 4 ranks gets cores / 4 OpenMP threads, and MPI yields while it waits" {
    cores=$(getconf _NPROCESSORS_ONLN)
    want=$(( cores / 4 > 0 ? cores / 4 : 1 ))
    run env -u OMP_NUM_THREADS -u OMPI_MCA_mpi_yield_when_idle \
        bash -c "$(declare -f mpirun_np); mpirun_np 4 '$BUILD/tests/test_comm' threads"
    assert_success
    assert_equal "$(grep -c "OpenMP threads, mpi_yield_when_idle 1$" <<<"$output")" 4
    # between 1 and cores / 4 each (fewer where mpirun bound a rank to fewer cores)
    awk -v want="$want" '/OpenMP threads/ { n++; if ($3 < 1 || $3 > want) bad = 1 } END { exit bad || n != 4 }' <<<"$output"
    run env OMP_NUM_THREADS=3 OMPI_MCA_mpi_yield_when_idle=0 \
        bash -c "$(declare -f mpirun_np); mpirun_np 2 '$BUILD/tests/test_comm' threads"
    assert_equal "$(grep -c ": 3 OpenMP threads, mpi_yield_when_idle 0$" <<<"$output")" 2
}
