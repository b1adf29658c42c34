#!/usr/bin/env bats
# The head and the loss at a large vocabulary (model.h, "The head in pieces";
# tensor_parallel.h, "The vocabulary split over the tp ranks"). The logits,
# their probabilities and their gradient are the largest buffers of a step at
# GPT-2's 50257 tokens. --loss-chunks K computes the head on a K-th of the
# tokens at a time, in every chapter, with the losses of the whole head; under
# tensor parallelism wte and the head are split by vocabulary rows and the
# loss is made from the logit slices with small collectives, with 01's losses.
# memory.csv shows what each saves, by the formula.

load helpers

export OMP_NUM_THREADS=1
# 4 blocks, 4 steps of 8 sequences of 64 bytes, on a private copy of the corpus.
FLAGS="--device cpu --layers 4 --steps 4 --batch 8 --sample 0 --quiet --data $BATS_FILE_TMPDIR/corpus.txt"

setup_file() {
    cp "$REPO/course.md" "$BATS_FILE_TMPDIR/corpus.txt"
    "$TRAIN01" $FLAGS --out "$BATS_FILE_TMPDIR/ref" >/dev/null
}

REF="$BATS_FILE_TMPDIR/ref"

# peak BYTES of memory.csv's row for device CATEGORY of rank 0 in DIR
peak() {
    awk -F, -v c="$2" '$1 == 0 && $2 == "device" && $3 == c { print $4 }' "$1/memory.csv"
}

@test "--loss-chunks 4 gives 01's losses to 1e-6 in 01, 02 on 2 ranks, and 04 on 2 stages (1F1B and ZB-H1)" {
    "$TRAIN01" $FLAGS --loss-chunks 4 --out "$(scratch)/01" >/dev/null
    assert_losses_within "$REF" "$(scratch)/01" 4 1e-6
    mpirun_np 2 "$TRAIN02" $FLAGS --loss-chunks 4 --out "$(scratch)/02" >/dev/null
    assert_losses_within "$REF" "$(scratch)/02" 4 1e-6
    for schedule in 1f1b zb-h1; do
        mpirun_np 2 "$TRAIN04" $FLAGS --pp 2 --micro 2 --schedule $schedule --loss-chunks 4 \
            --out "$(scratch)/04-$schedule" >/dev/null
        assert_losses_within "$REF" "$(scratch)/04-$schedule" 4 1e-6
    done
}

@test "--loss-chunks K: memory.csv's activations shrink by the logits and probabilities, the workspace by their gradient, (1 - 1/K) of each" {
    local flags="$FLAGS --steps 1 --batch 2 --vocab 50257 --tie-embeddings"
    "$TRAIN01" $flags --out "$(scratch)/whole" >/dev/null
    "$TRAIN01" $flags --loss-chunks 8 --out "$(scratch)/k8" >/dev/null
    # B x T = 128 tokens, 50304 padded columns, 4 bytes: 25,755,648 bytes per buffer
    local buffer=$((2 * 64 * 50304 * 4))
    assert_equal "$(($(peak "$(scratch)/whole" activations) - $(peak "$(scratch)/k8" activations)))" \
        "$((2 * buffer * 7 / 8))"
    assert_equal "$(($(peak "$(scratch)/whole" workspace) - $(peak "$(scratch)/k8" workspace)))" \
        "$((buffer * 7 / 8))"
}

@test "--loss-chunks that does not divide --seq is refused in one line naming the valid divisors" {
    run --separate-stderr "$TRAIN01" $FLAGS --loss-chunks 3 --out "$(scratch)/o"
    assert_failure 2
    assert_equal "$stderr" "error: --loss-chunks 3 does not divide --seq 64: the head runs on equal pieces of every micro-batch's tokens (valid: a divisor of 64, 1..64)"
    [ ! -e "$(scratch)/o/steps.csv" ]
}
