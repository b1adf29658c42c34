#!/usr/bin/env bats
# precision.bats: mixed precision in chapter 01 (--precision bf16|fp16, mixed.h):
# where the bytes go, that a 16-bit run learns like fp32, and fp16's loss
# scaling skipping exactly the steps whose gradients overflow.

load ../helpers

# The equivalence runs: 20 steps of the tiny preset, a batch of 12 (it splits
# over 2, 3 and 4 ranks and their micro-batches).
equivalence_flags() {
    echo "--device cpu --steps 20 --batch 12 --sample 0 --quiet --eval-batches 1 --precision $1"
}

# Chapter 01 in bf16 and in fp16, once for the file: the reference of every layout.
setup_file() {
    for precision in bf16 fp16; do
        # shellcheck disable=SC2046
        "$TRAIN01" $(equivalence_flags "$precision") --out "$BATS_FILE_TMPDIR/ref-$precision" >/dev/null
    done
}

train01() {
    "$TRAIN01" --device cpu --sample 0 --quiet --eval-batches 1 "$@"
}

# bytes_per_param DIR CATEGORY: memory.csv's device peak of CATEGORY over run.csv's parameter count.
bytes_per_param() {
    local params peak
    params="$(csv_column "$1/run.csv" params)"
    peak="$(awk -F, -v c="$2" '$2 == "device" && $3 == c { print $4 }' "$1/memory.csv")"
    awk -v b="$peak" -v p="$params" 'BEGIN { printf "%g\n", b / p }'
}

@test "bf16 and fp16 keep 2 bytes of parameters, 2 of gradients and 12 of optimizer state per parameter, for several shapes" {
    local shape i=0
    for shape in "--model tiny" "--layers 1 --dmodel 32 --heads 2 --seq 16" "--layers 3 --dmodel 48 --heads 3 --seq 24 --vocab 300"; do
        for precision in bf16 fp16; do
            i=$((i + 1))
            # shellcheck disable=SC2086
            train01 $shape --precision "$precision" --steps 1 --out "$(scratch)/m$i"
            assert_equal "$(bytes_per_param "$(scratch)/m$i" params)" 2
            assert_equal "$(bytes_per_param "$(scratch)/m$i" grads)" 2
            assert_equal "$(bytes_per_param "$(scratch)/m$i" optimizer)" 12
        done
    done
}

@test "fp32 keeps 4, 4 and 8 bytes per parameter, as before" {
    train01 --steps 1 --out "$(scratch)/m"
    assert_equal "$(bytes_per_param "$(scratch)/m" params)" 4
    assert_equal "$(bytes_per_param "$(scratch)/m" grads)" 4
    assert_equal "$(bytes_per_param "$(scratch)/m" optimizer)" 8
}

@test "a device budget refuses the 16-bit parameters at their 2-byte size" {
    # tiny has 136960 parameters: their 16-bit copy is 273920 bytes = 267.50 KiB
    run --separate-stderr "$TRAIN01" --device cpu --sample 0 --quiet --precision bf16 --steps 1 \
        --device-mem-limit 200000 --out "$(scratch)/o"
    assert_equal "$status" 2
    [[ "$stderr" == *"allocating 267.50 KiB for 16-bit parameters (device/params)"* ]] || { echo "$stderr"; return 1; }
}

# The tiny preset, 300 steps: long enough that the loss has fallen from 5.5 to
# about 2.5, where a 16-bit run that failed to learn (updates lost to rounding,
# no master weights) would sit visibly higher. 2% is the issue's tolerance: the
# runs round differently from the first step on, and over 300 steps that
# moves the last step's loss by well under 1% (measured: see the commit).
assert_final_loss_near_fp32() {
    local precision="$1" fp32="$BATS_FILE_TMPDIR/fp32-300"
    # the fp32 run, once for both tests
    [ -f "$fp32/run.csv" ] || train01 --steps 300 --out "$fp32"
    train01 --steps 300 --precision "$precision" --out "$(scratch)/$precision"
    local ref got
    ref="$(csv_column "$fp32/run.csv" final_loss)"
    got="$(csv_column "$(scratch)/$precision/run.csv" final_loss)"
    echo "fp32 $ref, $precision $got"
    awk -v a="$ref" -v b="$got" 'BEGIN { r = (b - a) / a; if (r < 0) r = -r; exit !(r <= 0.02 && a < 3.5) }'
}

