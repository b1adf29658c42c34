#!/usr/bin/env bats
# The GPT model as a whole: gradients and initialisation.

load ../helpers

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

@test "at a padded vocabulary the loss is the unpadded cross-entropy and the padded rows get no gradient" {
    run "$BUILD/tests/test_model_grad" --vocab 300
    assert_success
    assert_line --regexp "^PASS vocab 300 padded to 384: .*padded rows' gradient 0$"
    assert_output --partial "0 of 29 tensors failed"
}

@test "tied embeddings: the head reads wte, and wte's gradient from both uses matches finite differences" {
    run "$BUILD/tests/test_model_grad" --vocab 300 --tie-embeddings
    assert_success
    assert_line "PASS the head reads wte (tied)"
    assert_line --regexp "^PASS wte "
    assert_output --partial "0 of 28 tensors failed"
}
