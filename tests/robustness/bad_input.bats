#!/usr/bin/env bats
# Bad input: one line on stderr naming the problem (and the valid range),
# exit status 2, no crash, within a second. A diverging loss exits with 3.

load ../helpers

# Run the trainer with a one-second limit and stderr kept apart.
bad() {
    run --separate-stderr timeout 1 "$TRAIN01" --device cpu --sample 0 --quiet --out "$(scratch)/out" "$@"
}

# Exit status 2 and exactly one stderr line, starting with "error:" and containing $1.
assert_refused() {
    assert_equal "$status" 2
    assert_equal "$(printf '%s\n' "$stderr" | grep -c .)" "1"
    [[ "$stderr" == error:* ]]
    [[ "$stderr" == *"$1"* ]] || { echo "stderr: $stderr (expected: $1)"; return 1; }
}

@test "an unknown flag is refused" {
    bad --steps 1 --frobnicate 3
    assert_refused "unknown flag '--frobnicate'"
}

@test "a flag without its value is refused" {
    bad --steps
    assert_refused "--steps needs a value"
}

@test "a stray positional argument is refused" {
    bad --steps 1 extra
    assert_refused "unexpected argument 'extra'"
}

@test "a non-numeric batch is refused with the valid range" {
    bad --batch eight
    assert_refused "--batch: 'eight' is not a whole number (valid: 1..1000000)"
}

@test "a zero batch is refused" {
    bad --batch 0
    assert_refused "--batch: 0 is out of range (valid: 1..1000000)"
}

@test "a negative number of steps is refused" {
    bad --steps -5
    assert_refused "--steps: -5 is out of range"
}

@test "a zero learning rate is refused" {
    bad --lr 0
    assert_refused "--lr: 0 is out of range"
}

@test "a learning rate of nan is refused" {
    bad --lr nan
    assert_refused "--lr: 'nan' is not a number"
}

@test "dmodel not divisible by heads is refused" {
    bad --dmodel 100 --heads 3
    assert_refused "--dmodel 100 is not divisible by --heads 3"
}

@test "zero layers are refused" {
    bad --layers 0
    assert_refused "--layers: 0 is out of range (valid: 1..256)"
}

@test "an unknown model preset is refused" {
    bad --model huge
    assert_refused "--model: unknown preset 'huge' (valid: tiny, small, medium, gpt2)"
}

@test "an unknown device is refused" {
    bad --device tpu
    assert_refused "--device: unknown device 'tpu' (valid: auto, cpu, cuda)"
}

@test "micro-batches that do not divide the batch are refused" {
    bad --batch 8 --micro 3
    assert_refused "--micro 3 does not divide --batch 8"
}

@test "--stop-after beyond --steps is refused" {
    bad --steps 5 --stop-after 6
    assert_refused "--stop-after 6 is beyond --steps 5"
}

@test "absurd sizes that would overflow are refused before allocating" {
    bad --batch 1000000 --seq 65536
    assert_refused "too large"
}

@test "a model larger than the machine's memory is refused cleanly" {
    bad --layers 256 --dmodel 16384 --heads 128 --seq 8 --batch 1
    assert_refused "the model needs about"
    assert_refused "more than this machine's"
}

@test "a sequence longer than the data allows is refused with the valid range" {
    printf 'only a few bytes of text here\n' > "$(scratch)/short.txt"
    bad --data "$(scratch)/short.txt" --seq 64
    assert_refused "--seq 64 is longer than the data allows"
    [[ "$stderr" == *"valid: --seq up to"* ]]
}

@test "a missing data file is refused" {
    bad --data /nonexistent/corpus.txt
    assert_refused "--data /nonexistent/corpus.txt: cannot open"
}

@test "an empty data file is refused" {
    : > "$(scratch)/empty.txt"
    bad --data "$(scratch)/empty.txt"
    assert_refused "the file is empty"
}

