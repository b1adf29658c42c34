#!/usr/bin/env bats
# title: the balancing loss and its gradient
# points: 3
# Exercise 01.4 (common/model/moe.c, moe_route and moe_route_backward): the
# Switch/GShard balancing loss of a mixture of experts, per sequence, and its
# gradient in the router's probabilities. Graded against the loss computed in
# double from the logits and the choices, and against central differences of
# it in double, for odd E, K = 1 to 3 and capacity factors that drop tokens.
# Catches a share of T tokens in place of T*K choices, the rows kept in place
# of the choices made, one loss over the whole batch in place of the
# sequences', a forgotten coefficient or scale (dloss), and `+=` onto dp
# before it is set.

load ../helpers

@test "the balancing loss and its gradient match double precision for several routings" {
    run "$BUILD/tests/test_kernels" moe_balance
    assert_success
    assert_output --partial "PASS moe_balance"
}
