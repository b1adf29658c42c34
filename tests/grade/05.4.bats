#!/usr/bin/env bats
# title: the loss-scale update rule
# points: 2
# Exercise 05.4 (common/model/mixed.c, loss_scaler_update): fp16's dynamic loss
# scale, step by step against sequences of clean and overflowing steps
# worked by hand (tests/test_kernels.c, loss_scale): the skip, the halving,
# the doubling after `window` clean steps in a row, a fixed scale that never
# moves. Catches a count of clean steps that an overflow does not restart,
# a doubling one step late (or early), a fixed scale that halves, and a
# skipped step that is not reported.

load ../helpers

@test "the loss scale halves at an overflow, skips it, and doubles after a window of clean steps" {
    run "$BUILD/tests/test_kernels" loss_scale
    assert_success
    assert_output --partial "PASS loss_scale"
}
