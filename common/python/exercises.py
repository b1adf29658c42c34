#!/usr/bin/env python3
"""exercises.py: write a student copy of the repository with exercises stubbed out.

    python3 common/python/exercises.py DEST [--only ID[,ID...]]     (make exercises DEST=dir [ONLY=01.2])
    python3 common/python/exercises.py --list
    python3 common/python/exercises.py DEST --trace                  (a traced copy: see below)

In the sources, each exercise's reference solution sits between a pair of
marker comments, each alone on its line:

    /* EXERCISE 01.2 BEGIN: the AdamW update (course.md, exercise 01.2) */
    ... reference solution ...
    /* EXERCISE 01.2 END */

In the copy, the lines from BEGIN to END are replaced by a stub that compiles
and fails clearly at run time:

    /* EXERCISE 01.2: the AdamW update. Write your solution here (course.md, exercise 01.2). */
    exercise_not_implemented("01.2", "course.md, exercise 01.2");

A region indented inside a function body gets that stub. A region at file
scope (its BEGIN marker not indented) holds whole definitions, such as the
CUDA kernel that a host function launches: no statement may stand there, so
its stub is the comment alone. Such a region goes with a region in the body
of a host function of the same exercise (exercise_not_implemented runs on
the host, not in a kernel), whose stub fails at run time.

An exercise may have several regions (a forward and a backward function,
say, or a CUDA kernel and the host function that launches it): each is
stubbed, and the exercise is listed once. Every place that computes the
answer needs a region, its CUDA twin too, and a twin is declared in the
exercise's grader (`# twins: FILE FUNCTION...` in tests/grade/ID.bats):
tests/exercise_leaks.py checks that each is stubbed or gone in the copy, and
finds the kernel tables' twins that are not declared.

A traced copy (--trace) keeps every solution and puts a call to
exercise_reached("ID") (util.h) at the top of each region in a function body,
so a run with COURSE_EXERCISE_TRACE=FILE lists the exercises it reaches:
common/python/exercise_deps.py runs each grader that way to find which exercises it
depends on.

Files that test the mechanism itself against the reference solutions (and
make wrong answers by editing them) stay out of the copy: FULL_COPY_ONLY.

The copy also gets a file .student listing the stubbed exercises; the
Makefile then tolerates the unused parameters a stub leaves behind. The
copy is a git repository with one commit, so `git diff` shows the
learner's work and `git checkout -- FILE` takes a file back to its stubs.
Graders: tests/grade/ID.bats, run by `make grade`.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BEGIN = re.compile(r"^(\s*)/\* EXERCISE (\d+\.\d+) BEGIN: (.+?) \((course\.md[^)]*)\) \*/\s*$")
END = re.compile(r"^\s*/\* EXERCISE (\d+\.\d+) END \*/\s*$")
SOURCE_SUFFIXES = (".c", ".h", ".cu", ".cuh")
# tests/tools/exercises.bats needs the reference solutions (it checks that they get
# full marks) and spells out lines of them to break: in a student copy it
# could only fail, and would hand out answers.
FULL_COPY_ONLY = {"tests/tools/exercises.bats"}


def tracked_files():
    """Files of the repository: git's list when available, else a walk without build outputs."""
    try:
        out = subprocess.run(["git", "-C", REPO, "ls-files", "--cached", "--others", "--exclude-standard"],
                             check=True, capture_output=True, text=True).stdout
        return [f for f in out.splitlines() if os.path.isfile(os.path.join(REPO, f))]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for root, dirs, names in os.walk(REPO):
            dirs[:] = [d for d in dirs if d not in (".git", "build", "runs", "__pycache__")]
            files += [os.path.relpath(os.path.join(root, n), REPO) for n in names]
        return files


def stub_regions(text, path, only, trace=False):
    """Return (new text, [ids stubbed]) for one source file (traced: [ids traced])."""
    lines = text.split("\n")
    out, stubbed, i = [], [], 0
    while i < len(lines):
        m = BEGIN.match(lines[i])
        if not m:
            if END.match(lines[i]):
                sys.exit(f"exercises.py: {path}:{i + 1}: END marker without BEGIN")
            out.append(lines[i])
            i += 1
            continue
        indent, ident, title, where = m.groups()
        j = i + 1
        while j < len(lines) and not END.match(lines[j]):
            if BEGIN.match(lines[j]):
                sys.exit(f"exercises.py: {path}:{j + 1}: nested BEGIN inside exercise {ident}")
            j += 1
        if j == len(lines) or END.match(lines[j]).group(1) != ident:
            sys.exit(f"exercises.py: {path}:{i + 1}: exercise {ident} has no matching END marker")
        if only and ident not in only:
            out.extend(lines[i:j + 1])
        elif trace:
            out.append(lines[i])
            if indent:
                out.append(f'{indent}exercise_reached("{ident}");')
            out.extend(lines[i + 1:j + 1])
            stubbed.append(ident)
        elif indent:
            out.append(f"{indent}/* EXERCISE {ident}: {title}. Write your solution here ({where}). */")
            out.append(f'{indent}exercise_not_implemented("{ident}", "{where}");')
            stubbed.append(ident)
        else:
            out.append(f"/* EXERCISE {ident}: {title}. Your kernels and helpers go here ({where}). */")
            stubbed.append(ident)
        i = j + 1
    return "\n".join(out), stubbed


