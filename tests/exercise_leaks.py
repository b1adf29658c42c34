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
COMMON: lines of an answer that the rest of the code base needs too.

Spelling is a weak net: the same arithmetic in another backend is written
differently (`fmaxf(l, lb)` for `*l > lb ? *l : lb`). So the places that
compute an answer are checked by what they are, not how they read. They are
the functions of FULL that hold the exercise's regions, the twins its grader
declares (`# twins: FILE FUNCTION...` in tests/grade/ID.bats, for the CUDA
backend, which no grader runs here), and the twins found in the kernel
tables: when a region sits in a CPU kernel file (common/kernels/*_cpu.c), the
operation of the CPU table (`.op = function`) whose function reaches it has a
CUDA function in the CUDA table, and it and the kernels it launches compute
the same answer; they must be declared. In STUDENT, each of those places must
be gone or hold the exercise's stub (exercise_not_implemented("ID", ...)).
That the stubs fail is the graders' part (tests/tools/exercises.bats: every grader
fails on a copy with every exercise stubbed).

Prints each statement found and each place left, with the exercise and the
file, and exits 1 if any.
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
    # the warp per (sequence, head, row) of every ring attention kernel and its launch (03.3's CUDA twin)
    "size_tindex=(size_t)x*WARPS+x/W",
    "if(index>=warps)return",
    "BlockRowat=block_row(index,rows,NH)",
    "intlane=x%W,hs=C/NH",
    "size_twarps=(size_t)B*NH*rows",
    "if(warps==0||C==0)return",
    # every softmax row of the cross-entropies, whole and sliced, and crossentropy_slice_max beside
    # 03.4's kernels (given): the row loop, the row's logits, the running maximum, the normalisation
    "#pragmaompparallelforschedule(static)for(intn=0",
    "constfloat*z=logits+(size_t)n*Vl",
    "constfloat*z=logits+n*Vl",
    "floatmaxval=-INFINITY",
    "row_max[n]=maxval",
    "floatinv=(float)(1.0/sum)",
    "sum=block_sum(sum)",
    # every element-wise CUDA kernel and its launch
    "size_ti=(size_t)x*x+x",
    "if(i>=total)return",
    "if(total==0)return",
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


def blank(text):
    """text with comments, string and character literals and preprocessor lines
    turned into spaces, newlines kept: offsets stay those of text."""
    out, i, n = list(text), 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            j = i
            while j < n and (text[j] != "\n" or text[j - 1] == "\\"):
                j += 1
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
            continue
        if c == "\n":
            line_start = True
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i) or text.startswith("/*", i):
            j = text.find("\n" if text[i + 1] == "/" else "*/", i + 2)
            j = n if j < 0 else (j if text[i + 1] == "/" else j + 2)
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            i += 1
            continue
        for k in range(i, min(j, n)):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


NOT_NAMES = {"__attribute__", "__declspec", "alignas", "if", "for", "while", "switch", "return", "sizeof"}


def functions(text):
    """{name: (offset of the name, of the opening brace, of the closing brace)} of a C or
    CUDA file's function definitions."""
    code, found = blank(text), {}
    depth, start, opened, header_from = 0, 0, [], 0
    for i, c in enumerate(code):
        if c == "{":
            if depth == 0:
                header = code[header_from:i]
                if re.search(r'extern\s+"?C?"?\s*$', text[header_from:i]) and "(" not in header:
                    header_from = i + 1  # extern "C" { ... }: its functions are at file scope
                    opened.append(None)
                    continue
                start = i
            opened.append(i)
            depth += 1
        elif c == "}":
            if opened and opened[-1] is None:
                opened.pop()
                header_from = i + 1
                continue
            depth -= 1
            opened.pop()
            if depth == 0:
                header = code[header_from:start]
                names = [m for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\(", header) if m.group(1) not in NOT_NAMES]
                if names and "=" not in header:
                    found[names[0].group(1)] = (header_from + names[0].start(), start, i)
                header_from = i + 1
        elif c == ";" and depth == 0:
            header_from = i + 1
    return found


def regions(text):
    """[(id, begin offset, end offset)] of a file's exercise regions."""
    out, pos, open_at = [], 0, None
    for line in text.split("\n"):
        m = BEGIN.match(line)
        if m:
            open_at = (m.group(2), pos)
        elif END.match(line) and open_at:
            out.append((open_at[0], open_at[1], pos + len(line)))
            open_at = None
        pos += len(line) + 1
    return out


def read(path):
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def declared_twins(full):
    """{id: {(file, function)}}: the `# twins: FILE FUNCTION...` lines of the graders."""
    twins = {}
    grade = os.path.join(full, "tests", "grade")
    for name in sorted(os.listdir(grade)):
        if name.endswith(".bats"):
            for m in re.finditer(r"^# twins: *(\S+) +(.+)$", read(os.path.join(grade, name)), re.M):
                for fn in m.group(2).split():
                    twins.setdefault(name[:-5], set()).add((m.group(1), fn))
    return twins


def table_entries(code):
    """{operation: function} of a kernel table's designated initialisers (.op = function)."""
    return {m.group(1): m.group(2) for m in re.finditer(r"\.(\w+)\s*=\s*([A-Za-z_]\w*)\s*[,}]", code)}


def kernel_table_twins(full, places):
    """{id: {(cuda file, function)}}: for each region in a CPU kernel file, the CUDA
    function of the same operation of the kernel table, and the kernels it launches."""
    kernels = os.path.join(full, "common", "kernels")
    backends = {}
    for suffix, side in (("_cpu.c", "cpu"), ("_cuda.cu", "cuda")):
        files = sorted(f for f in os.listdir(kernels) if f.endswith(suffix))
        texts = {f"common/kernels/{f}": read(os.path.join(kernels, f)) for f in files}
        funcs = {}  # name: (file, body without comments)
        table = {}
        for rel, text in texts.items():
            code = blank(text)
            table.update(table_entries(code))
            for name, (_, lo, hi) in functions(text).items():
                funcs[name] = (rel, code[lo:hi + 1])
        backends[side] = (funcs, table)
    cpu_funcs, cpu_table = backends["cpu"]
    cuda_funcs, cuda_table = backends["cuda"]

    def reached_from(name, funcs):
        seen, todo = set(), [name]
        while todo:
            f = todo.pop()
            if f in seen or f not in funcs:
                continue
            seen.add(f)
            todo += re.findall(r"\b([A-Za-z_]\w*)\s*\(", funcs[f][1])
        return seen

    twins = {}
    for ident, where in places.items():
        for rel, fn in where:
            if not (rel.startswith("common/kernels/") and rel.endswith("_cpu.c")):
                continue
            for op, impl in cpu_table.items():
                if fn in reached_from(impl, cpu_funcs) and op in cuda_table and cuda_table[op] in cuda_funcs:
                    twin = cuda_table[op]
                    rel_cuda, body = cuda_funcs[twin]
                    twins.setdefault(ident, set()).add((rel_cuda, twin))
                    for kernel in re.findall(r"\b([A-Za-z_]\w*)\s*<<<", body):
                        if kernel in cuda_funcs:
                            twins[ident].add((cuda_funcs[kernel][0], kernel))
    return twins


def answer_places(full):
    """{id: {(file, function)}}: the functions of FULL that hold a region of the exercise,
    or lie inside one (a file-scope region holds whole definitions)."""
    places = {}
    for path in files_under(full):
        if not path.endswith(SOURCE_SUFFIXES):
            continue
        text = read(path)
        if "EXERCISE" not in text:
            continue
        rel = os.path.relpath(path, full)
        funcs = functions(text)
        for ident, lo, hi in regions(text):
            for name, (start, _, close) in funcs.items():
                if start <= lo <= close or lo <= start <= hi:
                    places.setdefault(ident, set()).add((rel, name))
    return places


def places_left(full, student):
    """Lines naming each place that computes an answer in FULL and survives in STUDENT
    unstubbed; and how many places there are."""
    places = answer_places(full)
    problems = []
    declared = declared_twins(full)
    for ident, twins in sorted(kernel_table_twins(full, places).items()):
        for rel, fn in sorted(twins - declared.get(ident, set())):
            problems.append(f"exercise {ident}: {rel}'s {fn} computes the answer in the other backend "
                            f"(the kernel table's twin) and tests/grade/{ident}.bats does not declare it (# twins:)")
        places[ident] |= twins
    for ident, twins in declared.items():
        for rel, fn in twins:
            if not os.path.exists(os.path.join(full, rel)) or fn not in functions(read(os.path.join(full, rel))):
                problems.append(f"exercise {ident}: tests/grade/{ident}.bats declares the twin {rel} {fn}, "
                                f"which {os.path.basename(full.rstrip('/')) or full} does not have")
            else:
                places.setdefault(ident, set()).add((rel, fn))
    count = 0
    for ident in sorted(places):
        for rel, fn in sorted(places[ident]):
            count += 1
            path = os.path.join(student, rel)
            if not os.path.exists(path):
                continue
            text = read(path)
            span = functions(text).get(fn)
            if span and f'exercise_not_implemented("{ident}"' not in text[span[1]:span[2] + 1]:
                problems.append(f"exercise {ident}: {rel}'s {fn} computes the answer and is neither stubbed "
                                f"nor gone in {student}")
    return problems, count


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
    problems, count = places_left(full, student)
    for line in problems:
        print(line)
    print(f"exercise_leaks: {len(answers)} exercises, "
          f"{sum(len(s) for s in answers.values())} answer statements, {leaks} found in {student}; "
          f"{count} functions compute answers, {len(problems)} left")
    sys.exit(1 if leaks or problems else 0)


if __name__ == "__main__":
    main()
