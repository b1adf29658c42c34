#!/usr/bin/env bats
# parity.bats: each CUDA kernel gives the CPU kernel's results (tests/test_parity.c).
# Skipped when no GPU is usable; `make test-gpu` sets REQUIRE_GPU=1 to make that a failure.

load ../helpers

@test "embedding forward on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" embedding_forward
    assert_success
}

@test "embedding backward on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" embedding_backward
    assert_success
}

@test "layernorm forward on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" layernorm_forward
    assert_success
}

@test "layernorm backward on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" layernorm_backward
    assert_success
}

@test "linear forward on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" linear_forward
    assert_success
}

@test "linear backward on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" linear_backward
    assert_success
}

@test "linear backward's two halves (input gradient, weight gradient) on CUDA match the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" linear_backward_split
    assert_success
}

@test "linear forward and backward with bf16 and fp16 inputs (cublasGemmEx) on CUDA match the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" linear_half
    assert_success
}

@test "attention forward on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" attention_forward
    assert_success
}

@test "attention backward on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" attention_backward
    assert_success
}

@test "attention in a 16-bit run on CUDA (one TF32 product) matches the CPU within 1e-2, and is not strict fp32's" {
    require_gpu
    run "$BUILD/tests/test_parity" attention_mixed
    assert_success
}

@test "ring attention's block forward (on and off the diagonal) on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" attention_block_forward
    assert_success
}

@test "ring attention's log-sum-exp merge on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" attention_merge
    assert_success
}

@test "ring attention's block backward (on and off the diagonal) on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" attention_block_backward
    assert_success
}

@test "context parallelism on CUDA exchanges the ring's blocks (--cp-send auto), and refuses posted sends in one line" {
    require_gpu
    d=$(scratch)
    run mpirun_np 2 "$REPO/03_model_parallel/train" --device cuda --comm mpi --cp 2 --steps 1 --sample 0 --quiet \
        --out "$d/cp"
    assert_success
    run mpirun_np 2 "$REPO/03_model_parallel/train" --device cuda --comm mpi --cp 2 --cp-send posted --steps 1 \
        --sample 0 --quiet --out "$d/posted"
    assert_failure
    assert_output --partial "--cp-send posted: the mpi (host-staged) transport cannot post sends yet"
    refute_line --regexp '^step ' # no step ran (the sharing warning's "step times" is not a step line)
}

@test "gelu forward on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" gelu_forward
    assert_success
}

@test "gelu backward on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" gelu_backward
    assert_success
}

@test "residual forward on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" residual_forward
    assert_success
}

@test "residual backward on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" residual_backward
    assert_success
}

@test "cross-entropy forward on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" crossentropy_forward
    assert_success
}

@test "cross-entropy backward on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" crossentropy_backward
    assert_success
}

@test "the vocabulary split's embedding rows, forward and backward, on CUDA match the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" vocab_split_embedding
    assert_success
}

@test "the vocabulary split's cross-entropy from a slice of the logits, forward and backward, on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" vocab_split_crossentropy
    assert_success
}

@test "the mixture of experts' gather, scatter-add, combine and its backward on CUDA match the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" moe
    assert_success
}

@test "sum of squares on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" sum_squares
    assert_success
}

@test "AdamW update on CUDA matches the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" adamw_update
    assert_success
}

@test "fill_zero on CUDA zeroes exactly what the CPU zeroes" {
    require_gpu
    run "$BUILD/tests/test_parity" fill_zero
    assert_success
}

@test "conversions to and from bf16 and fp16 on CUDA give the CPU's bits" {
    require_gpu
    run "$BUILD/tests/test_parity" casts
    assert_success
}

@test "16-bit gradients, their sum of squares and AdamW on master weights on CUDA match the CPU" {
    require_gpu
    run "$BUILD/tests/test_parity" mixed
    assert_success
}

@test "an asynchronous copy on the copy stream, ordered by events around a kernel, gives the CPU's values" {
    require_gpu
    run "$BUILD/tests/test_parity" async_copy
    assert_success
}

@test "a host<->device copy on the copy stream overlaps matmuls on the compute stream" {
    require_gpu
    run "$BUILD/tests/test_overlap"
    echo "$output"
    assert_success
    assert_output --partial "PASS: a copy on the copy stream overlaps"
}