def find_exercises():
    found = {}
    for f in tracked_files():
        if not f.endswith(SOURCE_SUFFIXES):
            continue
        with open(os.path.join(REPO, f), encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                m = BEGIN.match(line)
                if m:
                    found.setdefault(m.group(2), (m.group(3), f, n))
    return found


def commit_copy(dest):
    """Make the copy a git repository with one commit: the stubs, before any of the learner's work."""
    # Name and email on the command line: no global git configuration needed.
    git = ["git", "-C", dest, "-c", "user.name=course exercises", "-c", "user.email=exercises@course.invalid",
           "-c", "commit.gpgsign=false"]
    try:
        for args in (["init", "--quiet"], ["add", "--all"],
                     ["commit", "--quiet", "--no-verify", "-m", "Student copy: exercises stubbed out"]):
            subprocess.run(git + args, check=True, capture_output=True, text=True)
    except OSError as e:
        sys.exit(f"exercises.py: cannot run git to make {dest} a repository: {e}")
    except subprocess.CalledProcessError as e:
        sys.exit(f"exercises.py: git {e.cmd[len(git)]} in {dest} failed: {e.stderr.strip()}")


def main():
    parser = argparse.ArgumentParser(description="Write a student copy with the exercises stubbed out.")
    parser.add_argument("dest", nargs="?", help="directory to create (must not exist or be empty)")
    parser.add_argument("--only", default="", help="comma-separated exercise ids to stub (default: all)")
    parser.add_argument("--list", action="store_true", help="list the exercises and where they are")
    parser.add_argument("--trace", action="store_true",
                        help="keep the solutions, and make each region record that it ran (exercise_deps.py)")
    args = parser.parse_args()

    exercises = find_exercises()
    if args.list:
        for ident in sorted(exercises):
            title, f, n = exercises[ident]
            print(f"{ident}  {title}  ({f}:{n})")
        return
    if not args.dest:
        sys.exit("exercises.py: give a destination directory (make exercises DEST=dir)")
    only = set(filter(None, args.only.split(",")))
    unknown = only - set(exercises)
    if unknown:
        sys.exit(f"exercises.py: unknown exercise(s) {', '.join(sorted(unknown))} "
                 f"(valid: {', '.join(sorted(exercises))})")
    dest = os.path.abspath(args.dest)
    if os.path.exists(dest) and (not os.path.isdir(dest) or os.listdir(dest)):
        sys.exit(f"exercises.py: {dest} exists and is not an empty directory")
    if dest == REPO or dest.startswith(REPO + os.sep):
        sys.exit("exercises.py: DEST must be outside the repository")

    stubbed = []
    for f in tracked_files():
        if f in FULL_COPY_ONLY:
            continue
        src, dst = os.path.join(REPO, f), os.path.join(dest, f)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if f.endswith(SOURCE_SUFFIXES):
            with open(src, encoding="utf-8") as fh:
                text, ids = stub_regions(fh.read(), f, only, args.trace)
            with open(dst, "w", encoding="utf-8") as fh:
                fh.write(text)
            stubbed += ids
        else:
            shutil.copy2(src, dst)
    stubbed = sorted(set(stubbed))
    if args.trace:
        print(f"exercises: wrote a traced copy to {dest} ({len(stubbed)} exercises record when they run)")
        return
    with open(os.path.join(dest, ".student"), "w") as fh:
        fh.write("".join(f"{i}\n" for i in sorted(stubbed)))
    commit_copy(dest)
    print(f"exercises: wrote a student copy to {dest} with {len(stubbed)} exercise(s) stubbed: "
          f"{', '.join(sorted(stubbed)) or 'none'}")
    print("exercises: build it with `make`, grade it with `make grade`; it is a git repository, "
          "so `git diff` shows your work")


if __name__ == "__main__":
    main()
