#!/usr/bin/env bats
# title: the vocabulary-parallel cross-entropy
# points: 3
# twins: common/kernels/kernels_cuda.cu crossentropy_slice_sums crossentropy_slice_finish crossentropy_backward_rows crossentropy_slice_sums_kernel crossentropy_slice_finish_kernel crossentropy_backward_rows_kernel
# Exercise 03.4 (common/kernels/kernels_cpu.c, crossentropy_slice_sums,
# crossentropy_slice_finish, crossentropy_backward_rows): the loss of a row
# of logits split over ranks by vocabulary columns, from each rank's slice
# and the ranks' maxima and sums, checked by tests/test_kernels.c's
# vocab_split: 3 slices (the last with padding columns) against the whole
# softmax in double, the gradient against finite differences. Catches the
# target's logit not shifted by the maximum, a slice's own maximum used
# instead of the row's, padding columns given probability, and the one-hot
# of the backward at the global column instead of the slice's.

load ../helpers

@test "the cross-entropy from 3 slices of the logits is the whole softmax's, its gradient finite differences'" {
    run "$BUILD/tests/test_kernels" vocab_split
    assert_success
    assert_output --partial "PASS vocab_split"
}
