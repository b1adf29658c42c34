#!/usr/bin/env bats
# The layer units of the parameter table (common/model/param_table.h): storage bound
# per unit, the padded shard layout of ZeRO, and forward and backward over a
# range of units with hooks (common/model/model.h).

load ../helpers

@test "every unit is one contiguous run of the table and each tensor is found by unit and kind" {
    run "$BUILD/tests/test_units" table
    assert_success
    assert_output --partial "PASS"
}

@test "views into storage bound per unit or per range of units address the whole model's values" {
    run "$BUILD/tests/test_units" views
    assert_success
    assert_output --partial "PASS"
}

@test "each unit pads to a multiple of N ranks with fewer than N elements of padding" {
    run "$BUILD/tests/test_units" padding
    assert_success
    assert_output --partial "tiny, N 3: slices of 6827, 16662 and 5504 elements"
    assert_output --partial "PASS"
}

@test "the shards of 1, 2, 3 and 4 ranks reassemble to the whole model's initial values bit for bit" {
    run "$BUILD/tests/test_units" shards
    assert_success
    assert_output --partial "layers 3, N 4: the 4 shards reassemble to the whole model's initial values bit for bit"
    assert_output --partial "PASS"
}

@test "forward and backward over two ranges of units equal the whole model's and call the hooks in order" {
    run "$BUILD/tests/test_units" ranges
    assert_success
    assert_output --partial "hooks in order: f-1 F-1 f0 F0 f1 F1 f2 F2 f3 F3 f4 F4 b4 B4 b3 B3 b2 B2 b1 B1 b0 B0 b-1 B-1"
    assert_output --partial "PASS"
}

@test "the gradient norm from ZeRO shards, ZeRO-1 slices and tensor slices with replicated tensors equals the whole gradient's" {
    run "$BUILD/tests/test_units" norm
    assert_success
    assert_output --partial "layers 3, N 4: ZeRO-2/3 shards with padding"
    assert_output --partial "an overflow skips the step and halves the scale"
    assert_output --partial "PASS"
}

@test "a layer split with V chunks per stage covers every block once, in order round the stages, and V = 1 is the old split" {
    run "$BUILD/tests/test_units" split
    assert_success
    assert_output --partial "layers 5, 4 stages, one chunk each: the split recorded before chunks existed"
    assert_output --partial "splits of 1 to 12 layers into S stages of V chunks"
    assert_output --partial "PASS"
}

@test "the backward split into B and W (B0 B1 W0 B2 W1 W2) gives the ordinary backward's gradients bit for bit" {
    run "$BUILD/tests/test_units" bw
    assert_success
    assert_output --partial "layers 3, units 1..2: B0 B1 W0 B2 W1 W2 gives the ordinary backward's gradients and input gradients bit for bit"
    assert_output --partial "layers 3, units -1..3: without W1 the gradients differ"
    assert_output --partial "PASS"
}

@test "a token shard written by shard_write is read back by --data's loader token for token" {
    run "$BUILD/tests/test_units" shard
    assert_success
    assert_output --partial "shard: 5000 tokens written by shard_write, read back by data_load equal"
    assert_output --partial "PASS"
}
