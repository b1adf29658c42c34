#!/usr/bin/env bats
# kernels.bats: every CPU kernel against double-precision references.
# build/tests/test_kernels runs each kernel's float forward against a plain
# double forward, and its backward against central finite differences of that
# double forward (AdamW and sum_squares against their formulas). Inputs are
# fresh each run; a failure prints the seed, and
#   build/tests/test_kernels --seed S --verbose NAME
# repeats it with the error of every compared tensor.

load ../helpers

@test "embedding backward matches finite differences, repeated tokens included" {
    run "$BUILD/tests/test_kernels" embedding
    assert_success
    assert_output --partial "PASS embedding"
}

@test "layernorm backward matches finite differences for input, weight and bias" {
    run "$BUILD/tests/test_kernels" layernorm
    assert_success
    assert_output --partial "PASS layernorm"
}

@test "linear backward matches finite differences with and without bias" {
    run "$BUILD/tests/test_kernels" linear
    assert_success
    assert_output --partial "PASS linear"
}

@test "attention out and lse match double precision, backward matches finite differences, the future contributes nothing" {
    run "$BUILD/tests/test_kernels" attention
    assert_success
    assert_output --partial "PASS attention"
}

@test "gelu backward matches finite differences" {
    run "$BUILD/tests/test_kernels" gelu
    assert_success
    assert_output --partial "PASS gelu"
}

@test "residual backward matches finite differences" {
    run "$BUILD/tests/test_kernels" residual
    assert_success
    assert_output --partial "PASS residual"
}

@test "crossentropy backward matches finite differences" {
    run "$BUILD/tests/test_kernels" crossentropy
    assert_success
    assert_output --partial "PASS crossentropy"
}

@test "the vocabulary split: the cross-entropy from 3 slices of the logits is the whole softmax's, its gradient finite differences', the embedding's slices sum to the lookup" {
    run "$BUILD/tests/test_kernels" vocab_split
    assert_success
    assert_output --partial "PASS vocab_split"
}

@test "the mixture of experts: gather, combine and their backwards, and the routing's logit gradient (gates and balancing loss, with drops) match double-precision finite differences" {
    run "$BUILD/tests/test_kernels" moe
    assert_success
    assert_output --partial "PASS moe"
}

@test "the mixture of experts' balancing loss equals its double-precision sum, and its gradient finite differences, for E 3 to 7, K 1 to 3, with and without drops" {
    run "$BUILD/tests/test_kernels" moe_balance
    assert_success
    assert_output --partial "PASS moe_balance"
}

@test "adamw update matches its formula in double over three steps" {
    run "$BUILD/tests/test_kernels" adamw
    assert_success
    assert_output --partial "PASS adamw"
}

@test "sum_squares matches a double sum for sizes around its 64 chunks" {
    run "$BUILD/tests/test_kernels" sum_squares
    assert_success
    assert_output --partial "PASS sum_squares"
}

@test "fp32 to bf16 and fp16 rounds to nearest even, ties, subnormals, Inf, NaN and fp16 overflow included" {
    run "$BUILD/tests/test_kernels" casts
    assert_success
    assert_output --partial "PASS casts"
}

@test "16-bit gradients accumulate, sum their squares (Inf and NaN seen) and feed AdamW's fp32 master weights exactly as specified" {
    run "$BUILD/tests/test_kernels" mixed
    assert_success
    assert_output --partial "PASS mixed"
}

@test "matmuls with bf16 and fp16 inputs equal the fp32 ones on rounded inputs, bias gradients unrounded" {
    run "$BUILD/tests/test_kernels" linear_half
    assert_success
    assert_output --partial "PASS linear_half"
}

@test "the same seed reproduces the same check" {
    run "$BUILD/tests/test_kernels" --seed 12345 layernorm
    assert_success
    local first="$output"
    run "$BUILD/tests/test_kernels" --seed 12345 layernorm
    assert_success
    assert_equal "$output" "$first"
}

@test "an unknown kernel name is refused with exit status 2" {
    run "$BUILD/tests/test_kernels" no_such_kernel
    assert_failure 2
    assert_output --partial "unknown kernel 'no_such_kernel'"
    assert_output --partial "layernorm"
}
