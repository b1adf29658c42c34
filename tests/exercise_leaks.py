#!/usr/bin/env python3
"""exercise_leaks.py: does a student copy still hold an exercise's answer?

    python3 tests/exercise_leaks.py FULL STUDENT

FULL is the repository with the reference solutions, STUDENT a copy made by
`make exercises` (common/python/exercises.py). A stub is worth nothing if the answer
survives elsewhere in the copy: the same formula in another backend, the
same loop at another SIMD width, a test or the course text that spells a
line of it out. So, for every exercise region of FULL, this takes the
statements of the answer and looks for each of them in every file of
STUDENT, after a normalisation that a renaming would not get past:

  - comments dropped, whitespace removed, the text cut into statements at
    ; { and } (a statement over several lines is found whole);
  - struct and pointer prefixes dropped (c->lr, gb->slice, ls.scale: lr,
    slice, scale), so a copy that reads its values from a struct still matches;
  - the SIMD width made one name: _mm256_ and _mm512_ intrinsics, __m256
    and __m512 registers, store_half8 and store_half16, and the lane counts
    8, 16 and 32.

Statements shorter than MIN_CHARS after normalisation (`return 0;`, `m = mi;`)
are too common to say anything and are not looked for, and so are those in
COMMON: lines of an answer that the rest of the code base needs too. Prints
each statement found, with the exercise and the file, and exits 1 if any.
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common", "python"))
from exercises import BEGIN, END, SOURCE_SUFFIXES  # noqa: E402  (the markers, defined once)

MIN_CHARS = 16
# Normalised statements of answers that legitimately stand elsewhere: the
# setup every variant of a function shares, not the exercise's idea.
COMMON = {
    "constKernelOps*k=ops()",
    "cuda_check(cudaGetLastError())",  # after every kernel launch
    "#pragmaompparallelforfor(intn=0",  # every row loop of kernels_cpu.c
    "constfloat*x=inp+n*C",  # the warp-per-row layout of every row kernel (01.1's CUDA twin)
    "if(n>=(size_t)N)return",
    "intlane=x%WARP_SIZE",
    "size_tn=(size_t)x*ROWS_PER_BLOCK+x/WARP_SIZE",
    "returnfloats*sizeof(float)",  # every byte count of model.c (01.3)
    "Bucket*b=&buckets[i]",  # every loop over the buckets (02.2)
    "m++)forward_step(s,P,stage,m)",  # GPipe's forwards (04.2)
    "for(intu=LAYER_EMBEDDING",  # every loop over the units (05.1)
    "size_tS=slice_numel(z,unit)",  # every collective of a unit (05.2)
    "pthread_join(worker,NULL)",  # offload_destroy joins an update left running (06.2)
    "offload_update_wait(off)",  # a checkpoint finishes the update in flight (06.2)
}
SKIP_DIRS = {".git", "build", "runs", "__pycache__"}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def normalise(text):
    """The text with comments, whitespace, prefixes and SIMD widths taken out."""
    text = strip_comments(text)
    text = re.sub(r"\b[A-Za-z_]\w*\s*(->|\.)\s*(?=[A-Za-z_])", "", text)  # c->lr, gb->slice: lr, slice
    text = re.sub(r"\s+", "", text)
    text = re.sub(r"_mm(256|512)?_", "_mmW_", text)
    text = re.sub(r"__m(128|256|512)", "__mW", text)
    text = re.sub(r"store_half(8|16)\b", "store_halfW", text)
    return re.sub(r"\b(8|16|32)\b", "W", text)


def answer_statements(text):
    """{exercise id: [normalised statements]} of one source file's regions."""
    found, region, ident = {}, [], None
    for line in text.split("\n"):
        if ident is None:
            m = BEGIN.match(line)
            if m:
                ident, region = m.group(2), []
            continue
        if END.match(line):
            for s in re.split(r"[;{}]", normalise("\n".join(region))):
                if len(s) >= MIN_CHARS and s not in COMMON:
                    found.setdefault(ident, []).append(s)
            ident = None
        else:
            region.append(line)
    return found


def files_under(root):
    for here, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        for n in names:
            yield os.path.join(here, n)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: exercise_leaks.py FULL STUDENT")
    full, student = sys.argv[1], sys.argv[2]
    answers = {}
    for path in files_under(full):
        if path.endswith(SOURCE_SUFFIXES):
            with open(path, encoding="utf-8", errors="replace") as fh:
                for ident, statements in answer_statements(fh.read()).items():
                    answers.setdefault(ident, set()).update(statements)
    if not answers:
        sys.exit(f"exercise_leaks.py: no exercise regions found in {full}")
    leaks = 0
    for path in sorted(files_under(student)):
        try:
            with open(path, encoding="utf-8") as fh:
                text = normalise(fh.read())
        except (UnicodeDecodeError, OSError):
            continue  # not text
        rel = os.path.relpath(path, student)
        for ident in sorted(answers):
            for s in sorted(answers[ident]):
                if s in text:
                    print(f"exercise {ident}: {rel} holds the answer's `{s}`")
                    leaks += 1
    print(f"exercise_leaks: {len(answers)} exercises, "
          f"{sum(len(s) for s in answers.values())} answer statements, {leaks} found in {student}")
    sys.exit(1 if leaks else 0)


if __name__ == "__main__":
    main()
