#!/usr/bin/env bats
# title: the column-parallel linear layer
# points: 3
# Exercise 03.1 (03_model_parallel/tensor_parallel.c, column_parallel_forward
# and column_parallel_backward): each rank's output columns, the WHOLE input
# gradient (the all-reduce of f's conjugate), and each rank's weight and
# bias gradient rows, against the whole linear layer of the CPU backend, on
# random inputs with tp 2 and 3. Catches a missing all-reduce of the input
# gradient, gradients overwritten instead of added, and the wrong rows.
# Uses only the column-parallel layer: independent of exercise 03.2.

load ../helpers

@test "the column-parallel linear layer matches the whole layer on 2 and 3 ranks" {
    for np in 2 3; do
        run env OMP_NUM_THREADS=1 bash -c "$(declare -f mpirun_np); mpirun_np $np '$BUILD/tests/test_tensor_parallel' column"
        assert_success
        assert_output --partial "PASS: column-parallel linear on $np ranks, 0 failures"
    done
}
