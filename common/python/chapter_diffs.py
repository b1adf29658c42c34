#!/usr/bin/env python3
"""chapter_diffs.py: what each chapter adds to the one before it, as diffs and a table.

    python3 common/python/chapter_diffs.py                 print the table
    python3 common/python/chapter_diffs.py --out DIR       also write DIR/NN-MM.diff for each neighbour pair
    python3 common/python/chapter_diffs.py --check         exit 1 when a train.c diff is over its budget
    python3 common/python/chapter_diffs.py --pairs 02-03,03-04 --check   only those pairs (the table too)
    python3 common/python/chapter_diffs.py --write-course  put each pair's row and train.c diff into course.md
    python3 common/python/chapter_diffs.py --check-course  exit 1 if course.md's rows are not the current ones
    python3 common/python/chapter_diffs.py --repo DIR      another copy (the tests use a made-up one)

--out is a new name or a directory; an NN-MM.diff there is replaced only if it
is this tool's own earlier diff, never another file (common/python/tool.py).
Bad input is refused in one line, exit status 2.

Each chapter is the previous chapter plus one technique, so the lesson is the
difference between neighbours. For each pair (01 -> 02, ..., 05 -> 06) this
counts the lines a unified diff of train.c removes and adds, and the same for
the chapter's own files (its other .c and .h files, each against the file of
that name in the earlier chapter, or against nothing when it is new). A
benchmark program (*bench.c) is not part of the step and is left out.

The budget, for train.c: at most 30 lines removed and 150 added (BUDGET). A
technique that honestly needs more gets an entry in EXCEPTIONS, with the
reason, which the table prints beside it.

course.md opens each chapter with its row of the table and, folded under it
(a <details> block), the whole diff of train.c as a student copy has it
(exercises.py's stubs in place of the answers, which course.md must not
show: tests/exercise_leaks.py), between
    <!-- chapter diff NN -->  and  <!-- end chapter diff NN -->
(NN the later chapter of the pair): --write-course writes them, --check-course
says whether they are current, so that neither the numbers nor the diff in
the course is ever copied by hand.
"""
import argparse
import difflib
import os
import re
import sys

from exercises import stub_regions
from tool import Refusal, check_output_file, make_output_dir, run_tool

BUDGET = {"removed": 30, "added": 150}
# "NN_name": (removed, added, why): a chapter allowed more than BUDGET, and why.
EXCEPTIONS = {}
MARK = re.compile(r"(<!-- chapter diff (\d\d) -->\n)(.*?)(<!-- end chapter diff \2 -->)", re.S)


def chapters(repo):
    return sorted(d for d in os.listdir(repo) if re.match(r"0\d_", d) and os.path.isfile(os.path.join(repo, d, "train.c")))


def read_lines(path):
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read().splitlines(keepends=True)


def own_files(repo, chapter):
    return sorted(f for f in os.listdir(os.path.join(repo, chapter))
                  if f.endswith((".c", ".h")) and f != "train.c" and not f.endswith("bench.c"))


def student_view(lines, path):
    """The lines as a student copy has them: every exercise's answer replaced by its stub
    (exercises.py), so that the diff course.md shows gives no answer away."""
    text, _ = stub_regions("".join(lines), path, None)
    return text.splitlines(keepends=True)


def diff(repo, a, b, name_a, name_b, student=False):
    """(unified diff text, lines removed, lines added) from a/name_a to b/name_b; student:
    of the files as a student copy has them (exercise answers stubbed)."""
    old = read_lines(os.path.join(repo, a, name_a)) if name_a else []
    new = read_lines(os.path.join(repo, b, name_b))
    if student:
        old, new = student_view(old, f"{a}/{name_a}"), student_view(new, f"{b}/{name_b}")
    lines = list(difflib.unified_diff(old, new, f"{a}/{name_a}" if name_a else "/dev/null", f"{b}/{name_b}", n=3))
    removed = sum(1 for l in lines if l.startswith("-") and not l.startswith("---"))
    added = sum(1 for l in lines if l.startswith("+") and not l.startswith("+++"))
    text = "".join(l if l.endswith("\n") else l + "\n\\ No newline at end of file\n" for l in lines)
    return text, removed, added


# The first lines of a diff this tool writes (pairs' text): a chapter file against the earlier
# chapter's (or against nothing, for a new file); empty where two chapters do not differ.
CHAPTER_DIFF_HEAD = re.compile(rb"--- (/dev/null|0\d_[^/\n]+/[^\n]+)\n\+\+\+ 0\d_[^/\n]+/[^\n]+\n")


def is_chapter_diff(path):
    """An earlier NN-MM.diff of --out: empty, or opening as the diffs this tool writes."""
    with open(path, "rb") as f:
        head = f.read(4096)
    return head == b"" or CHAPTER_DIFF_HEAD.match(head) is not None


def pairs(repo):
    """One row per neighbour pair: the counts, and the whole diff text."""
    names = chapters(repo)
    rows = []
    for a, b in zip(names, names[1:]):
        text, removed, added = diff(repo, a, b, "train.c", "train.c")
        train_text = text
        student_text, student_removed, student_added = diff(repo, a, b, "train.c", "train.c", student=True)
        own_removed = own_added = 0
        own_text = []
        for f in own_files(repo, b):
            t, r, d = diff(repo, a, b, f if os.path.isfile(os.path.join(repo, a, f)) else None, f)
            own_removed, own_added = own_removed + r, own_added + d
            own_text.append(t)
        rows.append({"from": a, "to": b, "removed": removed, "added": added, "own_removed": own_removed,
                     "own_added": own_added, "own": own_files(repo, b), "text": text + "".join(own_text),
                     "train_text": train_text, "student": (student_text, student_removed, student_added)})
    return rows