@test "an unreadable data file is refused" {
    if [ "$(id -u)" -eq 0 ]; then
        # root reads any file regardless of its mode: a directory cannot be read as text
        bad --data "$(scratch)"
        assert_refused "is a directory"
    else
        printf 'text\n%.0s' {1..200} > "$(scratch)/secret.txt"
        chmod 000 "$(scratch)/secret.txt"
        bad --data "$(scratch)/secret.txt"
        assert_refused "cannot open"
    fi
}

@test "an unwritable output directory is refused" {
    printf 'x' > "$(scratch)/file"
    run --separate-stderr timeout 1 "$TRAIN01" --device cpu --steps 1 --out "$(scratch)/file/sub"
    assert_refused "--out $(scratch)/file/sub: cannot create"
}

@test "a device memory budget that is too small is refused naming the tag, request and budget" {
    bad --device-mem-limit 1M
    assert_refused "out of device memory"
    [[ "$stderr" == *"device/"* ]]                 # the tag: space/category
    [[ "$stderr" == *"budget 1.00 MiB"* ]]
    [[ "$stderr" == *"allocating"* ]]
}

@test "a malformed device memory budget is refused" {
    bad --device-mem-limit lots
    assert_refused "--device-mem-limit: 'lots' is not a size"
}

@test "a device memory budget that fits lets the run finish" {
    run "$TRAIN01" --device cpu --steps 1 --sample 0 --device-mem-limit 64M --out "$(scratch)/fits"
    assert_success
}

@test "--device cuda without a GPU is refused" {
    "$BUILD/tests/gpu_probe" >/dev/null && skip "a GPU is visible"
    bad --device cuda
    assert_refused "--device cuda:"
}

@test "a foreign file given as checkpoint is refused" {
    printf 'this is not a checkpoint at all, just text\n' > "$(scratch)/foreign.bin"
    bad --resume "$(scratch)/foreign.bin"
    assert_refused "not a checkpoint of this course"
}

@test "a missing checkpoint is refused" {
    bad --resume "$(scratch)/nothing.bin"
    assert_refused "--resume $(scratch)/nothing.bin: cannot open"
}

@test "a loss that becomes NaN stops the run with exit status 3" {
    COURSE_FAULT_NAN_STEP=3 run --separate-stderr "$TRAIN01" --device cpu --steps 6 --sample 0 --out "$(scratch)/nan"
    assert_equal "$status" 3
    [[ "$stderr" == *"the loss became nan at step 3"* ]]
}

# ---- odd values ----

@test "a flag that takes no value, given one, is named (not a control byte)" {
    bad --steps 1 --quiet=1
    assert_refused "--quiet takes no value (got '--quiet=1'"
    bad --help=x
    assert_refused "--help takes no value (got '--help=x'"
}

@test "a seed with a leading space or sign is refused, not wrapped around" {
    bad --seed ' -5'
    assert_refused "--seed: ' -5' is not a whole number (valid: 0..2^64-1)"
    bad --seed -0
    assert_refused "--seed: -0 is out of range"
}

@test "a seed past 2^64-1 is refused as out of range, with the range; the largest is accepted" {
    bad --seed 18446744073709551616
    assert_refused "--seed: 18446744073709551616 is out of range (valid: 0..2^64-1)"
    bad --seed 18446744073709551615 --steps 1 --model tiny --batch 1
    assert_success
}

@test "data of 1 to 3 bytes is refused with a sensible minimum" {
    for n in 1 2 3; do
        head -c "$n" "$REPO/course.md" >"$(scratch)/tiny.txt"
        bad --data "$(scratch)/tiny.txt"
        assert_refused "$n bytes is too little to train on (valid: a file of at least 4 bytes)"
    done
}

@test "data too short for --seq gives the longest --seq the file allows" {
    head -c 21 "$REPO/course.md" >"$(scratch)/short.txt"
    bad --data "$(scratch)/short.txt" --seq 64
    assert_refused "(valid: --seq up to 9 for this file)"
}

