#!/usr/bin/env bats
# title: the row-parallel linear layer
# points: 3
# Exercise 03.2 (03_model_parallel/tensor_parallel.c, row_parallel_forward
# and row_parallel_backward): the WHOLE output (partial sums all-reduced:
# Megatron's g) with the bias counted once, each rank's input and weight
# gradient columns, and the whole bias gradient, against the whole linear
# layer of the CPU backend, on random inputs with tp 2 and 3. Catches a
# missing all-reduce, a bias added by every rank, and gradients overwritten
# instead of added. Uses only the row-parallel layer: independent of 03.1.

load ../helpers

@test "the row-parallel linear layer matches the whole layer on 2 and 3 ranks" {
    for np in 2 3; do
        run env OMP_NUM_THREADS=1 bash -c "$(declare -f mpirun_np); mpirun_np $np '$BUILD/tests/test_tensor_parallel' row"
        assert_success
        assert_output --partial "PASS: row-parallel linear on $np ranks, 0 failures"
    done
}
