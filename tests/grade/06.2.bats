#!/usr/bin/env bats
# title: the DPU schedule
# points: 3
# Exercise 06.2 (06_offload/offload.c, offload_update_start and
# offload_update_wait; 06_offload/train.c, update_weights): the delayed
# parameter update. Graded against --dpu-reference, the same one-step-stale
# sequence computed in the same program without a thread (code the exercise
# does not touch): the losses and validation losses of every step of --dpu
# must equal the reference's bit for bit, in bf16 on 1 rank, in fp32 on 2
# ranks (ZeRO-2 shards) with no warm-up, and in fp16 with a step whose
# gradients overflow (skipped, no update started); the warm-up steps must
# equal exact AdamW's and the step after them must not. The last step's
# validation loss is taken after the schedule returns, so it sees the final
# weights. It catches updates that are not delayed (exact AdamW), a last
# update never installed, an update applied twice or one missed, a thread
# reading the gradient shard the next step fills, a step count (t) not
# advanced before the thread reads it, and an overflowed step updated.

load ../helpers

# A tiny model with units that do not divide by 2 ranks; 6 steps, a
# validation loss after every step.
FLAGS="--device cpu --steps 6 --batch 4 --seq 32 --dmodel 48 --heads 4 --vocab 259 --sample 0 --quiet
       --eval-batches 1 --eval-every 1 --offload"

# The runs, once for the whole file: NAME RANKS FLAGS...
setup_file() {
    local d="$BATS_FILE_TMPDIR"
    run06() {
        local name="$1" np="$2"
        shift 2
        OMP_NUM_THREADS=1 mpirun_np "$np" "$REPO/06_offload/train" $FLAGS "$@" --out "$d/$name" >/dev/null
    }
    run06 bf16-dpu 1 --precision bf16 --dpu --dpu-warmup 2
    run06 bf16-ref 1 --precision bf16 --dpu --dpu-warmup 2 --dpu-reference
    run06 bf16-exact 1 --precision bf16
    run06 fp32-dpu 2 --dpu --dpu-warmup 0
    run06 fp32-ref 2 --dpu --dpu-warmup 0 --dpu-reference
    COURSE_FAULT_OVERFLOW_STEP=4 run06 fp16-dpu 1 --precision fp16 --dpu --dpu-warmup 2
    COURSE_FAULT_OVERFLOW_STEP=4 run06 fp16-ref 1 --precision fp16 --dpu --dpu-warmup 2 --dpu-reference
}

# the values of COLUMN (loss, val_loss, ...) of run NAME, one line
values() { csv_column "$BATS_FILE_TMPDIR/$1/steps.csv" "$2" | tr '\n' ' '; }

@test "--dpu gives the one-step-stale reference's losses bit for bit (bf16 on 1 rank, fp32 on 2 ranks)" {
    for p in bf16 fp32; do
        assert_equal "$(values $p-dpu loss)" "$(values $p-ref loss)"
        assert_equal "$(csv_column "$BATS_FILE_TMPDIR/$p-dpu/steps.csv" loss | wc -l)" 6
    done
}

@test "every validation loss, the last one included, sees the reference's weights: the final update is installed" {
    for p in bf16 fp32; do
        assert_equal "$(values $p-dpu val_loss)" "$(values $p-ref val_loss)"
    done
}

@test "the warm-up steps are exact AdamW's; from the step after them the weights are one update stale" {
    local dpu exact
    dpu=($(values bf16-dpu loss))
    exact=($(values bf16-exact loss))
    # steps 1-3 compute at the weights of 0, 1 and 2 exact updates; step 4 lacks step 3's update
    assert_equal "${dpu[*]:0:3}" "${exact[*]:0:3}"
    [ "${dpu[3]}" != "${exact[3]}" ]
    [ "${dpu[5]}" != "${exact[5]}" ]
}

@test "an fp16 step that overflows starts no update, and the schedule goes on like the reference" {
    assert_equal "$(values fp16-dpu skipped)" "0 0 0 1 0 0 "
    assert_equal "$(values fp16-dpu loss)" "$(values fp16-ref loss)"
    assert_equal "$(values fp16-dpu val_loss)" "$(values fp16-ref val_loss)"
}
