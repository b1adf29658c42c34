#!/usr/bin/env bats
# title: the bubble arithmetic
# points: 2
# Exercise 04.1 (04_pipeline/schedule.c, bubble_formula and bubble_measured):
# the formula against the idle fraction of a simulated GPipe pipeline for
# P = 1..6 stages and M = 1..10 micro-batches, and the measured bubble on
# cases worked by hand. Catches (P-1)/M, (P-1)/(M+P), and a measured bubble
# that forgets to divide by the number of stages.

load ../helpers

@test "the bubble formula and the measured bubble are right" {
    run "$BUILD/tests/test_schedule" --arithmetic
    assert_success
    assert_output --partial "PASS: 0 failures (bubble arithmetic)"
}
