#!/usr/bin/env python3
"""include_graph.py: the course's C and CUDA files as layers, and the checks that keep them so.

    python3 common/python/include_graph.py            check: exit 1, naming each problem
    python3 common/python/include_graph.py --map      print who includes each folder's headers
    python3 common/python/include_graph.py --repo DIR check another copy (the tests plant faults in one)

The library in common/ is six folders, each allowed to include only itself and the
folders before it:

    core < device < kernels < model < comm < run

then common/tools, then the chapters in order (chapter N may use the modules of
chapters 01..N, never a later one's), then tests/. A module is a header and the files
that implement it (X.h with X.c, X_cpu.c, X_cuda.cu). Two problems are reported:
  * an include that goes up: a file including a header of a later layer or chapter;
  * a cycle between modules (a.c includes b.h while b.c includes a.h), even within
    one folder: following the includes from any module must never come back to it.
Every include of a project header names it from the repository root, the one
include path (`#include "common/run/harness.h"`, `#include "03_model_parallel/tensor_parallel.h"`),
so a reader sees where it comes from, and says in a comment what it brings
(`/* the run around the training loop */`): a bare name or an include without its
comment is reported too. System headers (<...>) and headers found nowhere in the tree
(cuda_runtime.h, mpi.h) are not part of the graph.
"""
import argparse
import os
import re
import sys

LAYERS = ["core", "device", "kernels", "model", "comm", "run"]
SOURCE_ENDINGS = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"(.*)$', re.M)
COMMENTED = re.compile(r'^\s*/\*\s*\S.*\*/\s*$')


def layer_of(path):
    """(rank, name) of a file's place in the order; None for files outside it."""
    parts = path.split("/")
    if parts[0] == "common" and len(parts) == 3 and parts[1] in LAYERS:
        return LAYERS.index(parts[1]), "common/" + parts[1]
    if parts[0] == "common" and len(parts) == 3 and parts[1] == "tools":
        return len(LAYERS), "common/tools"
    m = re.match(r"0(\d)_", parts[0])
    if m and len(parts) == 2:
        return 10 + int(m.group(1)), parts[0]
    if parts[0] == "tests" and len(parts) == 2:
        return 100, "tests"
    return None


def module_of(path):
    stem = os.path.splitext(os.path.basename(path))[0]
    return os.path.dirname(path) + "/" + re.sub(r"_(cpu|cuda)$", "", stem)


def sources(repo):
    found = []
    for top in ["common"] + sorted(d for d in os.listdir(repo) if re.match(r"0\d_", d)) + ["tests"]:
        for dirpath, _, files in os.walk(os.path.join(repo, top)):
            for f in files:
                if f.endswith(SOURCE_ENDINGS):
                    found.append(os.path.relpath(os.path.join(dirpath, f), repo))
    return sorted(found)


def build(repo):
    """Files, their layers, and the include edges (file -> header path)."""
    files = [f for f in sources(repo) if layer_of(f) is not None]
    problems = []
    headers = {f for f in files if f.endswith((".h", ".cuh"))}
    by_name = {}
    for h in sorted(headers):
        by_name.setdefault(os.path.basename(h), []).append(h)
    edges = []
    for f in files:
        with open(os.path.join(repo, f), encoding="utf-8", errors="replace") as fh:
            for name, rest in INCLUDE.findall(fh.read()):
                if name in headers:
                    target = name
                elif os.path.basename(name) in by_name:
                    choices = " or ".join(by_name[os.path.basename(name)])
                    problems.append(f'{f} includes "{name}": name it from the repository root ({choices})')
                    target = by_name[os.path.basename(name)][0]
                else:
                    continue  # not the course's (a header of the system or a library)
                if not COMMENTED.match(rest):
                    problems.append(f'{f} includes "{name}" without a comment saying what it brings '
                                    f'(#include "{name}" /* ... */)')
                if target != f:
                    edges.append((f, target))
    return files, edges, problems


def upward(edges):
    out = []
    for f, h in edges:
        (rf, lf), (rh, lh) = layer_of(f), layer_of(h)
        if rh > rf:
            out.append(f"{f} includes {os.path.basename(h)} of {lh}: {lf} may use only "
                       f"{'earlier layers' if rf < 10 else 'common/ and chapters up to its own'} (order: "
                       f"{' < '.join(LAYERS)} < tools < chapters < tests)")
    return out


def cycles(edges):
    graph = {}
    for f, h in edges:
        a, b = module_of(f), module_of(h)
        if a != b:
            graph.setdefault(a, set()).add(b)
    out, state, stack = [], {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                loop = stack[stack.index(n):] + [n]
                out.append("include cycle: " + " -> ".join(loop))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return out


def print_map(files, edges):
    users = {}
    for f, h in edges:
        if layer_of(f)[1] != layer_of(h)[1]:
            users.setdefault(h, set()).add(layer_of(f)[1])
    for f in files:
        if f.endswith((".h", ".cuh")) and f.startswith("common/"):
            print(f"{f:40} used by {', '.join(sorted(users.get(f, ()))) or 'its own folder only'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    ap.add_argument("--map", action="store_true", help="print which folders include each header of common/")
    args = ap.parse_args()
    files, edges, problems = build(args.repo)
    if args.map:
        print_map(files, edges)
        return 0
    problems += upward(edges) + cycles(edges)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"include_graph: {len(problems)} problem(s) in {len(files)} files", file=sys.stderr)
        return 1
    print(f"include_graph: {len(files)} files, {len(edges)} includes, every one down the layers, no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
