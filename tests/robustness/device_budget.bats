#!/usr/bin/env bats
# A run sized to its device budget (--device-mem-limit) never trains and then
# dies: everything a run allocates on the device (the model, its state, the
# activations, evaluation, the sample, the checkpoint's buffers) is allocated
# before step 1, or grown during step 1 (the kernels' workspaces, which every
# later pass fits into). So one byte less than a run's peak fails before step
# 1's line with nothing saved, and exactly its peak trains and saves.

load ../helpers

FLAGS="--device cpu --model tiny --steps 2 --eval-batches 1 --sample 16"

# train NP PROGRAM ARGS...: PROGRAM (01_single_gpu/train, ...) on NP ranks,
# one OpenMP thread each (the attention workspace grows with the threads).
train() {
    local np="$1" program="$2"
    shift 2
    if [ "$np" = 1 ]; then
        OMP_NUM_THREADS=1 "$REPO/$program" $FLAGS "$@"
    else
        OMP_NUM_THREADS=1 mpirun_np "$np" "$REPO/$program" $FLAGS "$@"
    fi
}

# check_budget NP PROGRAM ARGS...: measure the run's peak device bytes, then
# a budget of one byte less must fail at start-up naming the budget, and the
# peak itself must train and save.
check_budget() {
    local np="$1" program="$2" dir
    shift 2
    dir="$(scratch)"
    train "$np" "$program" "$@" --out "$dir/measure" >/dev/null
    local peak
    peak="$(csv_column "$dir/measure/run.csv" peak_device_bytes)"
    [ "$peak" -gt 0 ]

    run --separate-stderr train "$np" "$program" "$@" --device-mem-limit $((peak - 1)) \
        --out "$dir/short" --save "$dir/short.ckpt"
    assert_equal "$status" 2
    [ "$(grep -c '^step ' <<<"$output")" = 0 ] # no step line
    [[ "$stderr" == *"would exceed the budget"*"(--device-mem-limit)"* ]]
    [ ! -e "$dir/short.ckpt" ]

    run --separate-stderr train "$np" "$program" "$@" --device-mem-limit "$peak" \
        --out "$dir/fits" --save "$dir/fits.ckpt"
    assert_success
    assert_output --partial "saved checkpoint $dir/fits.ckpt at step 2"
    [ -s "$dir/fits.ckpt" ]
}

@test "01: one byte below its peak fails before step 1 with nothing saved; its peak trains and saves" {
    check_budget 1 01_single_gpu/train --precision bf16
}

@test "02: one byte below its peak fails before step 1 with nothing saved; its peak trains and saves" {
    check_budget 2 02_data_parallel/train --dp-mode overlap
}

@test "03: one byte below its peak fails before step 1 with nothing saved; its peak trains and saves" {
    check_budget 2 03_model_parallel/train --mp tensor
}

@test "04: one byte below its peak fails before step 1 with nothing saved; its peak trains and saves" {
    check_budget 2 04_pipeline/train --pp 2 --micro 2
}

@test "05 stage 3: one byte below its peak (the evaluation's whole model) fails before step 1; its peak saves" {
    check_budget 2 05_zero/train --zero 3 --layers 6
}

@test "05 stage 1 in bf16: one byte below its peak fails before step 1; its peak saves" {
    check_budget 2 05_zero/train --zero 1 --precision bf16
}

@test "06: one byte below its peak fails before step 1 with nothing saved; its peak trains and saves" {
    check_budget 2 06_offload/train --offload --precision bf16 --dpu
}

@test "05: a budget that holds training but not the evaluation's whole model is refused at start-up, naming both" {
    run --separate-stderr train 2 05_zero/train --zero 3 --layers 6 --device-mem-limit 11800000 \
        --out "$(scratch)/out" --save "$(scratch)/z.ckpt"
    assert_equal "$status" 2
    [ "$(grep -c '^step ' <<<"$output")" = 0 ] # no step line
    [[ "$stderr" == *"] out of device memory: allocating 1.29 MiB for the whole model in fp32 for evaluation (device/workspace) would exceed the budget: 10.33 MiB already in use, budget 11.25 MiB (--device-mem-limit)"* ]]
    [ ! -e "$(scratch)/z.ckpt" ]
}