@test "ten training steps of the tiny model on CUDA give the CPU's losses within 1e-4" {
    require_gpu
    d=$(scratch)
    "$TRAIN01" --device cpu --model tiny --steps 10 --sample 0 --quiet --out "$d/cpu"
    "$TRAIN01" --device cuda --model tiny --steps 10 --sample 0 --quiet --out "$d/cuda"
    run paste -d, <(csv_column "$d/cpu/steps.csv" loss) <(csv_column "$d/cuda/steps.csv" loss)
    assert_equal "$(echo "$output" | grep -c ,)" "10"
    echo "$output" | awk -F, '{ r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > 1e-4) { print "step " NR ": " $0; bad = 1 } }
                              END { exit bad }'
}

@test "memory accounting on CUDA matches the CPU's for params, grads and optimizer" {
    require_gpu
    d=$(scratch)
    "$TRAIN01" --device cpu --steps 1 --sample 0 --quiet --out "$d/cpu"
    "$TRAIN01" --device cuda --steps 1 --sample 0 --quiet --out "$d/cuda"
    for c in params grads optimizer activations; do
        assert_equal "$(grep ",device,$c," "$d/cpu/memory.csv")" "$(grep ",device,$c," "$d/cuda/memory.csv")"
    done
}

@test "data parallel on 2 ranks sharing one GPU (host-staged MPI) gives the CPU's single-device losses" {
    require_gpu
    d=$(scratch)
    "$TRAIN01" --device cpu --steps 5 --batch 12 --sample 0 --quiet --out "$d/ref"
    for mode in flat overlap; do
        for ar in library ring; do
            mpirun_np 2 "$REPO/02_data_parallel/train" --device cuda --comm mpi --steps 5 --batch 12 --sample 0 \
                --quiet --dp-mode "$mode" --allreduce "$ar" --bucket-mb 0.05 --out "$d/$mode-$ar"
            paste -d, <(csv_column "$d/ref/steps.csv" loss) <(csv_column "$d/$mode-$ar/steps.csv" loss) |
                awk -F, '{ n++; r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > 1e-4) bad = 1 } END { exit bad || n != 5 }'
        done
    done
}

@test "data parallel with NCCL (one GPU per rank) gives the CPU's single-device losses" {
    require_gpu
    gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
    [ "$gpus" -ge 2 ] || skip "NCCL needs a GPU per rank; $gpus visible"
    d=$(scratch)
    "$TRAIN01" --device cpu --steps 5 --batch 12 --sample 0 --quiet --out "$d/ref"
    mpirun_np 2 "$REPO/02_data_parallel/train" --device cuda --comm nccl --steps 5 --batch 12 --sample 0 --quiet \
        --dp-mode overlap --out "$d/nccl"
    paste -d, <(csv_column "$d/ref/steps.csv" loss) <(csv_column "$d/nccl/steps.csv" loss) |
        awk -F, '{ n++; r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > 1e-4) bad = 1 } END { exit bad || n != 5 }'
}

@test "the layer split, tensor parallel and 1F1B pipeline on 2 ranks sharing one GPU give the CPU's losses" {
    require_gpu
    d=$(scratch)
    "$TRAIN01" --device cpu --layers 4 --steps 4 --batch 8 --sample 0 --quiet --out "$d/ref"
    mpirun_np 2 "$REPO/03_model_parallel/train" --device cuda --comm mpi --mp layer --layers 4 --steps 4 --batch 8 \
        --sample 0 --quiet --out "$d/layer"
    mpirun_np 2 "$REPO/03_model_parallel/train" --device cuda --comm mpi --mp tensor --tp 2 --layers 4 --steps 4 \
        --batch 8 --sample 0 --quiet --out "$d/tensor"
    mpirun_np 2 "$REPO/04_pipeline/train" --device cuda --comm mpi --schedule 1f1b --micro 4 --layers 4 --steps 4 \
        --batch 8 --sample 0 --quiet --out "$d/pipeline"
    for run in layer tensor pipeline; do
        paste -d, <(csv_column "$d/ref/steps.csv" loss) <(csv_column "$d/$run/steps.csv" loss) |
            awk -F, '{ n++; r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > 1e-4) bad = 1 } END { exit bad || n != 4 }'
    done
}
