#!/usr/bin/env python3
"""exercise_deps.py: which other exercises each grader needs, measured, and course.md's lines about it.

    python3 common/python/exercise_deps.py            print the dependency lines of every chapter
    python3 common/python/exercise_deps.py --check    exit 1 if course.md's lines differ from them
    python3 common/python/exercise_deps.py --write    put them into course.md

A grader needs exercise X when its runs reach X's code: in a student copy,
X's stub ends them (and grade.sh marks the grader "depends on X"). Written by
hand, such lists drift as the code moves (a trainer starts to call a kernel,
a test to compare with a path that calls it). So they are measured: a traced
copy of the repository (exercises.py --trace) keeps every solution and has
each exercise region record, in the file COURSE_EXERCISE_TRACE names, that it
ran; each grader runs once on that copy, with the reference solutions, and
what its runs reached, less its own exercise, is what it depends on.

course.md holds the result in each chapter's Exercises section, between
    <!-- exercise dependencies NN: ... -->  and  <!-- end exercise dependencies NN -->
The lines depend on the CPU in one place: chapter 06's host AdamW runs
exercise 06.1's vector loops only on a CPU with AVX2 (CONDITIONS); elsewhere
this measures less, and --check refuses to compare.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COURSE = os.path.join(REPO, "course.md")
# An exercise whose code a run reaches only on some machines, and which.
CONDITIONS = {"06.1": "on a CPU with AVX2"}
BLOCK = re.compile(r"(<!-- exercise dependencies (\d\d): [^>]*-->\n)(.*?)(<!-- end exercise dependencies \2 -->)",
                   re.S)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def measure():
    """{grader id: set of other exercise ids its runs reach}."""
    with tempfile.TemporaryDirectory(prefix="exercise-deps-") as tmp:
        copy = os.path.join(tmp, "copy")
        r = run([sys.executable, os.path.join(REPO, "common", "python", "exercises.py"), copy, "--trace"])
        if r.returncode:
            sys.exit(f"exercise_deps.py: making the traced copy failed:\n{r.stderr}")
        r = run(["make", "-C", copy, "--no-print-directory", "-j2", "CUDA=0", "OPT=-O1", "all"])
        if r.returncode:
            sys.exit(f"exercise_deps.py: building the traced copy failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
        graders = sorted(f[:-5] for f in os.listdir(os.path.join(copy, "tests", "grade")) if f.endswith(".bats"))
        deps = {}
        for ident in graders:
            trace = os.path.join(tmp, ident + ".trace")
            env = dict(os.environ, COURSE_EXERCISE_TRACE=trace, OMP_NUM_THREADS="1")
            r = run(["bats", os.path.join(copy, "tests", "grade", ident + ".bats")], env=env)
            if r.returncode:
                sys.exit(f"exercise_deps.py: the reference solution fails grader {ident}:\n{r.stdout[-3000:]}")
            reached = set(open(trace).read().split()) if os.path.exists(trace) else set()
            deps[ident] = reached - {ident}
        return deps


def listing(ids):
    ids = [f"{i} ({CONDITIONS[i]})" if i in CONDITIONS else i for i in sorted(ids)]
    return ids[0] if len(ids) == 1 else ", ".join(ids[:-1]) + " and " + ids[-1]


def chapter_lines(deps, chapter):
    """The text between one chapter's markers."""
    lines = []
    for ident in sorted(i for i in deps if i.startswith(chapter + ".")):
        if deps[ident]:
            lines.append(f"- {ident}: do {listing(deps[ident])} first (its grader's runs reach "
                         f"{'it' if len(deps[ident]) == 1 else 'them'}).")
        else:
            lines.append(f"- {ident}: graded on its own.")
    return "".join(line + "\n" for line in lines)


def main():
    parser = argparse.ArgumentParser(description="Measure which exercises each grader needs.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if course.md's lines differ")
    mode.add_argument("--write", action="store_true", help="write the lines into course.md")
    args = parser.parse_args()

    deps = measure()
    chapters = sorted({i[:2] for i in deps})
    if not (args.check or args.write):
        for ch in chapters:
            print(f"chapter {ch}:\n{chapter_lines(deps, ch)}", end="")
        return
    text = open(COURSE, encoding="utf-8").read()
    found = {m.group(2) for m in BLOCK.finditer(text)}
    if found != set(chapters):
        sys.exit(f"exercise_deps.py: course.md has dependency markers for chapters {sorted(found)}, "
                 f"the graders are of chapters {chapters}")
    new = BLOCK.sub(lambda m: m.group(1) + chapter_lines(deps, m.group(2)) + m.group(4), text)
    if args.write:
        with open(COURSE, "w", encoding="utf-8") as fh:
            fh.write(new)
        print("exercise_deps: course.md's dependency lines written")
        return
    if new != text:
        for m in BLOCK.finditer(text):
            want = chapter_lines(deps, m.group(2))
            if m.group(3) != want:
                print(f"chapter {m.group(2)}: course.md says\n{m.group(3)}the graders' runs say\n{want}")
        sys.exit(1)
    print("exercise_deps: course.md's dependency lines are those the graders' runs reach")


if __name__ == "__main__":
    main()
