#!/usr/bin/env python3
"""check_quotes.py: run the commands course.md shows next to its quoted outputs, and compare.

    python3 common/python/check_quotes.py [--file course.md] [--only TEXT]... [--update] [--list]

A quoted output is checked when the block right above it, visible to the reader, holds the
commands that print it and is marked `sh check` (or `sh check-shape`) after its fence:

    ```sh check
    ./01_single_gpu/train --device cpu --steps 1 --quiet --overwrite --out runs/01-example > /dev/null
    cat runs/01-example/memory.csv
    ```
    ```
    what those commands print
    ```

(Renderers take the first word after the fence, `sh`, for the language and show nothing of the
rest.) The checker runs exactly those lines, as a reader who pastes them would, with bash, stdout
and stderr together, and `set -eo pipefail` in front: a command that fails, even inside a pipe or
a loop, fails the block with its exit status, so a filter cannot hide a refusal. A command that
is meant to fail says so where the reader sees it: `... || echo "exit status $?"`. A command
hidden from the reader (the old `<!-- check: ... -->` comments) is refused.

The blocks run in the order of the file, in one scratch directory that stands for a fresh clone
after `make`: every top-level entry of the repository linked into it, except runs/, which starts
empty (and the repository's own runs/ is left alone). So each block names its output directory
under runs/, each a name of its own (checked: two blocks that write one --out or --save path, as
written, are an error), and passes --overwrite with every --out (checked too), so that a reader can run a block
again. In the output the repository's absolute path is written `...`. OMP_NUM_THREADS is 1
unless it is set: a block whose output depends on the threads sets them in sight, as the reader
must.

The output, with trailing blanks removed from each line, must equal the quoted block. Under
`sh check-shape` only the shape must match: every number counts as the same, and so does the
amount of blank space between words: for outputs whose numbers depend on the training text
(course.md is the default corpus, so any edit of it moves the losses) or on the machine's speed.
The lines, their fields and their words are checked, the values not. Exact checks suit memory,
errors and schedules.

A measurement that no rerun reproduces (a benchmark's table) stands under a plain `sh` block:
its commands are in sight, and the checker leaves it alone.

A block the reader is told to paste and run, with no output quoted after it, is marked `sh run`:

    ```sh run
    common/scripts/mpirun.sh -np 2 ./02_data_parallel/train --model small --steps 40 --overwrite --out runs/02-dp2
    ```

It follows the rules above (its own --out and --save names under runs/, --overwrite with every
--out), and --pasted runs these blocks, each twice in a row, in the scratch clone (with --only,
those whose commands contain TEXT): each run must exit with status 0. They are not run otherwise
(some train for minutes).

Every other block and the prose are read for three more rules:
- two commands of one block that write one --out (a chapter's `train` writes runs/<its folder>
  when --out is not given), the later one without --overwrite: the later one fails with "holds
  another run's files", so the block cannot run as written;
- `mpirun` written as a command (in a block, or in `code` in the prose) for a run on one machine:
  the course starts ranks with common/scripts/mpirun.sh; plain mpirun is for runs across machines
  (a command with --hostfile or --host);
- development history in the prose: "the issue", "issue N", a commit hash in brackets or after
  "commit". The text speaks to a learner of the code as it is.

--only TEXT runs only the blocks whose commands contain TEXT (repeatable). --pasted runs the `sh run`
blocks (twice each) instead of the quoted outputs' blocks. --update rewrites the
quoted outputs that differ with what the commands print now (never those of a block whose
commands failed). --list prints each checked block's line and first command and runs nothing.

Prints one line per block, PASS or FAIL with a diff (or the failing status and output), and
exits 1 if any block failed or differed (with --update: only if a command failed).
"""
import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
COMMANDS = re.compile(r"^```sh\s+(check|check-shape)\s*$")
PASTED = re.compile(r"^```sh\s+run\s*$")
NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
OUTPUT_FLAGS = ("--out", "--save")


