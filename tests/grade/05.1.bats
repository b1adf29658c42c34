#!/usr/bin/env bats
# title: the shard bookkeeping
# points: 3
# Exercise 05.1 (common/model/param_table.c, shard_slice_numel, shard_unit_offset
# and slice_elements): a unit's slice size S = ceil(n / N), where each
# unit's slices start in a rank's shard, and which of the table's elements a
# rank's slice holds. Graded for N = 1..4 on two shapes whose units rarely
# divide by N (padding of fewer than N elements, slices one after another,
# the tiny preset on 3 ranks worked by hand), on units smaller than the
# number of ranks (the last ranks hold only padding), and by cutting the
# model into shards and putting it back together bit for bit. Catches
# S = n / N rounded down, padding by N when n divides evenly, offsets that
# count the unit itself or whole units instead of slices, and a last slice
# that runs past its unit's end.

load ../helpers

@test "units pad to a multiple of N by fewer than N, and each rank's slices hold the unit's elements in order" {
    run "$BUILD/tests/test_units" padding
    assert_success
    assert_output --partial "PASS"
}

@test "the shards of 1 to 4 ranks reassemble to the whole model, each unit's slices in rank order" {
    run "$BUILD/tests/test_units" shards
    assert_success
    assert_output --partial "PASS"
}
