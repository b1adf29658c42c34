#!/usr/bin/env bats
# title: activation memory arithmetic
# points: 2
# Exercise 01.3 (common/model/model.c, activation_bytes): the bytes the forward
# pass keeps, compared with an independent tensor-by-tensor count for
# several shapes. Catches a forgotten attention lse (B*NH*T, one per head
# and query), a leftover attention matrix (B*NH*T*T, no longer saved),
# missing layernorm statistics, or the logits and probabilities counted once.

load ../helpers

@test "activation_bytes counts every saved tensor for nine shapes (pieces of the head and a split vocabulary among them)" {
    run "$BUILD/tests/test_memory"
    assert_success
    refute_output --partial "FAIL"
}
