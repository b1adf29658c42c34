#!/usr/bin/env bats
# title: layernorm backward
# points: 3
# twins: common/kernels/kernels_cuda.cu layernorm_backward layernorm_backward_dinp_kernel
# Exercise 01.1 (common/kernels/kernels_cpu.c, layernorm_backward): graded against
# central finite differences of a double-precision layernorm, on fresh
# random inputs of odd sizes. Catches a missing mean term, a wrong rstd
# power, overwriting instead of adding, and forgetting dweight or dbias.

load ../helpers

@test "layernorm backward matches finite differences (3 fresh random inputs)" {
    for i in 1 2 3; do
        run "$BUILD/tests/test_kernels" layernorm
        assert_success
        assert_output --partial "PASS layernorm"
    done
}