@test "01 in bf16 learns: the tiny preset's loss after 300 steps is within 2% of fp32's" {
    assert_final_loss_near_fp32 bf16
}

@test "01 in fp16 with dynamic loss scaling learns: within 2% of fp32's after 300 steps" {
    assert_final_loss_near_fp32 fp16
}

@test "steps.csv of a 16-bit run gains loss_scale and skipped; bf16's scale is 1" {
    train01 --steps 2 --precision bf16 --out "$(scratch)/b"
    run head -1 "$(scratch)/b/steps.csv"
    assert_output --regexp ',loss_scale,skipped$'
    assert_equal "$(csv_column "$(scratch)/b/steps.csv" loss_scale | sort -u)" 1
    assert_equal "$(csv_column "$(scratch)/b/steps.csv" skipped | sort -u)" 0
    train01 --steps 2 --out "$(scratch)/f"
    run head -1 "$(scratch)/f/steps.csv"
    refute_output --partial loss_scale
}

@test "an fp16 overflow skips exactly that step, leaves the weights as they were, halves the scale, and training goes on" {
    COURSE_FAULT_OVERFLOW_STEP=3 train01 --steps 6 --eval-every 1 --precision fp16 --out "$(scratch)/o"
    local d="$(scratch)/o"
    assert_equal "$(csv_column "$d/steps.csv" skipped | tr '\n' ' ')" "0 0 1 0 0 0 "
    assert_equal "$(csv_column "$d/steps.csv" loss_scale | tr '\n' ' ')" "65536 65536 65536 32768 32768 32768 "
    # val_loss is measured after each step's update on the same batches: the
    # skipped step 3 leaves step 2's weights, bit for bit; step 4 moves them again
    local val
    val=($(csv_column "$d/steps.csv" val_loss))
    assert_equal "${val[2]}" "${val[1]}"
    [ "${val[3]}" != "${val[2]}" ]
    [ "$(csv_column "$d/run.csv" steps)" = 6 ]
}

@test "a fixed fp16 loss scale stays fixed through an overflow" {
    COURSE_FAULT_OVERFLOW_STEP=2 train01 --steps 3 --precision fp16 --loss-scale 1024 --out "$(scratch)/o"
    assert_equal "$(csv_column "$(scratch)/o/steps.csv" skipped | tr '\n' ' ')" "0 1 0 "
    assert_equal "$(csv_column "$(scratch)/o/steps.csv" loss_scale | sort -u)" 1024
}

@test "a dynamic scale doubles after a window of clean steps and halves at an overflow" {
    # From 2^16 the tiny model's gradients overflow now and then (at 2^17
    # here): the columns must follow the rule, whatever the steps hit.
    train01 --steps 8 --precision fp16 --loss-scale-window 2 --out "$(scratch)/o"
    run paste -d, <(csv_column "$(scratch)/o/steps.csv" loss_scale) <(csv_column "$(scratch)/o/steps.csv" skipped)
    echo "$output" | awk -F, -v window=2 '
        NR > 1 && $1 != expect { print "step " NR ": scale " $1 ", expected " expect; bad = 1 }
        { if ($2 == 1) { expect = $1 / 2; clean = 0 } else if (++clean == window) { expect = $1 * 2; clean = 0 } else expect = $1
          if ($1 > 65536) doubled = 1 }
        END { if (!doubled) { print "the scale never doubled"; bad = 1 }; exit bad }'
}

