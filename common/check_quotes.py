#!/usr/bin/env python3
"""check_quotes.py: re-run the commands whose output course.md quotes, and compare.

    python3 common/check_quotes.py [--file course.md] [--update]

A quoted output is checked when an HTML comment (invisible in the rendered
course) stands right before its fenced block:

    <!-- check: COMMAND -->
    ```
    the output COMMAND printed
    ```

COMMAND runs with bash in the repository root, stdout and stderr together, in
a fresh scratch directory named by $TMP; its output, with trailing blanks
removed from each line, must equal the block. With `<!-- check-shape: ... -->`
only the shape must match: every number counts as the same, and so does the
amount of blank space between words. That is for outputs whose numbers
depend on the training text or on the machine's speed (losses, timings):
the lines, their fields and their words are checked, the values not. Put a filter in the command
when only part of the output is quoted or stable (`... 2>&1 | head -1`). Exact checks suit
outputs that do not depend on the training text (course.md is the default
corpus, so any edit of it moves the losses) or on timing: memory, errors,
schedules. --update rewrites the blocks that differ with what the commands
print now.

Prints one line per checked block, PASS or FAIL with a diff, and exits 1 if
any differ.
"""
import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = re.compile(r"^<!-- check(-shape)?: (.*) -->$")
NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def quoted_blocks(lines):
    """(line index of the comment, command, shape only?, first and last+1 line index of the block's body)."""
    for i, line in enumerate(lines):
        m = CHECK.match(line.strip())
        if not m:
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            sys.exit(f"check_quotes: line {i + 1}: a check comment must stand right before a fenced block")
        end = i + 2
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        if end == len(lines):
            sys.exit(f"check_quotes: line {i + 2}: the fenced block never closes")
        yield i, m.group(2), bool(m.group(1)), i + 2, end


def shape_of(lines):
    """A line with every number replaced by # and runs of blanks by one."""
    return [" ".join(NUMBER.sub("#", line).split()) for line in lines]


def run(command):
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TMP=tmp, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        done = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600)
    text = done.stdout + done.stderr
    return [line.rstrip() for line in text.rstrip("\n").split("\n")]


def main():
    ap = argparse.ArgumentParser(description="Check course.md's quoted outputs against real runs.")
    ap.add_argument("--file", default=os.path.join(REPO, "course.md"))
    ap.add_argument("--update", action="store_true", help="rewrite the blocks that differ")
    args = ap.parse_args()
    with open(args.file) as f:
        lines = f.read().split("\n")
    failures, checked, replacements = 0, 0, []
    for at, command, shape, first, end in quoted_blocks(lines):
        checked += 1
        want = [line.rstrip() for line in lines[first:end]]
        got = run(command)
        if (shape_of(got) == shape_of(want)) if shape else (got == want):
            print(f"PASS line {at + 1}: {command}")
            continue
        failures += 1
        print(f"FAIL line {at + 1}: {command}")
        for d in difflib.unified_diff(want, got, "course.md", "now", lineterm="", n=1):
            print("    " + d)
        replacements.append((first, end, got))
    if args.update and replacements:
        for first, end, got in reversed(replacements):
            lines[first:end] = got
        with open(args.file, "w") as f:
            f.write("\n".join(lines))
        print(f"check_quotes: updated {len(replacements)} block(s) in {args.file}")
    print(f"check_quotes: {checked - failures} of {checked} quoted outputs match")
    sys.exit(1 if failures and not args.update else 0)


if __name__ == "__main__":
    main()