def over_budget(row):
    lim_removed, lim_added, _ = EXCEPTIONS.get(row["to"], (BUDGET["removed"], BUDGET["added"], ""))
    problems = []
    if row["removed"] > lim_removed:
        problems.append(f"removes {row['removed']} lines (budget {lim_removed})")
    if row["added"] > lim_added:
        problems.append(f"adds {row['added']} lines (budget {lim_added})")
    return problems


def table(rows):
    out = ["| chapters | train.c removed / added | own files removed / added | files of its own |",
           "|---|---|---|---|"]
    for r in rows:
        why = EXCEPTIONS.get(r["to"], (0, 0, ""))[2]
        out.append(f"| {r['from'][:2]} -> {r['to'][:2]} | {r['removed']} / {r['added']}"
                   f"{' (over the budget: ' + why + ')' if why else ''} | {r['own_removed']} / {r['own_added']} | "
                   f"{', '.join('`' + f + '`' for f in r['own']) or '(none)'} |")
    return "\n".join(out) + "\n"


def course_block(row):
    """A pair's row of the table, then its train.c diff folded under a summary line: the diff
    as a student copy shows it, each exercise's answer replaced by its stub."""
    text, removed, added = row["student"]
    stubbed = " (as your student copy has them: exercise answers stubbed)" if text != row["train_text"] else ""
    return (table([row]) + "\n<details><summary>The diff: <code>diff -u " + f"{row['from']}/train.c "
            f"{row['to']}/train.c</code>{stubbed} ({removed} lines removed, {added} added)</summary>\n\n"
            "```diff\n" + text + "```\n\n</details>\n")


def course_blocks(rows, text):
    """course.md's text with each marked block holding its pair's row and diff; the numbers of the
    blocks that were not already so (the stale ones)."""
    by_chapter = {r["to"][:2]: r for r in rows}
    stale = []

    def fill(m):
        nn = m.group(2)
        if nn not in by_chapter:
            raise Refusal(f"course.md marks a diff for chapter {nn}, which has no earlier neighbour")
        block = course_block(by_chapter[nn])
        if block != m.group(3):
            stale.append(nn)
        return m.group(1) + block + m.group(4)

    return MARK.sub(fill, text), stale


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    ap.add_argument("--out", help="write each pair's diff into this directory as NN-MM.diff (new or "
                                       "existing; a file there is replaced only if it is an earlier diff)")
    ap.add_argument("--check", action="store_true", help="exit 1 when a train.c diff is over its budget")
    ap.add_argument("--pairs", help="only these neighbour pairs, e.g. 02-03,03-04 (default: all)")
    ap.add_argument("--write-course", action="store_true", help="write each pair's row and diff into course.md's marks")
    ap.add_argument("--check-course", action="store_true", help="exit 1 if course.md's rows or diffs are not current")
    args = ap.parse_args()
    if not os.path.isdir(args.repo):
        raise Refusal(f"--repo {args.repo}: is not a directory (valid: a copy of the course, whose chapter "
                      "folders NN_name hold train.c)")
    rows = pairs(args.repo)
    if not rows:
        raise Refusal(f"--repo {args.repo}: has no two chapters with a train.c (valid: a copy of the course, whose "
                      "chapter folders NN_name hold train.c)")
    if args.pairs:
        wanted = set(args.pairs.split(","))
        known = {f"{r['from'][:2]}-{r['to'][:2]}" for r in rows}
        if wanted - known:
            raise Refusal(f"--pairs names {', '.join(sorted(wanted - known))}, not a neighbour pair "
                          f"(valid: {', '.join(sorted(known))})")
        rows = [r for r in rows if f"{r['from'][:2]}-{r['to'][:2]}" in wanted]
    if args.write_course or args.check_course:
        course = os.path.join(args.repo, "course.md")
        with open(course, encoding="utf-8") as f:
            text = f.read()
        new, stale = course_blocks(rows, text)
        if args.write_course and new != text:
            with open(course, "w", encoding="utf-8") as f:
                f.write(new)
        if args.check_course and new != text:
            print(f"chapter_diffs: course.md's diff rows (chapters {', '.join(stale)}) are not the current ones; "
                  f"run python3 common/python/chapter_diffs.py --write-course", file=sys.stderr)
            return 1
        return 0
    if args.out:
        make_output_dir(args.out, "--out")
        paths = [(os.path.join(args.out, f"{r['from'][:2]}-{r['to'][:2]}.diff"), r) for r in rows]
        for path, _ in paths:  # every file checked before any is written
            check_output_file(path, "--out", "diff chapter_diffs.py wrote", is_chapter_diff)
        for path, r in paths:
            with open(path, "w") as f:
                f.write(r["text"])
    sys.stdout.write(table(rows))
    if args.check:
        bad = [(r, p) for r in rows for p in [over_budget(r)] if p]
        for r, p in bad:
            print(f"chapter_diffs: {r['from']} -> {r['to']}: train.c {' and '.join(p)}; a chapter is the previous "
                  f"one plus its technique (budget: {BUDGET['removed']} removed, {BUDGET['added']} added)",
                  file=sys.stderr)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    run_tool("chapter_diffs: ", main)