# ---- chapter 02 in 16 bits: every layout it supports against 01 in the same precision ----
# Tolerance 1e-2 relative on every loss of 20 steps of the tiny preset (the
# issue's). The ranks sum 16-bit gradients in another order than one device
# accumulates them, and each partial sum is rounded to 16 bits (bf16 keeps 8
# significant bits: a relative step of 2^-8 = 0.4%), so the weights drift
# apart by a few units in the last place of the 16-bit weights per step; the
# loss, an average over 512 tokens, moves far less than the weights do.
# Measured on this CPU: at most 1.4e-5 (bf16) and 3.9e-6 (fp16) over these runs.
# (assert_losses_within: helpers.bash.)

check_02_against_01() {
    local precision="$1" ref="$BATS_FILE_TMPDIR/ref-$1"
    for np in 2 3; do
        for mode in naive flat overlap; do
            # shellcheck disable=SC2086
            OMP_NUM_THREADS=1 mpirun_np "$np" "$REPO/02_data_parallel/train" $(equivalence_flags "$precision") \
                --dp-mode "$mode" --bucket-mb 0.05 --out "$(scratch)/$np-$mode" >/dev/null
            assert_losses_within "$ref" "$(scratch)/$np-$mode" 20 1e-2
        done
    done
    # the course's ring, in 16 bits too (02_data_parallel/ring.c), on an odd number of ranks
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 mpirun_np 3 "$REPO/02_data_parallel/train" $(equivalence_flags "$precision") \
        --allreduce ring --out "$(scratch)/3-ring" >/dev/null
    assert_losses_within "$ref" "$(scratch)/3-ring" 20 1e-2
}

@test "02 in bf16, naive, flat, overlap and the ring on 2 and 3 ranks, matches 01 in bf16 within 1e-2 over 20 steps" {
    check_02_against_01 bf16
}

@test "02 in fp16, naive, flat, overlap and the ring on 2 and 3 ranks, matches 01 in fp16 within 1e-2 over 20 steps" {
    check_02_against_01 fp16
}

# ---- chapters 03 and 04 in 16 bits: each layout, once per precision ----
# One run per layout: the data-parallel run of each chapter is also its
# tensor-parallel (03) or 1F1B (04) run. Measured on this CPU: at most
# 1.1e-5 (bf16) and 5.8e-6 (fp16) relative over these runs; 02's ring, 8.7e-6
# and 5.2e-6.

# run_np NP CHAPTER OUT FLAGS...: one run of a chapter's program in the equivalence setting.
run_np() {
    local np="$1" chapter="$2" out="$3" precision="$4"
    shift 4
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 mpirun_np "$np" "$REPO/$chapter/train" $(equivalence_flags "$precision") --out "$out" "$@" \
        >/dev/null
}

# device_bytes DIR CATEGORY: memory.csv's device peaks of CATEGORY, one line per rank.
device_bytes() {
    awk -F, -v c="$2" '$2 == "device" && $3 == c { print $4 }' "$1/memory.csv"
}

# Every rank keeps 2 + 2 bytes per parameter it holds and 12 of optimizer state.
assert_2_2_12_per_rank() {
    paste -d, <(device_bytes "$1" params) <(device_bytes "$1" grads) <(device_bytes "$1" optimizer) |
        awk -F, '{ n++; if ($2 != $1 || $3 != 6 * $1) { print "rank " NR - 1 ": " $0; bad = 1 } }
                 END { exit bad || n < 2 }'
}

# A layer split holds every parameter once: over its ranks 2 + 2 + 12 bytes each.
assert_2_2_12_in_all() {
    local params
    params="$(csv_column "$1/run.csv" params)"
    assert_equal "$(device_bytes "$1" params | awk '{ s += $1 } END { print s }')" "$((2 * params))"
    assert_equal "$(device_bytes "$1" grads | awk '{ s += $1 } END { print s }')" "$((2 * params))"
    assert_equal "$(device_bytes "$1" optimizer | awk '{ s += $1 } END { print s }')" "$((12 * params))"
}

