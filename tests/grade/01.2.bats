#!/usr/bin/env bats
# title: the AdamW update
# points: 3
# Exercise 01.2 (common/kernels/kernels_cpu.c, adamw_update): graded against a
# double-precision AdamW over several steps. Catches missing bias
# correction, L2 regularisation in place of decoupled weight decay, a
# forgotten grad_scale (clipping), and eps inside the square root.

load ../helpers

@test "the AdamW update matches the formula over several steps" {
    run "$BUILD/tests/test_kernels" adamw
    assert_success
    assert_output --partial "PASS adamw"
}
