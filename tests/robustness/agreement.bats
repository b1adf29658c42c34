#!/usr/bin/env bats
# Ranks that disagree: every program compares, across the world, its whole
# effective configuration (every flag, the data file's size and checksum, the
# checkpoint's identity, the build) before any collective of training. A
# mismatch ends the job at once with exit 2 and one message naming the flag,
# its values and the ranks: no hang, no crash, no silently wrong training.
# tests/by_rank gives rank 0 one set of flags and the other ranks another.

load ../helpers

setup() {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

# disagree PROGRAM NP 'RANK0 FLAGS' 'OTHER FLAGS' FLAG [FLAGS FOR ALL...]
disagree() {
    local program="$1" np="$2" rank0="$3" others="$4"
    shift 4
    run --separate-stderr timeout 30 mpirun --oversubscribe -np "$np" "$REPO/tests/by_rank" \
        "$REPO/$program" "$rank0" "$others" --sample 0 --quiet --out "$(scratch)/out" "$@"
}

# Exit 2, exactly one error line naming $1, nothing crashed.
assert_disagreement() {
    echo "status $status; stderr: $stderr"
    assert_equal "$status" 2
    assert_equal "$(printf '%s\n' "$stderr" | grep -c '^error:')" 1
    [[ "$stderr" == *"error: the ranks disagree on $1:"* ]]
    [[ "$stderr$output" != *Segmentation* && "$stderr$output" != *"double free"* && "$stderr$output" != *signal* ]]
}

@test "02: ranks given different --steps stop at once, naming the flag and the ranks" {
    disagree 02_data_parallel/train 3 "--steps 3" "--steps 5" --batch 6
    assert_disagreement --steps
    [[ "$stderr" == *"'3' on rank 0, '5' on ranks 1-2"* ]]
}

@test "02: ranks given different --allreduce stop at once" {
    disagree 02_data_parallel/train 2 "--allreduce ring" "--allreduce library" --steps 2
    assert_disagreement --allreduce
}

@test "02: ranks given different --check-replicas stop at once" {
    disagree 02_data_parallel/train 2 "--check-replicas 1" "--check-replicas 0" --steps 2
    assert_disagreement --check-replicas
}

@test "02: ranks given different --stop-after stop at once" {
    disagree 02_data_parallel/train 2 "--stop-after 2" "--stop-after 3" --steps 4
    assert_disagreement --stop-after
}

@test "02: --resume on rank 0 only stops at once" {
    "$TRAIN01" --steps 4 --stop-after 2 --save "$(scratch)/ck" --sample 0 --quiet --out "$(scratch)/ref" >/dev/null
    disagree 02_data_parallel/train 2 "--resume $(scratch)/ck" "" --steps 4
    assert_disagreement --resume
}

@test "02: ranks given different --dp-mode stop at once (it used to crash)" {
    disagree 02_data_parallel/train 2 "--dp-mode naive" "--dp-mode flat" --steps 2
    assert_disagreement --dp-mode
}

@test "02: ranks given different --model presets stop at once (it used to crash)" {
    disagree 02_data_parallel/train 3 "--model small" "--model tiny" --steps 2 --batch 6
    assert_disagreement --model
}

@test "02: ranks given different --batch stop at once (it used to train wrong)" {
    disagree 02_data_parallel/train 2 "--batch 8" "--batch 4" --steps 2
    assert_disagreement --batch
}

@test "02: ranks given different --seed stop at once (it used to train wrong)" {
    disagree 02_data_parallel/train 2 "--seed 1" "--seed 2" --steps 2 --check-replicas 1
    assert_disagreement --seed
}

@test "02: ranks given different --lr stop at once" {
    disagree 02_data_parallel/train 2 "--lr 0.01" "--lr 0.001" --steps 2
    assert_disagreement --lr
}

@test "02: ranks reading different data stop at once, naming the file" {
    head -c 20000 "$REPO/course.md" >"$(scratch)/a.txt"
    disagree 02_data_parallel/train 2 "--data $(scratch)/a.txt" "" --steps 2
    assert_disagreement --data
}

@test "03: ranks given different --steps stop at once" {
    disagree 03_model_parallel/train 2 "--steps 3" "--steps 5"
    assert_disagreement --steps
}

@test "03: ranks given different --mp stop at once" {
    disagree 03_model_parallel/train 2 "--mp tensor" "--mp layer" --steps 2
    assert_disagreement --mp
}

@test "04: ranks given different --steps stop at once" {
    disagree 04_pipeline/train 2 "--steps 3" "--steps 5"
    assert_disagreement --steps
}

@test "04: ranks given different --micro stop at once" {
    disagree 04_pipeline/train 2 "--micro 2" "--micro 1" --steps 2
    assert_disagreement --micro
}

@test "04: --print-schedule on rank 0 only stops at once" {
    disagree 04_pipeline/train 2 "--print-schedule" "" --steps 2
    assert_disagreement --print-schedule
}

@test "04: ranks given different --split stop at once (it used to train)" {
    disagree 04_pipeline/train 2 "--split 2,1" "--split 1,2" --steps 2 --layers 3
    assert_disagreement --split
}

@test "ranks given different --precision are told the flag and both values, not 'which files they read'" {
    disagree 02_data_parallel/train 2 "--precision fp32" "--precision fp16" --steps 2
    assert_disagreement --precision
    [[ "$stderr" == *"error: the ranks disagree on --precision: 'fp32' on rank 0, 'fp16' on rank 1 (valid: the same flags and files on every rank)"* ]]
    disagree 05_zero/train 2 "--precision fp16 --loss-scale 1024" "--precision fp16" --steps 2
    assert_disagreement --loss-scale
    [[ "$stderr" == *"'1024' on rank 0, 'dynamic' on rank 1"* ]]
}

@test "06: --pp 2 and --pp 2 --dp 2 are the same layout on 4 ranks: they agree and train" {
    disagree 06_offload/train 4 "--pp 2" "--pp 2 --dp 2" --offload --steps 1 --batch 4
    assert_success
    assert_output --partial "offload: 4 ranks = 2 stages x 2 replicas"
    # --pp 1 leaves every rank to dp (05's layout rule): the record's first difference is --dp
    disagree 06_offload/train 4 "--pp 2" "--pp 1" --offload --steps 1 --batch 4
    assert_equal "$status" 2
    [[ "$stderr" == *"error: the ranks disagree on --dp: '2' on rank 0, '4' on ranks 1-3"* ]]
    disagree 06_offload/train 4 "--pp 2 --dp 2" "--pp 1 --dp 2" --offload --steps 1 --batch 4
    assert_equal "$status" 2
    [[ "$stderr" == *"error: the ranks disagree on --pp: '2' on rank 0, '1' on ranks 1-3"* ]]
}

@test "04: --dp 2 and --pp 2 --dp 2 are the same layout on 4 ranks: they agree and train" {
    disagree 04_pipeline/train 4 "--dp 2" "--pp 2 --dp 2" --steps 1 --batch 4
    assert_success
}

@test "03: --mp tensor with and without --tp 2 on 2 ranks is the same layout: they agree and train" {
    disagree 03_model_parallel/train 2 "--mp tensor" "--mp tensor --tp 2" --steps 1
    assert_success
}

@test "an error on one rank only is printed once, naming the rank" {
    disagree 02_data_parallel/train 3 "" "--data /nonexistent/file" --steps 2 --batch 6
    assert_equal "$status" 2
    assert_equal "$(printf '%s\n' "$stderr" | grep -c '^error:')" 1
    [[ "$stderr" == *"the ranks disagree on --data"* ]]
}

# ---- the command line under mpirun ----

@test "--help under mpirun prints the help once and exits 0" {
    for program in 02_data_parallel/train 03_model_parallel/train 04_pipeline/train; do
        run --separate-stderr timeout 30 mpirun --oversubscribe -np 3 "$REPO/$program" --help
        assert_equal "$status" 0
        assert_equal "$(printf '%s\n' "$output" | grep -c '^usage:')" 1
        assert_equal "$stderr" ""
    done
}

@test "a bad flag on every rank is printed once, with exit 2 and no MPI_Abort" {
    for program in 02_data_parallel/train 03_model_parallel/train 04_pipeline/train 02_data_parallel/commbench; do
        run --separate-stderr timeout 30 mpirun --oversubscribe -np 3 "$REPO/$program" --frobnicate
        echo "$program: $stderr"
        assert_equal "$status" 2
        assert_equal "$(printf '%s\n' "$stderr" | grep -c '^error:')" 1
        [[ "$stderr" == *"error: unknown flag '--frobnicate'"* ]]
        [[ "$stderr" != *MPI_ABORT* ]]
    done
}

@test "a layout error seen by every rank is printed once" {
    run --separate-stderr timeout 30 mpirun --oversubscribe -np 3 "$REPO/02_data_parallel/train" --batch 8 --steps 1
    assert_equal "$status" 2
    assert_equal "$(printf '%s\n' "$stderr" | grep -c '^error:')" 1
    [[ "$stderr" == *"--batch 8 is not divisible by 3 ranks"* ]]
}

@test "commbench: ranks given different flags stop at once" {
    run --separate-stderr timeout 30 mpirun --oversubscribe -np 2 "$REPO/tests/by_rank" \
        "$REPO/02_data_parallel/commbench" "--max-bytes 64K" "--max-bytes 16K"
    assert_equal "$status" 2
    [[ "$stderr" == *"the ranks disagree on --max-bytes"* ]]
}