check_03_against_01() {
    local precision="$1" ref="$BATS_FILE_TMPDIR/ref-$1" d
    d="$(scratch)"
    run_np 2 03_model_parallel "$d/layer2" "$precision" --mp layer
    assert_losses_within "$ref" "$d/layer2" 20 1e-2
    assert_2_2_12_in_all "$d/layer2"
    run_np 4 03_model_parallel "$d/dp2-tensor2" "$precision" --mp tensor --dp 2
    assert_losses_within "$ref" "$d/dp2-tensor2" 20 1e-2
    assert_2_2_12_per_rank "$d/dp2-tensor2"
}

@test "03 in bf16: the layer split on 2 ranks and 2 replicas of a 2-rank tensor group match 01 in bf16 within 1e-2; 2+2+12 bytes per parameter" {
    check_03_against_01 bf16
}

@test "03 in fp16: the layer split on 2 ranks and 2 replicas of a 2-rank tensor group match 01 in fp16 within 1e-2; 2+2+12 bytes per parameter" {
    check_03_against_01 fp16
}

check_04_against_01() {
    local precision="$1" ref="$BATS_FILE_TMPDIR/ref-$1" d
    d="$(scratch)"
    run_np 2 04_pipeline "$d/gpipe2" "$precision" --schedule gpipe --micro 3
    assert_losses_within "$ref" "$d/gpipe2" 20 1e-2
    assert_2_2_12_in_all "$d/gpipe2"
    run_np 4 04_pipeline "$d/dp2-1f1b2" "$precision" --schedule 1f1b --micro 3 --dp 2
    assert_losses_within "$ref" "$d/dp2-1f1b2" 20 1e-2
    assert_2_2_12_per_rank "$d/dp2-1f1b2"
}

@test "04 in bf16: GPipe on 2 stages and 2 replicas of a 2-stage 1F1B, 3 micro-batches match 01 in bf16 within 1e-2; 2+2+12 bytes per parameter" {
    check_04_against_01 bf16
}

@test "04 in fp16: GPipe on 2 stages and 2 replicas of a 2-stage 1F1B, 3 micro-batches match 01 in fp16 within 1e-2; 2+2+12 bytes per parameter" {
    check_04_against_01 fp16
}

@test "an fp16 overflow on one rank only skips that step on every rank (03 tensor parallel, 04 data parallel)" {
    # rank 1's first gradient (a replicated tensor in tensor parallelism, a
    # replica's own sum after the all-reduce in 04) becomes Inf at step 3:
    # rank 0, whose gradients are finite, writes steps.csv and must skip too
    local d
    d="$(scratch)"
    COURSE_FAULT_OVERFLOW_STEP=3 COURSE_FAULT_OVERFLOW_RANK=1 run_np 2 03_model_parallel "$d/tp" fp16 --mp tensor \
        --steps 5
    COURSE_FAULT_OVERFLOW_STEP=3 COURSE_FAULT_OVERFLOW_RANK=1 run_np 2 04_pipeline "$d/dp" fp16 --dp 2 --steps 5
    for run in tp dp; do
        assert_equal "$(csv_column "$d/$run/steps.csv" skipped | tr '\n' ' ')" "0 0 1 0 0 "
        assert_equal "$(csv_column "$d/$run/steps.csv" loss_scale | tr '\n' ' ')" "65536 65536 65536 32768 32768 "
    done
    # and the model stayed one model: the losses after the skip are 01's with the same skip
    COURSE_FAULT_OVERFLOW_STEP=3 train01 $(equivalence_flags fp16) --steps 5 --out "$d/ref"
    assert_losses_within "$d/ref" "$d/tp" 5 1e-2
    assert_losses_within "$d/ref" "$d/dp" 5 1e-2
}

# sent_mib STEPS [FLAGS]: the MiB a rank of a 2-rank run of 02 reports sending.
sent_mib() {
    local steps="$1"
    shift
    OMP_NUM_THREADS=1 mpirun_np 2 "$REPO/02_data_parallel/train" --device cpu --batch 4 --sample 0 --quiet \
        --eval-batches 1 --steps "$steps" --out "$(scratch)/s$steps$*" "$@" 2>&1 |
        grep -o '[0-9.]* MiB sent per rank' | cut -d' ' -f1
}