class Block:
    def __init__(self, at, commands, shape, first, end):
        self.at = at  # line index of the command block's fence
        self.commands = commands  # its lines
        self.shape = shape  # only the shape must match
        self.first, self.end = first, end  # the quoted output: lines [first, end)

    def title(self):
        text = ""
        for line in logical_lines(self.commands):  # one line, as bash would read it
            line = " ".join(line.split())
            text += line + (" " if line.endswith((" do", " then", "{")) else "; ")
        text = text.rstrip("; ")
        return f"line {self.at + 1}: {text[:157] + '...' if len(text) > 160 else text}"


def fenced_end(lines, start, path):
    """Index of the fence that closes the block opened at lines[start]."""
    end = start + 1
    while end < len(lines) and not lines[end].startswith("```"):
        end += 1
    if end == len(lines):
        sys.exit(f"check_quotes: {path}:{start + 1}: the fenced block never closes")
    return end


def quoted_blocks(lines, path):
    i = 0
    while i < len(lines):
        m = COMMANDS.match(lines[i].rstrip())
        if not m:
            if lines[i].startswith("```"):  # skip any other block whole, so its body is not read as fences
                i = fenced_end(lines, i, path)
            i += 1
            continue
        close = fenced_end(lines, i, path)
        out = close + 1
        while out < len(lines) and not lines[out].strip():
            out += 1
        if out == len(lines) or lines[out].rstrip() not in ("```", "```text"):
            sys.exit(f"check_quotes: {path}:{i + 1}: a `sh {m.group(1)}` block must be followed by the "
                     "fenced block of its output (``` or ```text), with nothing but blank lines between")
        end = fenced_end(lines, out, path)
        yield Block(i, lines[i + 1:close], m.group(1) == "check-shape", out + 1, end)
        i = end + 1


def pasted_blocks(lines, path):
    """The `sh run` blocks: commands a reader pastes, with no quoted output to compare."""
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            close = fenced_end(lines, i, path)
            if PASTED.match(lines[i].rstrip()):
                yield Block(i, lines[i + 1:close], False, None, None)
            i = close
        i += 1