@test "an absurd OMP_NUM_THREADS is refused with a message instead of crashing OpenMP" {
    OMP_NUM_THREADS=100000 bad --steps 1
    assert_refused "OMP_NUM_THREADS=100000 is not a thread count this program can use (valid: 1..1024)"
}

@test "a model that cannot fit host memory is refused before initialising it" {
    bad --dmodel 8192 --heads 1024 --layers 2 --steps 1
    assert_refused "the model needs about"
}

@test "04: a batch that does not split over the replicas blames the batch, not --micro" {
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 run --separate-stderr timeout 30 \
        mpirun --oversubscribe -np 4 "$REPO/04_pipeline/train" --pp 2 --dp 2 --batch 3 --steps 1 --out "$(scratch)/o"
    assert_equal "$status" 2
    [[ "$stderr" == *"error: --batch 3 does not divide over --dp 2 replicas (valid: a multiple of 2)"* ]]
}

@test "commbench names the flag of a bad size and refuses a stray argument" {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    run --separate-stderr timeout 30 mpirun --oversubscribe -np 1 "$REPO/02_data_parallel/commbench" --min-bytes -1
    assert_equal "$status" 2
    [[ "$stderr" == *"error: --min-bytes: '-1' is not a size"* ]]
    run --separate-stderr timeout 30 mpirun --oversubscribe -np 1 "$REPO/02_data_parallel/commbench" extra
    assert_equal "$status" 2
    [[ "$stderr" == *"error: unexpected argument 'extra'"* ]]
}

@test "an unknown precision is refused with the three valid names" {
    bad --precision fp8
    assert_refused "--precision: unknown precision 'fp8' (valid: fp32, bf16, fp16)"
}

@test "a zero loss scale is refused" {
    bad --precision fp16 --loss-scale 0
    assert_refused "--loss-scale: '0' is not a valid scale (valid: dynamic, or a number > 0 up to 16777216)"
}

@test "a negative loss scale is refused" {
    bad --precision fp16 --loss-scale -8
    assert_refused "--loss-scale: '-8' is not a valid scale"
}

@test "a non-numeric loss scale is refused" {
    bad --precision fp16 --loss-scale lots
    assert_refused "--loss-scale: 'lots' is not a valid scale"
}

@test "a loss scale with bf16 is refused: bf16 needs none" {
    bad --precision bf16 --loss-scale 1024
    assert_refused "--loss-scale applies to --precision fp16 only (this run is bf16"
}

@test "a loss scale with fp32 (the default) is refused" {
    bad --loss-scale dynamic
    assert_refused "--loss-scale applies to --precision fp16 only (this run is fp32"
}

@test "a loss-scale window with a fixed scale is refused" {
    bad --precision fp16 --loss-scale 128 --loss-scale-window 10
    assert_refused "--loss-scale-window applies to --loss-scale dynamic only"
}

@test "a zero loss-scale window is refused" {
    bad --precision fp16 --loss-scale-window 0
    assert_refused "--loss-scale-window: 0 is out of range (valid: 1..10000000)"
}

# bad_in PROGRAM FLAGS...: PROGRAM (a chapter folder) as a world of one rank, as bad() runs 01.
bad_in() {
    local program="$1"
    shift
    run --separate-stderr timeout 10 "$REPO/$program/train" --device cpu --steps 1 --out "$(scratch)/o" "$@"
}

@test "03 and 04 refuse the precision flags as 01 does: a loss scale with bf16 or fp32, a zero scale, an unknown precision" {
    for program in 03_model_parallel 04_pipeline; do
        bad_in "$program" --precision bf16 --loss-scale 1024
        assert_refused "--loss-scale applies to --precision fp16 only (this run is bf16"
        bad_in "$program" --loss-scale-window 10
        assert_refused "--loss-scale-window applies to --precision fp16 only (this run is fp32)"
        bad_in "$program" --precision fp16 --loss-scale 0
        assert_refused "--loss-scale: '0' is not a valid scale"
        bad_in "$program" --precision fp8
        assert_refused "--precision: unknown precision 'fp8' (valid: fp32, bf16, fp16)"
    done
}