@test "02's 16-bit all-reduce sends half the bytes of fp32's" {
    # 20 more steps, 20 more gradient all-reduces: the start-up broadcast of
    # the weights (fp32 master and 16-bit copy) cancels out
    local fp32 bf16
    fp32="$(awk -v a="$(sent_mib 21)" -v b="$(sent_mib 1)" 'BEGIN { print a - b }')"
    bf16="$(awk -v a="$(sent_mib 21 --precision bf16)" -v b="$(sent_mib 1 --precision bf16)" 'BEGIN { print a - b }')"
    echo "20 steps: fp32 $fp32 MiB, bf16 $bf16 MiB"
    awk -v a="$fp32" -v b="$bf16" 'BEGIN { r = b / a; exit !(r > 0.48 && r < 0.52) }'
}


@test "bf16 with --recompute gives bit-identical losses, and micro-batches accumulate 16-bit gradients" {
    train01 --steps 3 --precision bf16 --out "$(scratch)/a"
    train01 --steps 3 --precision bf16 --recompute --out "$(scratch)/r"
    run diff <(csv_column "$(scratch)/a/steps.csv" loss) <(csv_column "$(scratch)/r/steps.csv" loss)
    assert_success
    train01 --steps 3 --precision bf16 --micro 2 --out "$(scratch)/m"
    assert_losses_within "$(scratch)/a" "$(scratch)/m" 3 1e-2
}

@test "a bf16 run saved at step 3 and resumed gives the uninterrupted run's losses, bit for bit" {
    train01 --steps 6 --precision bf16 --out "$(scratch)/whole"
    train01 --steps 6 --stop-after 3 --precision bf16 --save "$(scratch)/ck" --out "$(scratch)/first"
    train01 --steps 6 --precision bf16 --resume "$(scratch)/ck" --out "$(scratch)/second"
    run diff <(csv_column "$(scratch)/whole/steps.csv" loss | tail -3) <(csv_column "$(scratch)/second/steps.csv" loss)
    assert_success
}

@test "an fp32 checkpoint resumes in bf16: the checkpoint holds fp32 weights whatever the precision" {
    train01 --steps 4 --stop-after 2 --save "$(scratch)/ck" --out "$(scratch)/fp32"
    train01 --steps 4 --precision bf16 --resume "$(scratch)/ck" --out "$(scratch)/bf16"
    assert_equal "$(csv_column "$(scratch)/bf16/steps.csv" step | tr '\n' ' ')" "3 4 "
}

# activation_floats_per_token C L NH V: model.c's activation_bytes / 4 / (B x T).
activation_floats_per_token() {
    awk -v C="$1" -v L="$2" -v NH="$3" -v V="$4" 'BEGIN { print 2 + C + L * (12 * C + 4 + NH) + C + 2 + 2 * V + 1 }'
}

@test "activations stay fp32 in every precision: memory.csv's activation bytes are 4 per value of the model's shapes" {
    local d tokens per_token
    d="$(scratch)"
    for precision in fp32 bf16 fp16; do
        train01 --precision "$precision" --steps 1 --batch 4 --out "$d/$precision"
    done
    tokens=$((4 * 64)) # B x T of the tiny preset at --batch 4
    per_token="$(activation_floats_per_token 64 2 4 256)"
    for precision in fp32 bf16 fp16; do
        assert_equal "$(device_bytes "$d/$precision" activations)" "$((4 * tokens * per_token))"
    done
    # course.md's numbers for the small preset (B x T = 8 x 128, C 128, L 4, 4 heads): the
    # activations, and what storing ln1, ln2 and lnf (the matmuls' inputs) in 16 bits would save
    assert_equal "$((4 * 1024 * $(activation_floats_per_token 128 4 4 256)))" 28463104
    assert_equal "$((2 * 1024 * 128 * (2 * 4 + 1)))" 2359296
}
