#!/usr/bin/env bats
# The GPT model as a whole: gradients and initialisation.

load helpers

@test "whole-model gradients on the tiny preset match finite differences for every tensor" {
    run "$BUILD/tests/test_model_grad"
    assert_success
    assert_output --partial "0 of 29 tensors failed"
}

@test "with activation recomputation the whole-model gradients are bit-identical" {
    run "$BUILD/tests/test_model_grad"
    assert_success
    assert_output --partial "recompute: gradients bit-identical"
}
