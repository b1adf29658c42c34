#!/usr/bin/env python3
"""tiktoken_check.py: common/tokenize against tiktoken's gpt2 encoding, token for token.

    python3 tests/tiktoken_check.py VOCAB_DIR [--text-out FILE]

The text (over 1 MB, the same every run) is course.md, the course's C sources, and
generated pieces a tokenizer gets wrong first: runs of every kind of white space,
contractions (and near misses: upper case, doubled quotes), numbers in several scripts,
emoji (with joiners, skin tones, flags), Chinese, Japanese, Korean, Arabic, Hebrew,
Devanagari and Thai (whose vowel signs are marks, neither letters nor numbers),
accented Latin in both Unicode forms, and runs of punctuation.

tiktoken cannot download here: its Encoding is built from VOCAB_DIR's encoder.json and
vocab.bpe by tiktoken's own loader (data_gym_to_mergeable_bpe_ranks, which checks the
SHA-256 sums tiktoken's gpt2 names), with tiktoken's own gpt2 pattern and special token.
Exit 0 when every token is equal (and common/tokenize decodes tiktoken's tokens back to
the text), 1 naming the first difference, 2 when tiktoken is not importable.
"""
import os
import random
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reference_encoding(vocab_dir):
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # no cache: read the local files themselves
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext import openai_public

    # the sums tiktoken's gpt2() passes for the same two files
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=os.path.join(vocab_dir, "vocab.bpe"),
        encoder_json_file=os.path.join(vocab_dir, "encoder.json"),
        vocab_bpe_hash="1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
        encoder_json_hash="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    )
    return tiktoken.Encoding(name="gpt2-local", pat_str=openai_public.r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


def chars(rng, first, last, n):
    return "".join(chr(rng.randint(first, last)) for _ in range(n))


def generated(rng):
    """One generated piece of text, of a kind drawn at random."""
    spaces = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2003", "\u202f", "\x0b", "\x0c", "\x85", "\u2028"]
    words = ["the", "cat", "GPU", "rank", "Zürich", "naïve", "café", "straße", "x", "I", "A100", "fp16"]
    kind = rng.randrange(12)
    if kind == 0:  # white space runs, before a word, before punctuation, or alone
        run = "".join(rng.choice(spaces) for _ in range(rng.randint(1, 40)))
        return run + rng.choice(["", "word", "!", "7", " x", "\n"])
    if kind == 1:  # contractions and near misses
        forms = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "''s", "' s", "'x", "'", "'ve'll", "'dd"]
        return rng.choice(words) + rng.choice(forms) + rng.choice([" ", "", "\n", " 're", "'"])
    if kind == 2:  # numbers: ASCII, grouped, decimal, and other scripts' digits and numerals
        digits = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "²³¹", "ⅠⅡⅢⅫ", "½¾⅓"]
        d = rng.choice(digits)
        n = "".join(rng.choice(d) for _ in range(rng.randint(1, 30)))
        return rng.choice(["", " ", "$", "-", "v", "x"]) + n + rng.choice(["", ".5", ",000", "%", " km", "th"])
    if kind == 3:  # emoji: single, with skin tones, joined families, flags, keycaps
        emoji = ["😀", "🚀", "🔥", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🇯🇵", "1️⃣", "❤️", "🧑🏿‍💻", "🤖", "🐍"]
        return "".join(rng.choice(emoji) for _ in range(rng.randint(1, 6))) + rng.choice(["", " ", "!", "ok"])
    if kind == 4:  # Chinese, with its punctuation
        return chars(rng, 0x4E00, 0x9FA5, rng.randint(1, 30)) + rng.choice(["，", "。", "！", "？", "、", " "])
    if kind == 5:  # Arabic letters with their vowel marks (category Mn) and punctuation
        text = "".join(chr(rng.randint(0x0621, 0x063A)) + rng.choice(["", chr(rng.randint(0x064B, 0x0652))])
                       for _ in range(rng.randint(1, 20)))
        return text + rng.choice([" ", "، ", "؟", "\n"])
    if kind == 6:  # Devanagari: consonants, vowel signs (Mc, Mn), virama, danda
        text = "".join(chr(rng.randint(0x0915, 0x0939)) + rng.choice(["", chr(rng.randint(0x093E, 0x094D))])
                       for _ in range(rng.randint(1, 20)))
        return text + rng.choice([" ", "। ", "\n"])
    if kind == 7:  # Japanese kana, Korean Hangul, Hebrew, Thai (vowel marks again)
        first, last = rng.choice([(0x3041, 0x3096), (0x30A1, 0x30FA), (0xAC00, 0xD7A3), (0x05D0, 0x05EA),
                                  (0x0E01, 0x0E3A)])
        return chars(rng, first, last, rng.randint(1, 20)) + rng.choice([" ", "", "\n"])
    if kind == 8:  # Greek, Cyrillic, accented Latin composed and decomposed
        base = rng.choice(["αβγδε λόγος", "Привет мир", "Ελληνικά", "e\u0301te\u0301", "ﬁnancial", "ǅemal"])
        return base + rng.choice([" ", ".", "\n"])
    if kind == 9:  # punctuation runs and code-like symbols
        return "".join(rng.choice("!?.,;:-_=+*/\\|<>()[]{}@#$%^&~`\"'") for _ in range(rng.randint(1, 12))) + \
            rng.choice(["", " ", "a", "1"])
    if kind == 10:  # the special token's text is ordinary text here
        return rng.choice(["<|endoftext|>", " <|endoftext|>\n", "<|endof"])
    return " ".join(rng.choice(words) for _ in range(rng.randint(1, 8))) + rng.choice([". ", "\n", ", ", "? "])


def test_text():
    parts = []
    with open(os.path.join(REPO, "course.md"), encoding="utf-8") as f:
        parts.append(f.read())
    code = []
    for top in ["common", "01_single_gpu", "04_pipeline"]:
        for dirpath, _, files in sorted(os.walk(os.path.join(REPO, top))):
            for name in sorted(files):
                if name.endswith((".c", ".h", ".cu")):
                    with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                        code.append(f.read())
    parts.append("".join(code)[:400_000])
    rng = random.Random(39)
    pieces, size = [], 0
    while size < 400_000:
        piece = generated(rng)
        pieces.append(piece)
        size += len(piece.encode("utf-8"))
    parts.append("".join(pieces))
    return "".join(parts)


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        print("usage: tiktoken_check.py VOCAB_DIR [--text-out FILE]", file=sys.stderr)
        return 2
    vocab_dir = args[0]
    try:
        enc = reference_encoding(vocab_dir)
    except ImportError:
        print("tiktoken is not importable: not compared (make tokenizer-check installs it in a virtual environment)")
        return 2
    text = test_text()
    data = text.encode("utf-8")
    if "--text-out" in args:
        with open(args[args.index("--text-out") + 1], "wb") as f:
            f.write(data)
    reference = enc.encode_ordinary(text)
    tool = os.path.join(REPO, "common", "tokenize")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "text")
        with open(path, "wb") as f:
            f.write(data)
        out = subprocess.run([tool, "encode", path, "--vocab-dir", vocab_dir], capture_output=True, check=True)
        ours = [int(x) for x in out.stdout.split()]
        ids = os.path.join(tmp, "ids")
        with open(ids, "w") as f:
            f.write("\n".join(map(str, reference)) + "\n")
        back = subprocess.run([tool, "decode", ids, "--vocab-dir", vocab_dir], capture_output=True, check=True).stdout
    for i, (a, b) in enumerate(zip(ours, reference)):
        if a != b:
            at = len(enc.decode_bytes(reference[:i]))
            print(f"token {i} differs: common/tokenize {a} {enc.decode_bytes([a])!r}, tiktoken {b} "
                  f"{enc.decode_bytes([b])!r}, at byte {at}: {data[max(0, at - 20):at + 20]!r}")
            return 1
    if len(ours) != len(reference):
        print(f"common/tokenize gave {len(ours)} tokens, tiktoken {len(reference)}")
        return 1
    if back != data:
        print("common/tokenize decode of tiktoken's tokens is not the text")
        return 1
    print(f"common/tokenize equals tiktoken's gpt2: {len(ours)} tokens of {len(data)} bytes, token for token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
