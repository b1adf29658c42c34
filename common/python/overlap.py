#!/usr/bin/env python3
"""overlap.py: how much of chapter 05's communication ran under computation,
read from the timeline.csv of runs (rank, step, micro, op, start_us, end_us).

    python3 common/python/overlap.py RUN_DIR... [--check-order]

For each run, one line per collective kind (gather, reduce_scatter, ...):
its total time per rank and step, and the share of it that lies under a
computation (fwd or bwd) of the same rank: 100% is fully hidden, 0% ran in
the gaps. Step 1 (warm-up) is left out when the run has more steps.

Stage 3's rows say which unit they are for only through their order. The
worker runs its collectives one at a time, in the order they were queued, so
per rank, step and micro-batch, sorted by start: the i-th backward gather
(after the forward's, one per unit) and the i-th reduce-scatter belong to
the i-th backward computation. --check-order checks the queue order the
schedule promises (zero.h, "Queue order"): with --prefetch K (run.csv's
prefetch), the gather of backward computation i + 1 + K, queued right after
computation i, runs before computation i's reduce-scatter, so that no
computation waits for its weights behind a gradient that could be sent
while it runs. It prints every violation and exits 1 if there is one."""
import argparse
import os
import sys
from collections import defaultdict

from rundir import read, run_row
from tool import run_tool

COMPUTE = ("fwd", "bwd")


def read_timeline(run_dir):
    rows = read(run_dir, "timeline", "the timeline.csv of a chapter 04-06 run", required=True)
    for r in rows:
        r["start"], r["end"] = float(r["start_us"]), float(r["end_us"])
    steps = sorted({int(r["step"]) for r in rows})
    if len(steps) > 1:
        rows = [r for r in rows if int(r["step"]) != steps[0]]
    return rows


def covered(start, end, intervals):
    """Microseconds of [start, end) that lie under the (sorted, disjoint) intervals."""
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in intervals)


def overlap_by_op(rows):
    """{op: (total_us, hidden_us, rank_steps)} over every rank and step."""
    compute = defaultdict(list)
    for r in rows:
        if r["op"] in COMPUTE:
            compute[(r["rank"], r["step"])].append((r["start"], r["end"]))
    for k in compute:
        compute[k].sort()
    totals = defaultdict(lambda: [0.0, 0.0, set()])
    for r in rows:
        if r["op"] in COMPUTE:
            continue
        t = totals[r["op"]]
        t[0] += r["end"] - r["start"]
        t[1] += covered(r["start"], r["end"], compute[(r["rank"], r["step"])])
        t[2].add((r["rank"], r["step"]))
    return {op: (t[0], t[1], len(t[2])) for op, t in totals.items()}


def read_prefetch(run_dir):
    return int(run_row(run_dir, "the run.csv of a chapter 05 run")["prefetch"])


def order_violations(rows, prefetch):
    """Backward computation i whose reduce-scatter ran before the gather of computation i + 1 + prefetch."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r["rank"], r["step"], r["micro"])].append(r)
    bad = []
    for (rank, step, micro), group in sorted(groups.items()):
        bwd = [r for r in group if r["op"] == "bwd"]
        fwd = [r for r in group if r["op"] == "fwd"]
        comm = sorted((r for r in group if r["op"] not in COMPUTE), key=lambda r: r["start"])
        gathers = [r for r in comm if r["op"] == "gather"][len(fwd):]  # the backward's
        scatters = [r for r in comm if r["op"] == "reduce_scatter"]
        for i in range(min(len(scatters), len(gathers) - 1 - prefetch)):
            g = gathers[i + 1 + prefetch]
            if g["start"] >= scatters[i]["start"]:
                bad.append(f"rank {rank} step {step} micro {micro}: backward computation {i + 1 + prefetch}'s "
                           f"gather started at {g['start'] / 1e3:.2f} ms, after the reduce-scatter of "
                           f"computation {i} ({scatters[i]['start'] / 1e3:.2f} ms)")
    return bad


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run directories with a timeline.csv")
    parser.add_argument("--check-order", action="store_true",
                        help="fail when a backward gather ran behind an earlier unit's reduce-scatter")
    args = parser.parse_args()
    failed = False
    for run in args.runs:
        rows = read_timeline(run)
        label = os.path.basename(os.path.normpath(run))
        for op, (total, hidden, n) in sorted(overlap_by_op(rows).items()):
            share = 100.0 * hidden / total if total else 0.0
            print(f"{label}: {op:15s} {total / 1e3 / n:8.2f} ms per rank and step, {share:5.1f}% under computation")
        if args.check_order:
            bad = order_violations(rows, read_prefetch(run))
            for line in bad:
                print(f"{label}: {line}")
            failed = failed or bool(bad)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    run_tool("overlap.py: ", main)
