#!/usr/bin/env python3
"""demo_tables.py: the tables course.md quotes from a `make demo`, printed from its CSV files.

    python3 common/python/demo_tables.py [RUNS_DIR]        (default runs/demo)

Prints, in markdown, the step-time breakdown of chapters 01 and 02, the
busy/idle table of chapter 03, and the pipeline sweep of chapter 04, computed
the way the text says: medians over the steps of all repeats of a
configuration, the first (warm-up) step of each run left out; bubbles and
memory from run.csv and memory.csv (stage 0). Sections whose runs are missing
are skipped.
"""
import glob
import os
import sys

from rundir import after_warmup, median_of, read, repeats, run_row
from tool import median, run_tool

STEPS, RUN = "the steps.csv of a make demo run", "the run.csv of a make demo run"


def steps(runs, label):
    """The steps.csv rows of every repeat of label, each run's warm-up step left out."""
    rows = []
    for run in repeats(runs, label):
        rows += after_warmup(read(run, "steps", STEPS))
    return rows


def fmt(x, spec=".1f", missing="-"):
    return missing if x is None else format(x, spec)


def chapter02(runs):
    labels = [("01-small", "01, one process")] + [
        (os.path.basename(d).rsplit(".r", 1)[0], None)
        for d in sorted(glob.glob(os.path.join(runs, "02-dp*-*.r1")))]
    if len(labels) == 1:
        return
    print("| configuration | step | forward | backward | optimizer | comm_ms | comm_busy_ms |")
    print("|---|---|---|---|---|---|---|")
    for label, name in labels:
        rows = steps(runs, label)
        if not rows:
            continue
        print(f"| {name or label} | {fmt(median_of(rows, 'step_ms'))} ms | {fmt(median_of(rows, 'fwd_ms'))} | "
              f"{fmt(median_of(rows, 'bwd_ms'))} | {fmt(median_of(rows, 'opt_ms'))} | {fmt(median_of(rows, 'comm_ms'))} | "
              f"{fmt(median_of(rows, 'comm_busy_ms'))} |")
    print()


def chapter03(runs):
    labels = sorted(os.path.basename(d).rsplit(".r", 1)[0] for d in glob.glob(os.path.join(runs, "03-*.r1")))
    if not labels:
        return
    print("| configuration | step | forward | backward | comm_ms | rank 0 idle | rank 1 idle |")
    print("|---|---|---|---|---|---|---|")
    for label in ["01-small"] + labels:
        rows = steps(runs, label)
        idle = {}
        for run in repeats(runs, label):
            for r in read(run, "busy", "the busy.csv of a make demo run of chapter 03") or []:
                if int(r["step"]) > 1:
                    idle.setdefault(r["rank"], []).append(1 - float(r["busy_ms"]) / float(r["step_ms"]))
        ranks = [f"{100 * median(idle[r]):.0f}%" if r in idle else "-" for r in ("0", "1")]
        print(f"| {label} | {fmt(median_of(rows, 'step_ms'))} ms | {fmt(median_of(rows, 'fwd_ms'))} | "
              f"{fmt(median_of(rows, 'bwd_ms'))} | {fmt(median_of(rows, 'comm_ms'))} | {ranks[0]} | {ranks[1]} |")
    print()


def chapter04(runs):
    micros = sorted({int(os.path.basename(d).split("-m")[1].split(".")[0])
                     for d in glob.glob(os.path.join(runs, "04-gpipe-m*.r1"))})
    if not micros:
        return

    def of(schedule, m):
        label = f"04-{schedule}-m{m}"
        runs_csv = [run_row(d, RUN) for d in repeats(runs, label)]
        memory = [r for r in read(os.path.join(runs, label + ".r1"), "memory", "the memory.csv of a make demo run")
                  if r["rank"] == "0" and r["space"] == "device" and r["category"] == "activations"]
        return (median(float(r["median_step_ms"]) for r in runs_csv),
                median(float(r["bubble_measured"]) for r in runs_csv),
                float(runs_csv[0]["bubble_theory"]), float(memory[0]["peak_bytes"]) / 1e6)

    print("| M | GPipe step | 1F1B step | bubble GPipe | bubble 1F1B | formula | stage-0 activations GPipe | 1F1B |")
    print("|---|---|---|---|---|---|---|---|")
    for m in micros:
        g, f = of("gpipe", m), of("1f1b", m)
        print(f"| {m} | {g[0]:.1f} ms | {f[0]:.1f} ms | {g[1]:.3f} | {f[1]:.3f} | {g[2]:.3f} | {g[3]:.1f} MB | "
              f"{f[3]:.1f} MB |")
    print()


def main():
    runs = sys.argv[1] if len(sys.argv) > 1 else "runs/demo"
    if not os.path.isdir(runs):
        sys.exit(f"demo_tables: {runs} does not exist (run make demo first)")
    for name, table in (("chapter 02", chapter02), ("chapter 03", chapter03), ("chapter 04", chapter04)):
        print(f"{name} (from {runs}):\n")
        table(runs)


if __name__ == "__main__":
    run_tool("demo_tables.py: ", main)
