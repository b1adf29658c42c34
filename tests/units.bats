#!/usr/bin/env bats
# The layer units of the parameter table (common/param_table.h) and the
# storage bound to them per unit (common/model.h).

load helpers

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
