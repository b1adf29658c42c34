#!/usr/bin/env bats
# The head and the loss at a large vocabulary (model.h, "The head in pieces";
# tensor_parallel.h, "The vocabulary split over the tp ranks"). The logits,
# their probabilities and their gradient are the largest buffers of a step at
# GPT-2's 50257 tokens. --loss-chunks K computes the head on a K-th of the
# tokens at a time, in every chapter, with the losses of the whole head; under
# tensor parallelism wte and the head are split by vocabulary rows and the
# loss is made from the logit slices with small collectives, with 01's losses.
# memory.csv shows what each saves, by the formula.

load ../helpers

export OMP_NUM_THREADS=1
# 4 blocks, 4 steps of 8 sequences of 64 bytes, on a private copy of the corpus.
FLAGS="--device cpu --layers 4 --steps 4 --batch 8 --sample 0 --quiet --data $BATS_FILE_TMPDIR/corpus.txt"

setup_file() {
    cp "$REPO/course.md" "$BATS_FILE_TMPDIR/corpus.txt"
    "$TRAIN01" $FLAGS --out "$BATS_FILE_TMPDIR/ref" >/dev/null
}

REF="$BATS_FILE_TMPDIR/ref"

# peak DIR CATEGORY: memory.csv's peak bytes of the device CATEGORY on rank 0 in DIR;
# peak_of DIR RANK CATEGORY: the same on RANK
peak() { peak_of "$1" 0 "$2"; }
peak_of() {
    awk -F, -v r="$2" -v c="$3" '$1 == r && $2 == "device" && $3 == c { print $4 }' "$1/memory.csv"
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

@test "--loss-chunks 8 samples the text of the whole head, where a piece other than the last holds the row (03 --sp, 03 --tp 2 --cp 2, and 01)" {
    local flags="${FLAGS/--sample 0/--sample 12} --batch 2 --steps 2"
    for layout in "2 --mp tensor --sp" "4 --mp tensor --tp 2 --cp 2"; do
        local np="${layout%% *}" name="${layout// /}"
        mpirun_np $np "$TRAIN03" $flags ${layout#* } --out "$(scratch)/$name" | grep '^sample:' >"$(scratch)/$name.txt"
        mpirun_np $np "$TRAIN03" $flags ${layout#* } --loss-chunks 8 --out "$(scratch)/$name-k8" |
            grep '^sample:' >"$(scratch)/$name-k8.txt"
        [ -s "$(scratch)/$name.txt" ]
        assert_equal "$(cat "$(scratch)/$name-k8.txt")" "$(cat "$(scratch)/$name.txt")"
    done
    "$TRAIN01" $flags --batch 1 --out "$(scratch)/01" | grep '^sample:' >"$(scratch)/01.txt"
    "$TRAIN01" $flags --batch 1 --loss-chunks 8 --out "$(scratch)/01-k8" | grep '^sample:' >"$(scratch)/01-k8.txt"
    [ -s "$(scratch)/01.txt" ]
    assert_equal "$(cat "$(scratch)/01-k8.txt")" "$(cat "$(scratch)/01.txt")"
}

@test "--loss-chunks that does not divide --seq is refused in one line naming the valid divisors" {
    run --separate-stderr "$TRAIN01" $FLAGS --loss-chunks 3 --out "$(scratch)/o"
    assert_failure 2
    assert_equal "$stderr" "error: --loss-chunks 3 does not divide --seq 64: the head runs on equal pieces of every micro-batch's tokens (valid: a divisor of 64, 1..64)"
    [ ! -e "$(scratch)/o/steps.csv" ]
}

# GPT-2's vocabulary on a small model: 2 blocks, 3 steps of 4 sequences.
GPT2="--device cpu --layers 2 --steps 3 --batch 4 --sample 0 --quiet --data $BATS_FILE_TMPDIR/corpus.txt --vocab 50257"

@test "vocabulary split over tp ranks: 03 --mp tensor on 2 ranks and 04 --pp 2 --tp 2 (1F1B, ZB-H1) give 01's losses at --vocab 50257, tied and untied" {
    for tied in --tie-embeddings ""; do
        local d="$(scratch)/v${tied:+tied}"
        mkdir -p "$d"
        "$TRAIN01" $GPT2 $tied --out "$d/01" >/dev/null
        mpirun_np 2 "$TRAIN03" $GPT2 $tied --mp tensor --out "$d/03" >/dev/null
        assert_losses_match "$d/01" "$d/03" 3
        for schedule in 1f1b zb-h1; do
            mpirun_np 4 "$TRAIN04" $GPT2 $tied --pp 2 --tp 2 --micro 2 --schedule $schedule --out "$d/04-$schedule" >/dev/null
            assert_losses_match "$d/01" "$d/04-$schedule" 3
        done
    done
}

@test "vocabulary split: each of tp ranks holds Vp/tp rows of wte and the head and 1/tp of the logits, probabilities and their gradient, a K-th of that with --loss-chunks K (memory.csv)" {
    local d="$(scratch)" flags="$GPT2 --steps 1 --tie-embeddings"
    for tp in 2 4; do
        mpirun_np $tp "$TRAIN03" $flags --mp tensor --out "$d/tp$tp" >/dev/null
        mpirun_np $tp "$TRAIN03" $flags --mp tensor --loss-chunks 4 --out "$d/tp$tp-k4" >/dev/null
        mpirun_np $tp "$TRAIN03" ${flags/--vocab 50257/--vocab 256} --mp tensor --out "$d/tp$tp-bytes" >/dev/null
        # against the byte vocabulary (256 rows, the same model otherwise): N = 4 x 64 tokens,
        # 50304 - 256 more columns, 1/tp of them on each rank, 4 bytes
        local N=256 extra=$(((50304 - 256) / tp * 4))
        for r in $(seq 0 $((tp - 1))); do
            assert_equal "$(($(peak_of "$d/tp$tp" $r activations) - $(peak_of "$d/tp$tp-bytes" $r activations)))" \
                "$((2 * N * extra))"
            assert_equal "$(($(peak_of "$d/tp$tp" $r workspace) - $(peak_of "$d/tp$tp-bytes" $r workspace)))" \
                "$((N * extra))"
            # --loss-chunks 4 keeps a quarter of them
            assert_equal "$(($(peak_of "$d/tp$tp" $r activations) - $(peak_of "$d/tp$tp-k4" $r activations)))" \
                "$((2 * N * 50304 / tp * 4 * 3 / 4))"
            # wte (tied: the head reads it): 50304 / tp rows of 64
            assert_equal "$(($(peak_of "$d/tp$tp" $r params) - $(peak_of "$d/tp$tp-bytes" $r params)))" \
                "$((extra * 64))"
        done
    done
}

@test "--tp that does not divide the padded vocabulary is refused in one line naming the rule" {
    run --separate-stderr bash -c "$(declare -f mpirun_np); mpirun_np 3 '$TRAIN03' $FLAGS --mp tensor --heads 3 --dmodel 48 --out '$(scratch)/o'"
    assert_failure 2
    [[ "$stderr" == *"error: --tp 3 does not divide the padded vocabulary of --vocab 256 = 256 rows: every rank holds an equal share of wte and the head (valid: a --tp dividing 256, or a --vocab whose multiple of 128 it divides)"* ]]
    [ ! -e "$(scratch)/o/steps.csv" ]
}
