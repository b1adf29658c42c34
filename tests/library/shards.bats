#!/usr/bin/env bats
# Token shards as --data (common/model/data.h, token_shard.h): llm.c's format read by every
# chapter, batches by the same (seed, step) rule as bytes, so 02 on 2 ranks gives 01's
# losses; unsound shards and a --vocab too small for their ids are refused in one line;
# samples of GPT-2 tokens are decoded to text.

load ../helpers

FLAGS="--device cpu --steps 4 --batch 4 --sample 0 --quiet --vocab 2048"

# shard FILE MAGIC VERSION COUNT TOKENS: a shard with that header and TOKENS tokens of
# deterministic pseudo-text (ids below 2048, frequent ones more often; SEED=N for other text)
shard() {
    python3 - "$@" <<'PY'
import random, struct, sys
path, magic, version, count, n = sys.argv[1], *map(int, sys.argv[2:])
r = random.Random(int(__import__('os').environ.get('SEED', '39')))
tokens = [min(int(r.paretovariate(1.2)) * 7 % 2048, 2047) for _ in range(n)]
open(path, "wb").write(struct.pack("<256i", magic, version, count, *[0] * 253) + struct.pack("<%dH" % n, *tokens))
PY
}

@test "a token shard trains in 01, in 02 on 2 ranks and in 04 on 2 stages with the same losses" {
    local dir
    dir="$(scratch)"
    shard "$dir/s.bin" 20240520 1 20000 20000
    "$TRAIN01" $FLAGS --data "$dir/s.bin" --out "$dir/ref" >/dev/null
    OMP_NUM_THREADS=1 mpirun_np 2 "$TRAIN02" $FLAGS --data "$dir/s.bin" --out "$dir/dp2" >/dev/null
    assert_losses_match "$dir/ref" "$dir/dp2" 4
    OMP_NUM_THREADS=1 mpirun_np 2 "$REPO/04_pipeline/train" $FLAGS --pp 2 --data "$dir/s.bin" --out "$dir/pp2" >/dev/null
    assert_losses_match "$dir/ref" "$dir/pp2" 4
    # and the data are the shard's tokens: the same run on another shard gives other losses
    SEED=40 shard "$dir/t.bin" 20240520 1 20000 20000
    "$TRAIN01" $FLAGS --data "$dir/t.bin" --out "$dir/other" >/dev/null
    [ "$(csv_column "$dir/ref/steps.csv" loss | head -1)" != "$(csv_column "$dir/other/steps.csv" loss | head -1)" ]
}

@test "a shard whose ids pass --vocab is refused in one line naming the --vocab it needs" {
    shard "$(scratch)/s.bin" 20240520 1 20000 20000
    largest="$(python3 -c 'import struct, sys; d = open(sys.argv[1], "rb").read()[1024:]; print(max(struct.unpack("<%dH" % (len(d) // 2), d)))' "$(scratch)/s.bin")"
    [ "$largest" -gt 256 ]
    run -2 "$TRAIN01" --device cpu --steps 1 --sample 0 --quiet --data "$(scratch)/s.bin" --out "$(scratch)/o"
    assert_output "error: --data $(scratch)/s.bin: holds token id $largest, past --vocab 256 (valid: --vocab $((largest + 1)) or more)"
    run "$TRAIN01" --device cpu --steps 1 --sample 0 --quiet --vocab $((largest + 1)) --data "$(scratch)/s.bin" --out "$(scratch)/o"
    assert_success
}

@test "unsound shards are refused in one line: another magic, another version, a count that is not the file's, too short" {
    local dir
    dir="$(scratch)"
    train() { run -2 "$TRAIN01" $FLAGS --data "$1" --out "$dir/o"; }
    shard "$dir/magic" 20240521 1 5000 5000
    train "$dir/magic"
    assert_output "error: --data $dir/magic: laid out as a token shard but its magic is 20240521 (valid: 20240520)"
    shard "$dir/version" 20240520 2 5000 5000
    train "$dir/version"
    assert_output "error: --data $dir/version: token shard version 2 (valid: 1)"
    shard "$dir/truncated" 20240520 1 5000 4000
    train "$dir/truncated"
    assert_output "error: --data $dir/truncated: the header says 5000 tokens, the file holds 8000 bytes of tokens (4000 tokens)"
    shard "$dir/longer" 20240520 1 5000 5001
    train "$dir/longer"
    assert_output "error: --data $dir/longer: the header says 5000 tokens, the file holds 10002 bytes of tokens (5001 tokens)"
    shard "$dir/few" 20240520 1 100 100
    train "$dir/few"
    assert_output "error: --seq 64 is longer than the data allows: $dir/few has 100 tokens, training and validation need 130 (valid: --seq up to 49 for this shard)"
}

@test "a sample of GPT-2 tokens is decoded to text, its prompt a piece of the text the shard was made of" {
    "$REPO/common/scripts/get-gpt2-vocab.sh" >/dev/null 2>&1 ||
        skip "GPT-2's vocabulary is not available (common/scripts/get-gpt2-vocab.sh): not decoded"
    local dir
    dir="$(scratch)"
    "$REPO/common/tokenize" encode "$REPO/course.md" --shard "$dir/course.bin"
    run "$TRAIN01" --device cpu --steps 1 --batch 2 --sample 4 --vocab 50257 --data "$dir/course.bin" --out "$dir/o"
    assert_success
    sample="$(echo "$output" | grep '^sample: ')"
    # the prompt is the shard's text decoded: split at the written newlines (\n) and at '|' (the prompt's
    # end, and course.md's tables), some piece of 16 characters or more stands in course.md as it is
    local piece found=0
    while IFS= read -r piece; do
        [ ${#piece} -ge 16 ] && grep -qF -- "$piece" "$REPO/course.md" && found=1
    done < <(sed 's/^sample: //; s/\\n/\n/g; s/|/\n/g' <<<"$sample")
    [ "$found" = 1 ]
}
