#!/usr/bin/env bats
# 04_pipeline/schedule.c: GPipe and 1F1B as explicit action lists, checked by
# simulating every stage against the others with blocking messages.

load helpers

@test "gpipe and 1f1b never deadlock, run every micro-batch once, and meet the bubble formula for P <= 6, M <= 10" {
    run "$BUILD/tests/test_schedule"
    assert_success
    assert_output --partial "PASS: 0 failures"
}

@test "1f1b with separate blocking messages deadlocks: two neighbours each wait in a send" {
    run "$BUILD/tests/test_schedule" --simulate 1f1b-naive 2 4
    assert_failure
    assert_output --partial "DEADLOCK (stage 0 in sa1, stage 1 in sg0)"
}

@test "1f1b pairs its steady-state messages into exchanges with the neighbours" {
    run "$BUILD/tests/test_schedule" --print 1f1b 2 3
    assert_success
    assert_line "stage 0: F0 sa0 F1 sa1|rg0 B0 F2 sa2|rg1 B1 rg2 B2"
    assert_line "stage 1: ra0 F0 B0 sg0|ra1 F1 B1 sg1|ra2 F2 B2 sg2"
}

@test "gpipe runs every forward before any backward" {
    run "$BUILD/tests/test_schedule" --print gpipe 2 2
    assert_success
    assert_line "stage 0: F0 sa0 F1 sa1 rg0 B0 rg1 B1"
    assert_line "stage 1: ra0 F0 ra1 F1 B0 sg0 B1 sg1"
}

@test "the simulated bubble of 1f1b on 4 stages and 8 micro-batches is (P-1)/(M+P-1) = 3/11" {
    run "$BUILD/tests/test_schedule" --simulate 1f1b 4 8
    assert_success
    assert_output --partial "bubble 0.2727 (formula 0.2727), in flight on stage 0: 4"
}

@test "actions carry their chunk: one micro-batch at a time round the ring of 2 stages twice, printed and simulated" {
    run "$BUILD/tests/test_schedule" --chunks 2 2 1
    assert_success
    assert_line "stage 0: F0 sa0 ra0c1 F0c1 sa0c1 rg0c1 B0c1 sg0c1 rg0 B0"
    assert_line "stage 1: ra0 F0 sa0 ra0c1 F0c1 B0c1 sg0c1 rg0 B0 sg0"
    assert_output --partial "sequential P=2 V=2 M=1: makespan 12, bubble 0.5000"
}

@test "the simulator follows chunks round the pp ring: every micro-batch through chunk 0 first deadlocks once M >= P" {
    run "$BUILD/tests/test_schedule" --chunks 2 2 2
    assert_failure
    assert_output --partial "breadth-first P=2 V=2 M=2: DEADLOCK (stage 0 in sa1, stage 1 in sa0)"
    run "$BUILD/tests/test_schedule" --chunks 3 2 2
    assert_success
    assert_output --partial "breadth-first P=3 V=2 M=2: makespan"
}
