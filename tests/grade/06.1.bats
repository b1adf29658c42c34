#!/usr/bin/env bats
# title: the vectorised AdamW inner loop
# points: 3
# Exercise 06.1 (06_offload/cpu_adam.c, adamw_avx2): the AVX2 loop of the
# host AdamW. Graded by (1) its updates of master weights, m, v and the
# 16-bit copy (none, bf16, fp16) against cpu_adam.c's scalar path, bit for
# bit, on lengths from 0 to three OpenMP chunks and misaligned arrays, with
# guard zones that catch a loop running past n; (2) its speed: at least 1.5
# times the scalar path's on one thread, the median of 7 alternating
# timings of CPU time (so other load on the machine counts little). It
# catches a multiply by the reciprocal of the bias correction or an rsqrt
# estimate (fast, but not the same bits), a forgotten grad_scale or weight
# decay, an FMA, a loop that stops short or runs past the end, and a loop
# that is correct but no faster than scalar code. The grader compares with
# the scalar path of the same file, which is 01.2's AdamW element: do 01.2
# first. On a CPU with AVX-512, cpu_adamw takes the 16-lane loop
# (adamw_avx512, the same exercise at 16 lanes), which is graded the same way.

load ../helpers

setup() {
    "$BUILD/tests/test_cpu_adam" path | grep -q '^supported.* avx2' ||
        skip "this CPU has no AVX2: exercise 06.1 cannot be graded here"
}

@test "the AVX2 loop gives the scalar AdamW's bits on every length and alignment" {
    run "$BUILD/tests/test_cpu_adam" exercise avx2
    assert_success
    assert_output --partial "PASS avx2 path equals the scalar path bit for bit"
}

@test "on a CPU with AVX-512, the AVX-512 loop gives the scalar AdamW's bits and is 1.5 times as fast" {
    "$BUILD/tests/test_cpu_adam" path | grep -q '^supported.* avx512' || skip "this CPU has no AVX-512"
    run "$BUILD/tests/test_cpu_adam" exercise avx512
    assert_success
    assert_output --partial "PASS avx512 path equals the scalar path bit for bit"
    run "$BUILD/tests/test_cpu_adam" speed avx512 1.5
    assert_success
    assert_output --partial "PASS speed avx512, 1 thread"
}

@test "the AVX2 loop is at least 1.5 times as fast as the scalar path on one thread" {
    run "$BUILD/tests/test_cpu_adam" speed avx2 1.5
    assert_success
    assert_output --partial "PASS speed avx2, 1 thread"
}
