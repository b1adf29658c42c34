#!/usr/bin/env bats
# 04_pipeline/schedule.c: GPipe and 1F1B as explicit action lists, checked by
# simulating every stage against the others with blocking messages.

load ../helpers

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

# ---- past 1F1B: interleaved (V chunks per stage) and zb-h1 (backward split into B and W) ----

@test "interleaved and zb-h1 never deadlock, run every F, B and W once in order, and meet their formulas for P <= 6, V = 2, 3" {
    run "$BUILD/tests/test_schedule"
    assert_success
    assert_output --partial "zb-h1 P = 1..6, M = 1..12; interleaved P = 2..6, V = 2..3, M = 1..12)"
    refute_output --partial "FAIL"
}

@test "interleaved goes round the ring of 2 stages twice, P micro-batches per chunk, and posts its sends" {
    run "$BUILD/tests/test_schedule" --print-chunks interleaved 2 2 4
    assert_success
    assert_line "stage 0: F0 pa0 F1 pa1 ra0c1 F0c1 pa0c1 ra1c1 F1c1 pa1c1 F2 pa2 rg0c1 B0c1 pg0c1 F3 pa3 rg1c1 B1c1 pg1c1 ra2c1 F2c1 pa2c1 rg0 B0 ra3c1 F3c1 pa3c1 rg1 B1 rg2c1 B2c1 pg2c1 rg3c1 B3c1 pg3c1 rg2 B2 rg3 B3"
    assert_line "stage 1: ra0 F0 pa0 ra1 F1 pa1 ra0c1 F0c1 B0c1 pg0c1 ra1c1 F1c1 B1c1 pg1c1 ra2 F2 pa2 rg0 B0 pg0 ra3 F3 pa3 rg1 B1 pg1 ra2c1 F2c1 B2c1 pg2c1 ra3c1 F3c1 B3c1 pg3c1 rg2 B2 pg2 rg3 B3 pg3"
}

@test "interleaved refuses micro-batches that are not a multiple of the stages, with Megatron's rule" {
    run --separate-stderr "$BUILD/tests/test_schedule" --print-chunks interleaved 3 2 4
    assert_failure 2
    assert_equal "$stderr" "error: interleaved needs the micro-batches M = 4 to be a multiple of the stages P = 3, as Megatron's interleaved schedule does"
    run --separate-stderr "$BUILD/tests/test_schedule" --print-chunks zb-h1 2 2 4
    assert_failure 2
    assert_equal "$stderr" "error: zb-h1 holds one chunk of layers per stage (here 2); only interleaved holds more"
}

@test "zb-h1 runs W after B, stage s holding its W's back by s backwards" {
    run "$BUILD/tests/test_schedule" --print-chunks zb-h1 3 1 4
    assert_success
    assert_line "stage 0: F0 pa0 F1 pa1 F2 pa2 rg0 B0 W0 F3 pa3 rg1 B1 W1 rg2 B2 W2 rg3 B3 W3"
    assert_line "stage 1: ra0 F0 pa0 ra1 F1 pa1 rg0 B0 pg0 ra2 F2 pa2 rg1 B1 pg1 W0 ra3 F3 pa3 rg2 B2 pg2 W1 rg3 B3 pg3 W2 W3"
    assert_line "stage 2: ra0 F0 B0 pg0 ra1 F1 B1 pg1 ra2 F2 B2 pg2 W0 ra3 F3 B3 pg3 W1 W2 W3"
}

@test "the simulated bubbles on 4 stages and 8 micro-batches: 1f1b 3/11, interleaved V=2 3/19, zb-h1 a third of 1f1b's idle time" {
    run "$BUILD/tests/test_schedule" --simulate-times 1f1b 4 1 8 1 1 1
    assert_output "1f1b P=4 V=1 M=8 tf=1 tb=1 tw=1: makespan 33, bubble 0.2727 (formula 0.2727), in flight per stage: 4 3 2 1"
    run "$BUILD/tests/test_schedule" --simulate-times interleaved 4 2 8 0.5 1 0
    assert_output "interleaved P=4 V=2 M=8 tf=0.5 tb=1 tw=0: makespan 28.5, bubble 0.1579 (formula 0.1579), in flight per stage: 11 9 7 5"
    run "$BUILD/tests/test_schedule" --simulate-times zb-h1 4 1 8 1 1 1
    assert_output "zb-h1 P=4 V=1 M=8 tf=1 tb=1 tw=1: makespan 27, bubble 0.1111 (formula 0.1111), in flight per stage: 4 4 4 4"
}

@test "deliberately broken interleaved and zb-h1 lists are caught: a missing W, a W before its B, blocking sends round the ring, swapped chunks" {
    run "$BUILD/tests/test_schedule" --broken 3 6
    assert_success
    assert_line "zb-h1 with a W missing: INVALID: stage 2, chunk 0, micro-batch 0: forward 1, backward 0, B 1, W 0 times (need F once, then B once, whole or as B and W)"
    assert_line "zb-h1 with a W before its B: INVALID: stage 0, W0: W before its B"
    assert_line "interleaved with blocking sends: DEADLOCK: stage 0 in sa2, stage 1 in sa1, stage 2 in sa0"
    assert_line "interleaved with the backwards' chunks swapped: INVALID: stage 2, B0: backward before its gradient arrives"
}

@test "a schedule replayed at its kinds' times is its formula; GPipe at unequal stages, the flow-shop span" {
    # pipeline_bubble.replay_bubble, the theory bubble_bench.sh and plot.py --bubbles hold a
    # run's measured bubble to, against the closed forms (tests/bubble_replay.py says which)
    run python3 "$REPO/tests/bubble_replay.py" "$BUILD/tests/test_schedule"
    assert_success
    assert_output "bubble_replay: every replay equals its reference"
}
