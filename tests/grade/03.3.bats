#!/usr/bin/env bats
# title: merging two partial attention results
# points: 2
# twins: common/kernels/attention_cuda.cu attention_merge_cuda attention_merge_kernel
# Exercise 03.3 (common/kernels/attention_cpu.c, attention_merge_cpu): the
# log-sum-exp rule that ring attention (03_model_parallel/context_parallel.c)
# folds each block into its running output with, checked by
# tests/test_kernels.c's ring_attention: the causal attention of a whole
# sequence rebuilt from chunks of queries against chunks of keys, merged in
# two orders, against the fused kernel. Catches an lse left unmerged, outputs
# averaged or weighted by the wrong sum, and exponentials taken without
# subtracting the larger lse first (scores in the hundreds overflow).

load ../helpers

@test "blocks of attention merged by log-sum-exp equal the whole causal attention" {
    run "$BUILD/tests/test_kernels" ring_attention
    assert_success
    assert_output --partial "PASS ring_attention"
}