def fenced_spans(lines, path):
    """(fence line index, language word, body lines) of every fenced block, and the prose lines' indices."""
    blocks, prose, i = [], [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            close = fenced_end(lines, i, path)
            words = lines[i][3:].split()
            blocks.append((i, words[0] if words else "", lines[i + 1:close]))
            i = close + 1
            continue
        prose.append(i)
        i += 1
    return blocks, prose


# A command: optional VAR=value words, an optional launcher (common/scripts/mpirun.sh or mpirun, with
# their flags), then a chapter's program: `./04_pipeline/train` or `04_pipeline/train`.
ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
CHAPTER_TRAIN = re.compile(r"^(?:\./)?(0\d_[a-z_]+)/train$")
PLAIN_MPIRUN = re.compile(r"(?:^|[;&|(]\s*|\$\s)(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*mpirun\s")
HISTORY = re.compile(r"\b(?:the issue|issue \d+)\b|\((?:[0-9a-f]{7,40})\)|\bcommit [0-9a-f]{7,40}\b", re.I)


def train_out(words):
    """The --out a chapter's train command writes (its default when none is given) and whether it
    passes --overwrite, or None when the words run no chapter's train."""
    k = 0
    while k < len(words) and ENV_WORD.match(words[k]):
        k += 1
    if k < len(words) and words[k] == "env":
        k += 1
    if k < len(words) and os.path.basename(words[k]) in ("mpirun", "mpirun.sh"):
        k += 1
        while k < len(words) and words[k].startswith("-"):  # the launcher's flags and their values
            k += 2 if words[k] in ("-np", "-n", "--hostfile", "--host", "-x", "--map-by", "--bind-to") else 1
    if k >= len(words):
        return None
    m = CHAPTER_TRAIN.match(words[k])
    if not m or any(w in ("--help", "--print-schedule") for w in words):  # these print and write nothing
        return None
    out = f"runs/{m.group(1)}"
    for j, w in enumerate(words):
        if w == "--out" and j + 1 < len(words):
            out = words[j + 1]
        elif w.startswith("--out="):
            out = w[len("--out="):]
    return out, "--overwrite" in words


def course_rules(lines, path):
    """The rules every block and the prose keep, checked or not (see the top of this file)."""
    problems = []
    blocks, prose = fenced_spans(lines, path)
    for at, language, body in blocks:
        if language in ("diff", "c"):  # generated from the code, or code: not commands
            continue
        written = set()  # the --out directories of the block's commands so far
        for line in logical_lines(body):
            for command in re.split(r"\s*(?:;|&&|\|\|)\s*", line):
                try:
                    words = shlex.split(command, comments=True)
                except ValueError:
                    words = command.split()
                found = train_out(words)
                if not found:
                    continue
                out, overwrite = found
                if out in written and not overwrite:
                    problems.append(f"{path}:{at + 1}: two commands of this block write --out {out} and the later "
                                    "has no --overwrite: it fails with \"holds another run's files\" (valid: an --out "
                                    "of its own, or --overwrite)")
                written.add(out)
            if PLAIN_MPIRUN.search(line) and not re.search(r"--host(file)?\s", line):
                problems.append(f"{path}:{at + 1}: plain mpirun: on one machine the course starts ranks with "
                                "common/scripts/mpirun.sh (plain mpirun only with --hostfile or --host)")
    in_prose = set(prose)
    text = "\n".join(lines[i] if i in in_prose else "" for i in range(len(lines)))
    for m in re.finditer(r"`([^`\n]+(?:\n[^`\n]+)*)`", text):  # `code`, which may wrap but not cross a blank line
        span = " ".join(m.group(1).split())
        if PLAIN_MPIRUN.match(span) and not re.search(r"--host(file)?\s", span):
            problems.append(f"{path}:{text.count(chr(10), 0, m.start()) + 1}: plain mpirun in `{span[:60]}`: "
                            "write common/scripts/mpirun.sh, the course's launcher")
    for i in prose:
        for m in HISTORY.finditer(lines[i]):
            problems.append(f"{path}:{i + 1}: development history ({m.group(0)!r}): the text speaks to a learner "
                            "of the code as it is")
    return problems


def logical_lines(commands):
    """The command lines with backslash continuations joined."""
    joined, part = [], ""
    for line in commands:
        if line.endswith("\\"):
            part += line[:-1] + " "
            continue
        joined.append(part + line)
        part = ""
    if part:
        joined.append(part)
    return joined


def output_paths(line):
    """The paths a command line gives to --out and --save."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        words = line.split()
    paths = []
    for k, w in enumerate(words):
        for flag in OUTPUT_FLAGS:
            if w == flag and k + 1 < len(words):
                paths.append((flag, words[k + 1]))
            elif w.startswith(flag + "="):
                paths.append((flag, w[len(flag) + 1:]))
    return words, paths


def lint(blocks, path):
    """The rules that make every block runnable as written, again, and after the blocks before it."""
    problems, owner = [], {}
    for b in blocks:
        for line in logical_lines(b.commands):
            words, paths = output_paths(line)
            for flag, p in paths:
                where = f"{path}:{b.at + 1}"
                if not p.startswith("runs/"):
                    problems.append(f"{where}: {flag} {p}: write under runs/")
                if p in owner and owner[p] != b.at:
                    problems.append(f"{where}: {flag} {p} is already written by the block at line {owner[p] + 1}")
                owner.setdefault(p, b.at)
                if flag == "--out" and "--overwrite" not in words:
                    problems.append(f"{where}: --out {p} without --overwrite: the block fails when run again")
            if re.search(r"\$TMP\b|/tmp/", line):
                problems.append(f"{path}:{b.at + 1}: uses $TMP or /tmp: write under runs/ instead")
    return problems


def scratch_clone(root):
    """A directory that looks like the repository after `make`, with an empty runs/."""
    for name in os.listdir(REPO):
        if name != "runs":
            os.symlink(os.path.join(REPO, name), os.path.join(root, name))
    os.mkdir(os.path.join(root, "runs"))


def run(block, cwd):
    script = "set -eo pipefail\n" + "\n".join(block.commands) + "\n"
    try:
        done = subprocess.run(["bash", "-c", script], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=600)
        status, text = done.returncode, done.stdout
    except subprocess.TimeoutExpired as e:  # a block that hangs fails like one that exits 124
        out = e.stdout or b""
        status, text = 124, (out.decode(errors="replace") if isinstance(out, bytes) else out) + "\n(killed after 600 s)"
    text = text.replace(REPO + "/", ".../").replace(cwd + "/", "")
    return status, [line.rstrip() for line in text.rstrip("\n").split("\n")]


def run_pasted(blocks):
    """Run every `sh run` block twice in a row in one scratch clone; 1 if any run failed."""
    failed = 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="check_quotes.") as tmp:
        cwd = os.path.realpath(tmp)
        scratch_clone(cwd)
        for b in blocks:
            for attempt in ("first", "second"):
                status, got = run(b, cwd)
                if status != 0:
                    failed += 1
                    print(f"FAIL {b.title()}\n    the {attempt} run exited with status {status}; it printed:")
                    print("\n".join("    | " + line for line in got[-20:]))
                    break
            else:
                print(f"PASS {b.title()} (twice)")
    print(f"check_quotes: {len(blocks) - failed} of {len(blocks)} pasted blocks ran twice")
    return 1 if failed else 0


def shape_of(lines):
    """A line with every number replaced by # and runs of blanks by one."""
    return [" ".join(NUMBER.sub("#", line).split()) for line in lines]


def main():
    ap = argparse.ArgumentParser(description="Run course.md's visible commands and compare their quoted outputs.")
    ap.add_argument("--file", default=os.path.join(REPO, "course.md"))
    ap.add_argument("--only", action="append", default=[], metavar="TEXT",
                    help="run only the blocks whose commands contain TEXT (repeatable)")
    ap.add_argument("--update", action="store_true", help="rewrite the quoted outputs that differ")
    ap.add_argument("--list", action="store_true", help="list the checked blocks, run nothing")
    ap.add_argument("--pasted", action="store_true", help="run the `sh run` blocks, each twice, instead")
    args = ap.parse_args()
    with open(args.file) as f:
        lines = f.read().split("\n")
    blocks = list(quoted_blocks(lines, args.file))
    pasted = list(pasted_blocks(lines, args.file))
    problems = lint(sorted(blocks + pasted, key=lambda b: b.at), args.file) + course_rules(lines, args.file)
    problems += [f"{args.file}:{i + 1}: a command hidden in a comment: show it in a `sh check` block instead"
                 for i, line in enumerate(lines) if re.match(r"\s*<!--\s*check", line)]
    if problems:
        print("\n".join(problems))
        sys.exit(f"check_quotes: {len(problems)} block rule(s) broken (see the top of common/python/check_quotes.py)")
    kind = "pasted" if args.pasted else "checked"
    if args.pasted:
        if args.update:
            sys.exit("check_quotes: --pasted blocks quote no output: --update has nothing to rewrite")
        blocks = pasted
    if args.only:
        blocks = [b for b in blocks if any(t in "\n".join(b.commands) for t in args.only)]
        if not blocks:
            sys.exit(f"check_quotes: no {kind} block's commands contain {' or '.join(args.only)}")
    if args.list:
        for b in blocks:
            print(b.title())
        return
    if args.pasted:
        sys.exit(run_pasted(blocks))
    failures, errors, replacements = 0, 0, []
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="check_quotes.") as tmp:
        cwd = os.path.realpath(tmp)
        scratch_clone(cwd)
        for b in blocks:
            status, got = run(b, cwd)
            want = [line.rstrip() for line in lines[b.first:b.end]]
            if status != 0:
                errors += 1
                print(f"FAIL {b.title()}\n    the commands exited with status {status}; they printed:")
                print("\n".join("    | " + line for line in got))
                continue
            if (shape_of(got) == shape_of(want)) if b.shape else (got == want):
                print(f"PASS {b.title()}")
                continue
            failures += 1
            print(f"FAIL {b.title()}")
            for d in difflib.unified_diff(want, got, "course.md", "now", lineterm="", n=1):
                print("    " + d)
            replacements.append((b.first, b.end, got))
    if args.update and replacements:
        for first, end, got in reversed(replacements):
            lines[first:end] = got
        with open(args.file, "w") as f:
            f.write("\n".join(lines))
        print(f"check_quotes: updated {len(replacements)} quoted output(s) in {args.file}")
    print(f"check_quotes: {len(blocks) - failures - errors} of {len(blocks)} quoted outputs match"
          + (f"; the commands of {errors} failed" if errors else ""))
    sys.exit(1 if errors or (failures and not args.update) else 0)


if __name__ == "__main__":
    main()
