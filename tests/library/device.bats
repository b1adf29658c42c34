#!/usr/bin/env bats
# device.bats: the device layer's host memory and streams, on the CPU backend
# (build/tests/test_memory). Their GPU counterparts are in parity.bats.

load ../helpers

@test "pinned host memory is counted under host, zero-filled, page-aligned and given back" {
    run "$BUILD/tests/test_memory" pinned
    assert_success
    assert_output --partial "PASS pinned"
}

@test "asynchronous copies on the copy stream, ordered by events around a kernel, give the right bytes" {
    run "$BUILD/tests/test_memory" async_copy
    assert_success
    assert_output --partial "PASS async copy"
}