# 06_offload/train without mpirun is a world of one rank.
bad06() {
    run --separate-stderr timeout 5 "$REPO/06_offload/train" --device cpu --sample 0 --quiet --out "$(scratch)/out" "$@"
}

@test "06: --dpu without --offload is refused" {
    bad06 --dpu
    assert_refused "--dpu needs --offload"
}

@test "06: --dpu-warmup without --dpu is refused, not ignored" {
    bad06 --offload --dpu-warmup 3
    assert_refused "--dpu-warmup needs --dpu"
    assert_equal "$stderr" "error: --dpu-warmup needs --dpu"
}

@test "06: a negative --dpu-warmup is refused with the valid range" {
    bad06 --offload --dpu --dpu-warmup -1
    assert_refused "--dpu-warmup: -1 is out of range (valid: 0..1000000)"
}

@test "06: --offload with --zero 3 is refused as unsupported, and so are stages 0 and 1" {
    bad06 --offload --zero 3
    assert_refused "--zero 3 with --offload is unsupported"
    bad06 --offload --zero 1
    assert_refused "--zero 1 with --offload is unsupported: chapter 06 offloads the stage-2 partitioning only (valid: --zero 2)"
}

@test "06: --pp x --dp that is not the world size is refused" {
    bad06 --offload --pp 2 --dp 1
    assert_refused "1 rank cannot hold 2 pipeline stages x --tp 1 x --dp 1 (valid: mpirun -np 2, world = pp x tp x dp)"
}

@test "a refusal counts one rank as one rank: 03's replicas, 04's stages" {
    run --separate-stderr timeout 5 "$REPO/03_model_parallel/train" --device cpu --dp 2 --out "$(scratch)/out"
    assert_refused "a job of 1 rank cannot hold --dp 2 replicas (valid: world = dp x model-parallel ranks)"
    run --separate-stderr timeout 5 "$REPO/04_pipeline/train" --device cpu --tp 2 --pp 1 --out "$(scratch)/out"
    assert_refused "1 rank cannot hold 1 pipeline stage x --tp 2 x --dp 1 (valid: mpirun -np 2, world = pp x tp x dp)"
}

@test "grade.sh refuses an unknown exercise listing the valid ids, and an empty name in ONLY instead of grading all" {
    local ids
    ids="$(cd "$REPO/tests/grade" && ls *.bats | sed 's/\.bats$//' | paste -sd, - | sed 's/,/, /g')"
    [[ "$ids" == "01.1, 01.2, "* ]]
    run --separate-stderr timeout 5 "$REPO/common/scripts/grade.sh" bogus
    assert_equal "$status" 2
    assert_equal "$stderr" "grade.sh: no exercise 'bogus' (valid: $ids)"
    for only in ",," "" "01.1,,01.2" "01.1,"; do
        run --separate-stderr timeout 5 "$REPO/common/scripts/grade.sh" --only "$only"
        assert_equal "$status" 2
        assert_equal "$output" ""
        assert_equal "$stderr" "grade.sh: ONLY='$only' has an empty exercise name (valid: comma-separated ids of $ids)"
    done
    run --separate-stderr timeout 5 "$REPO/common/scripts/grade.sh" --only "01.1, bogus"
    assert_equal "$status" 2
    assert_equal "$stderr" "grade.sh: no exercise 'bogus' (valid: $ids)"
    # make grade hands ONLY over as it was typed, empty names and all; without ONLY, every exercise
    run timeout 10 make -s -n -C "$REPO" grade ONLY=,,
    assert_line "common/scripts/grade.sh --only ',,'"
    run timeout 10 make -s -n -C "$REPO" grade
    assert_line --regexp "^common/scripts/grade.sh *$"
}
