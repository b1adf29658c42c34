#!/usr/bin/env python3
"""plot.py: draw the course's plots from run directories (steps.csv, memory.csv, run.csv).

    python3 common/python/plot.py RUN_DIR... [--out DIR]
    python3 common/python/plot.py --commbench CSV... [--out DIR]
    python3 common/python/plot.py --gantt RUN_DIR... [--step N] [--out DIR]
    python3 common/python/plot.py --sweep RUN_DIR... [--out DIR]
    python3 common/python/plot.py --bubbles RUN_DIR... [--out DIR]
    python3 common/python/plot.py --zero RUN_DIR... [--out DIR]
    python3 common/python/plot.py --precision RUN_DIR... [--out DIR]
    python3 common/python/plot.py --offload RUN_DIR... [--step N] [--out DIR]
    python3 common/python/plot.py --capacity CSV [--out DIR]
    python3 common/python/plot.py --offload-bench SUMMARY_CSV [--out DIR]
    python3 common/python/plot.py --plan RUN_DIR... [--out DIR]
    python3 common/python/plot.py --grid RUN_DIR... [--out DIR]

Reads only the CSVs that every chapter program writes, so a learner can plot
their own runs next to the demo's. A run's label is its directory name;
directories named LABEL.rN (N = 1, 2, ...) are repeats of one configuration:
runtime bars show their median with min-max error bars, and loss curves use
the first repeat.

Anything it cannot draw (a file missing, empty, cut short or of another kind, a
column the mode needs) is refused in one line naming the file and what the mode
reads, exit status 2. --out is a new name or a directory; a PNG there is
replaced only if it is plot.py's own earlier plot (a PNG matplotlib wrote),
never another file (common/python/tool.py).

Plots written to --out (default runs/plots):
    loss.png        loss curves overlaid (they must coincide across chapters)
    runtime.png     median step time per configuration, with error bars
    throughput.png  tokens/s per configuration, with error bars
    memory.png      peak memory per rank, stacked by category (device space)
    breakdown.png   median step time split into forward, backward, optimizer,
                    exposed communication (comm_ms: the time the step waited
                    on it) and other (the rest of the step), so that
                    each bar adds up to the median step time, marked on it;
                    where the parts overlap (pipeline stages count their
                    waits in forward and backward) the bar says by how much
    idle.png        (runs with a busy.csv, chapter 03) per rank, the median time
                    per step spent computing and the rest: waiting or communicating
With --cp, from chapter 03's --cp runs labelled 03-cpN-seqT:
    cp_memory.png   rank 0's activation bytes against the sequence length, one
                    line per cp, measured (memory.csv) and the formula (dashed)
With --commbench, from 02_data_parallel/commbench CSVs:
    busbw.png       bus bandwidth against message size, one line per operation
With --gantt, from timeline.csv (chapters 04 and 05, and chapter 03's --cp ring):
    gantt-LABEL.png what each rank did during one step (default: the last):
                    pipeline runs: forward and backward boxes numbered by
                    micro-batch; ZeRO runs: per rank a row of computation
                    and a row of communication (gathers, reduce-scatters)
With --zero, from chapter 05 runs (run.csv's zero, world_size, params,
bytes_sent_per_step; memory.csv):
    zero.png        per ZeRO stage: the model state per rank (params, grads,
                    optimizer; the largest rank) stacked by category next to
                    the ZeRO paper's formula (fp32: 16, 8 + 8/N, 4 + 12/N,
                    16/N bytes per parameter; bf16/fp16 by run.csv's
                    precision: 16, 4 + 12/N, 2 + 14/N, 16/N), the bytes each
                    rank sends per step next to an all-reduce's 2(N-1)/N x 4
                    (16-bit: 2) bytes per parameter (1.5x that at stage 3),
                    and the median step time
With --precision, from runs of one configuration in fp32, bf16 and fp16
(labelled by their directory names, e.g. 01-small-bf16):
    precision.png   the loss curves overlaid (left: they stay close, not
                    equal), each run's relative difference from the first
                    run's loss (middle; give fp32 first), and the device
                    memory of each run stacked by category (right), each of
                    params, grads and optimizer labelled with its bytes per
                    parameter (4, 4, 8 in fp32; 2, 2, 12 in 16 bits) from
                    memory.csv and run.csv's params
With --offload, from chapter 06 runs' timeline.csv:
    offload-LABEL.png  one step of each rank on four rows: compute (forward
                    and backward), gradient copies to the host (one per unit),
                    the CPU's AdamW, weight copies back to the device
With --capacity, from 06_offload/capacity.py's capacity.csv:
    capacity.png    the most parameters each program trains against the
                    device budget, with the ratio 06 / 01 at each budget
With --offload-bench, from common/scripts/bench_offload.sh's offload_summary.csv:
    offload.png     the median step time of each configuration (1 rank: 01,
                    06 --offload with and without --dpu; 4 ranks: 04, 05's
                    stage 2, the combined 06 with and without --dpu), with
                    min-max bars and each one's peak device and host MiB
With --sweep, from pipeline runs' run.csv (columns schedule, micro,
median_step_ms, bubble_measured, bubble_theory):
    sweep.png       against the number of micro-batches, one line per
                    schedule: the step time (each repeat a dot, the line
                    through the fastest repeat, the least disturbed by
                    background load), and the measured bubble of that repeat
                    next to the formula (bubble_theory)
With --plan, from run directories that also hold common/plan's plan.csv
(--csv) and plan-time.csv (--time-csv, on a machine file); those without
(a layout the planner refuses) are left out and named:
    plan.png        the measured median step time against the predicted one,
                    with the band of tests/tools/plan_time.bats (predicted at most
                    1.5x the measured median; at least 0.1x, which the test
                    holds against the fastest step), and the
                    measured peak device bytes of the fullest rank against the
                    planned ones
With --grid, from a pipeline run of several axes (chapter 04's pp x tp x dp;
run.csv's dp, tp, pp and bytes_AXIS_per_step; memory.csv):
    grid-LABEL.png  every rank's peak device memory stacked by category,
                    each bar named by the rank's place in the grid (stage,
                    tp rank, replica), next to the bytes each axis of the
                    grid sent per step, all ranks together; the first repeat
With --bubbles, from pipeline runs' run.csv (columns schedule, pp, micro,
bubble_measured, bubble_theory) and, for zb-h1, timeline.csv:
    bubbles.png     one bar per configuration (the directory's label): the
                    measured bubble (median over repeats, min-max bars,
                    each repeat a dot) next to its schedule's formula
                    (bubble_theory: zb-h1's with F = B = W); for zb-h1 also
                    the formula at the forward, B and W times the run
                    measured (timeline.csv's fwd, bwd_input, bwd_weight,
                    medians over its steps after the first); for every
                    schedule with a timeline, the schedule replayed with
                    each computation's own time and messages taking none
                    (pipeline_bubble.timeline_replay, median over repeats):
                    the theory at the run's own times, so that the bar's
                    excess over it is what messages and waits add
"""
import argparse
import os
import re
import sys
from collections import OrderedDict

from pipeline_bubble import timeline_replay, zb_h1_formula_measured
from tool import Refusal, check_output_file, is_matplotlib_png, make_output_dir, median, read_csv, run_tool

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator
except ImportError as e:  # before any argument is read: the one thing every mode needs
    print(f"plot.py: this python3 cannot import matplotlib ({e}) (valid: a python3 with matplotlib, "
          "which common/scripts/install-deps.sh installs)", file=sys.stderr)
    sys.exit(2)

CATEGORIES = ["params", "grads", "optimizer", "activations", "comm", "workspace", "gathered", "buckets"]
COLOURS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868",
           "activations": "#c44e52", "comm": "#8172b3", "workspace": "#937860",
           "gathered": "#da8bc3", "buckets": "#8c8c8c"}


# What each mode reads, for the "(valid: ...)" of a refusal (tool.read_csv)
RUN_DIRECTORY = "a run directory written by a chapter program"
TIMELINE_RUN = "a run of chapter 03 with --cp, or of chapter 04, 05 or 06: they write timeline.csv"
MODE_INPUT = {"gantt": TIMELINE_RUN, "offload": "a run of chapter 06 (it writes timeline.csv)",
              "sweep": "a pipeline run of chapter 04", "bubbles": "a pipeline run of chapter 04",
              "zero": "a run of chapter 05", "cp": "a run of chapter 03 with --cp, labelled 03-cpN-seqT",
              "grid": "a run of chapter 04 or 05's pipeline",
              "commbench": "a CSV written by 02_data_parallel/commbench",
              "capacity": "the capacity.csv of 06_offload/capacity.py",
              "offload_bench": "the offload_summary.csv of common/scripts/bench_offload.sh"}
PLAN_FILES = "common/plan's --csv and --time-csv of the run's layout"


def refuse(message):
    """A request the runs cannot answer (a step they do not have): one line and exit status 2 (run_tool)."""
    raise Refusal(message)


def save(fig, out, name):
    """Write the figure as out/name, which must be a new name or a PNG matplotlib wrote (an earlier
    plot; tool.check_output_file), and close it."""
    path = os.path.join(out, name)
    check_output_file(path, "--out", "PNG plot.py wrote", is_matplotlib_png)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def label_of(run_dir):
    """(label, repeat index) from a directory name such as 'small.r2'."""
    name = os.path.basename(os.path.normpath(run_dir))
    m = re.fullmatch(r"(.+)\.r(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else (name, 1)


class Run(dict):
    """A run directory: run["dir"], run["repeat"], and the rows of its steps.csv, memory.csv,
    run.csv and busy.csv (None without one) as run["steps"], ... read when a plot first asks
    for them, so that a mode needs only the files it draws. A file missing or not one a chapter
    program writes is refused in one line naming valid, what the mode reads (tool.read_csv)."""

    def __init__(self, run_dir, repeat, valid):
        super().__init__(dir=run_dir, repeat=repeat)
        self.valid = valid

    def __missing__(self, name):
        if name not in ("steps", "memory", "run", "busy"):
            raise KeyError(name)
        path = os.path.join(self["dir"], name + ".csv")
        self[name] = None if name == "busy" and not os.path.exists(path) else read_csv(path, self.valid)
        return self[name]


def load_runs(dirs, valid=RUN_DIRECTORY):
    """OrderedDict label -> list of runs (Run); valid: what the mode reads, named when a file is
    missing or not one a chapter program writes."""
    groups = OrderedDict()
    for d in dirs:
        label, repeat = label_of(d)
        groups.setdefault(label, []).append(Run(d, repeat, valid))
    for runs in groups.values():
        runs.sort(key=lambda r: r["repeat"])
    return groups


def bars_with_spread(ax, groups, column, ylabel, title):
    labels, mids, lows, highs = [], [], [], []
    for label, runs in groups.items():
        values = [float(r["run"][0][column]) for r in runs]
        m = median(values)
        labels.append(label)
        mids.append(m)
        lows.append(m - min(values))
        highs.append(max(values) - m)
    x = range(len(labels))
    ax.bar(x, mids, yerr=[lows, highs], capsize=5, color="#4c72b0")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    for xi, m, hi in zip(x, mids, highs):
        ax.annotate(f"{m:.3g}", (xi, m + hi), textcoords="offset points", xytext=(0, 4), ha="center", fontsize=8)


def plot_loss(groups, out):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    styles = ["-", "--", ":", "-."]
    for i, (label, runs) in enumerate(groups.items()):
        steps = runs[0]["steps"]
        ax.plot([int(s["step"]) for s in steps], [float(s["loss"]) for s in steps],
                styles[i % len(styles)], label=label, linewidth=1.5)
        val = [(int(s["step"]), float(s["val_loss"])) for s in steps if s.get("val_loss")]
        if val:
            ax.plot(*zip(*val), "o", markersize=4, color=ax.lines[-1].get_color(),
                    label=f"{label} (validation)")
    ax.set_xlabel("optimizer step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("loss (mean cross-entropy, nats per byte)")
    ax.set_title("Loss curves: the same model, seed and data give the same curve")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, out, "loss.png")


def plot_bars(groups, out, column, ylabel, title, filename):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    bars_with_spread(ax, groups, column, ylabel, title)
    fig.tight_layout()
    save(fig, out, filename)


def plot_memory(groups, out):
    """One bar per (configuration, rank), stacked by category, device space."""
    bars = []  # (label, {category: MiB})
    for label, runs in groups.items():
        by_rank = OrderedDict()
        for row in runs[0]["memory"]:
            if row["space"] != "device":
                continue
            by_rank.setdefault(int(row["rank"]), {})[row["category"]] = int(row["peak_bytes"]) / 2**20
        for rank, cats in by_rank.items():
            bars.append((label if len(by_rank) == 1 else f"{label}\nrank {rank}", cats))
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(bars) + 2), 4.5))
    bottom = [0.0] * len(bars)
    for cat in CATEGORIES:
        heights = [cats.get(cat, 0.0) for _, cats in bars]
        if not any(heights):
            continue
        ax.bar(range(len(bars)), heights, bottom=bottom, label=cat, color=COLOURS[cat])
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([b[0] for b in bars], fontsize=8)
    ax.set_ylabel("peak device memory (MiB)")
    ax.set_title("Where device memory goes: peak bytes per rank, by category")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, out, "memory.png")


def breakdown_parts(runs):
    """Median ms per step of forward, backward, optimizer, exposed communication,
    and 'other' = step - their sum: the rest of the step (data loading, the
    loss read-back, waits that no part counts). The first step (warm-up) is left
    out. When the parts overlap (a pipeline stage's forward and backward include
    its waits for messages), 'other' is negative: returned as it is, so that the
    plot can say so instead of stacking past the step."""
    samples = {key: [] for key in ("fwd_ms", "bwd_ms", "opt_ms", "exposed", "step_ms")}
    for run in runs:
        for row in run["steps"][1:] or run["steps"]:
            samples["exposed"].append(float(row["comm_ms"]))
            for key in ("fwd_ms", "bwd_ms", "opt_ms", "step_ms"):
                samples[key].append(float(row[key]))
    parts = {key: median(values) for key, values in samples.items()}
    parts["other"] = parts["step_ms"] - sum(parts[k] for k in ("fwd_ms", "bwd_ms", "opt_ms", "exposed"))
    return parts


def plot_breakdown(groups, out):
    """Stacked median times per configuration, with 'other' so that the bars add up to the
    median step time (marked on each bar)."""
    parts = [("fwd_ms", "forward", "#4c72b0"), ("bwd_ms", "backward", "#dd8452"),
             ("opt_ms", "optimizer", "#55a868"), ("exposed", "exposed communication", "#c44e52"),
             ("other", "other (the rest of the step)", "#b0b0b0")]
    labels = list(groups)
    values = [breakdown_parts(runs) for runs in groups.values()]
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(labels) + 2), 4.5))
    bottom = [0.0] * len(labels)
    for key, name, colour in parts:
        heights = [max(v[key], 0.0) for v in values]
        ax.bar(range(len(labels)), heights, bottom=bottom, label=name, color=colour)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for i, v in enumerate(values):
        ax.plot([i - 0.45, i + 0.45], [v["step_ms"]] * 2, color="black", linewidth=1.5,
                label="median step time" if i == 0 else None)
        if v["other"] < 0:  # the parts overlap: say by how much instead of hiding it
            ax.annotate(f"parts overlap\nby {-v['other']:.1f} ms", (i, bottom[i]), ha="center", va="bottom",
                        fontsize=7)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right")
    ax.set_ylabel("median time per step (ms)")
    ax.set_title("Where a step's time goes: compute vs communication not hidden by it")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, out, "breakdown.png")


def plot_idle(groups, out):
    """Per rank: median busy time per step and the rest of the step (first step left out)."""
    bars = []  # (label, busy ms, idle ms)
    for label, runs in groups.items():
        per_rank = OrderedDict()
        for run in runs:
            for row in run["busy"] or []:
                if int(row["step"]) == 1 and len(run["steps"]) > 1:
                    continue
                busy, step = float(row["busy_ms"]), float(row["step_ms"])
                per_rank.setdefault(int(row["rank"]), []).append((busy, step - busy))
        for rank, samples in per_rank.items():
            bars.append((f"{label}\nrank {rank}", median([b for b, _ in samples]), median([i for _, i in samples])))
    if not bars:
        return False
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(bars) + 2), 4.5))
    x = range(len(bars))
    ax.bar(x, [b for _, b, _ in bars], label="busy: computing", color="#4c72b0")
    ax.bar(x, [i for _, _, i in bars], bottom=[b for _, b, _ in bars], label="idle: waiting or communicating",
           color="#bbbbbb")
    for xi, (_, b, i) in zip(x, bars):
        ax.annotate(f"{100 * i / (b + i):.0f}% idle", (xi, b + i), textcoords="offset points", xytext=(0, 4),
                    ha="center", fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels([b[0] for b in bars], fontsize=8)
    ax.set_ylabel("median time per step (ms)")
    ax.set_title("Busy and idle time per rank (busy.csv)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, out, "idle.png")
    return True


def plot_commbench(paths, out):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for path in paths:
        rows = read_csv(path, MODE_INPUT["commbench"])
        for op in OrderedDict((r["op"], None) for r in rows):
            pts = [(int(r["size_bytes"]), float(r["busbw_GBps"])) for r in rows if r["op"] == op]
            ranks = rows[0]["ranks"]
            ax.plot(*zip(*pts), "o-", label=f"{op} ({ranks} ranks)", markersize=4)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("Collective bus bandwidth vs message size (latency-bound left, bandwidth-bound right)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, out, "busbw.png")
    print(f"plot.py: wrote busbw.png to {out}")


GANTT_COLOURS = {"fwd": "#4c72b0", "bwd": "#dd8452", "bwd_input": "#dd8452", "bwd_weight": "#c44e52",
                 "gather": "#55a868", "reduce_scatter": "#8172b3", "allreduce": "#8172b3", "allgather": "#55a868",
                 "attn_fwd": "#4c72b0", "attn_bwd": "#dd8452", "kv_wait": "#b0b0b0", "dkv_wait": "#b0b0b0",
                 "kv_send": "#55a868", "dkv_send": "#8172b3"}
# chapter 03's context-parallel ring (context_parallel.h): its blocks and waits, and its sends in flight
RING_COMPUTE = ("attn_fwd", "attn_bwd", "kv_wait", "dkv_wait")
# the computations of a timeline: forward, backward, or zero bubble's B and W (04_pipeline/schedule.h)
GANTT_COMPUTE = ("fwd", "bwd", "bwd_input", "bwd_weight")


def timeline_step(run_dir, step):
    """(step, its rows of timeline.csv, the ranks in them); step None: the last. A step the run
    does not have ends the program with one line and exit status 2."""
    path = os.path.join(run_dir, "timeline.csv")
    rows = read_csv(path, TIMELINE_RUN)
    steps = sorted({int(r["step"]) for r in rows})
    if step is None:
        step = steps[-1]
    if step not in steps:
        refuse(f"--step {step}: {path} has no step {step} (valid: {steps[0]}..{steps[-1]}, or no --step for the last)")
    rows = [r for r in rows if int(r["step"]) == step]
    return step, rows, sorted({int(r["rank"]) for r in rows})


def grid_place(run_row, rank):
    """(stage, tp rank, replica) of a world rank: grid.h's order, tp fastest, then pp, then dp."""
    tp, pp = int(run_row.get("tp") or 1), int(run_row.get("pp") or 1)
    return rank // tp % pp, rank % tp, rank // (tp * pp)


GRID_AXES = ("dp", "pp", "cp", "tp")


def plot_grid(groups, out):
    """Per configuration: memory per rank by category, and the bytes per step of each grid axis."""
    names = []
    for label, runs in groups.items():
        run = runs[0]
        row = run["run"][0]
        missing = [a for a in GRID_AXES if f"bytes_{a}_per_step" not in row]
        if missing:
            refuse(f"{run['dir']}/run.csv has no bytes_{missing[0]}_per_step (valid: a run of chapter 04 or 05's pipeline)")
        by_rank = OrderedDict()
        for m in run["memory"]:
            if m["space"] == "device":
                by_rank.setdefault(int(m["rank"]), {})[m["category"]] = int(m["peak_bytes"]) / 2**20
        fig, (ax_mem, ax_bytes) = plt.subplots(1, 2, figsize=(max(10, 1.0 * len(by_rank) + 5), 4.5),
                                               gridspec_kw={"width_ratios": [max(2, len(by_rank)), 2]})
        ranks = list(by_rank)
        bottom = [0.0] * len(ranks)
        for cat in CATEGORIES:
            heights = [by_rank[r].get(cat, 0.0) for r in ranks]
            if any(heights):
                ax_mem.bar(range(len(ranks)), heights, bottom=bottom, label=cat, color=COLOURS[cat])
                bottom = [b + h for b, h in zip(bottom, heights)]
        ax_mem.set_xticks(range(len(ranks)))
        ax_mem.set_xticklabels([f"rank {r}\ns{grid_place(row, r)[0]} t{grid_place(row, r)[1]} d{grid_place(row, r)[2]}"
                                for r in ranks], fontsize=8)
        ax_mem.set_ylabel("peak device memory (MiB)")
        ax_mem.set_title(f"{label}: memory per rank (s stage, t tp rank, d replica)", fontsize=10)
        ax_mem.grid(axis="y", alpha=0.3)
        ax_mem.legend(fontsize=7)
        sent = [float(row[f"bytes_{a}_per_step"]) / 2**20 for a in GRID_AXES]
        bars = ax_bytes.bar(GRID_AXES, sent, color=["#55a868", "#4c72b0", "#8c8c8c", "#c44e52"])
        for bar, value in zip(bars, sent):
            ax_bytes.annotate(f"{value:.2f}", (bar.get_x() + bar.get_width() / 2, value), ha="center",
                              va="bottom", fontsize=8)
        ax_bytes.set_ylabel("MiB sent per step, all ranks")
        ax_bytes.set_title(f"bytes per axis (dp {row['dp']}, pp {row['pp']}, tp {row['tp']})", fontsize=10)
        ax_bytes.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        name = f"grid-{label}.png"
        save(fig, out, name)
        names.append(name)
        print(f"plot.py: {label}: bytes per step " +
              ", ".join(f"{a} {float(row[f'bytes_{a}_per_step']):.0f}" for a in GRID_AXES))
    return names


def plot_gantt(run_dir, step, out):
    """One step of timeline.csv. Pipeline runs (chapter 04): a row per stage,
    messages as thin grey bars. ZeRO runs (chapter 05, ops gather and
    reduce_scatter): two rows per rank, computation above and communication
    below, so that what overlaps is seen overlapping."""
    step, rows, ranks = timeline_step(run_dir, step)
    if any(r["op"] == "attn_fwd" for r in rows):
        return plot_ring_gantt(run_dir, step, rows, ranks, out)
    zero = any(r["op"] in ("gather", "reduce_scatter") for r in rows)
    lanes = 2 if zero else 1
    fig, ax = plt.subplots(figsize=(10, 0.8 * lanes * len(ranks) + 1.8))
    for r in rows:
        rank, start, end = int(r["rank"]), float(r["start_us"]) / 1e3, float(r["end_us"]) / 1e3
        compute = r["op"] in GANTT_COMPUTE
        y = lanes * rank + (0 if compute else 1) if zero else rank
        ax.barh(y, end - start, left=start, height=0.6 if compute or zero else 0.25,
                color=GANTT_COLOURS.get(r["op"], "#b0b0b0") if compute or zero else "#b0b0b0",
                edgecolor="white" if compute or zero else "none", linewidth=0.5)
        if compute and end - start > 0 and not zero:
            ax.text((start + end) / 2, rank, r["micro"], ha="center", va="center", fontsize=7, color="white")
    if zero:
        ax.set_yticks([lanes * k + lane for k in ranks for lane in range(lanes)])
        ax.set_yticklabels([f"rank {k} {what}" for k in ranks for what in ("compute", "comm")])
        title = "green gather, purple reduce-scatter" + (" / all-reduce" if any(r["op"] == "allreduce" for r in rows) else "")
        title = f"blue forward, orange backward; {title}"
    else:
        ax.set_yticks(ranks)
        run_csv = os.path.join(run_dir, "run.csv")
        row = read_csv(run_csv, TIMELINE_RUN)[0] if os.path.exists(run_csv) else {}
        if int(row.get("tp") or 1) * int(row.get("dp") or 1) > 1:  # ranks are not stages: say where each sits
            ax.set_yticklabels([f"rank {k}: stage {grid_place(row, k)[0]}, tp {grid_place(row, k)[1]}, "
                                f"replica {grid_place(row, k)[2]}" for k in ranks], fontsize=8)
        else:
            ax.set_yticklabels([f"stage {k}" for k in ranks])
        title = "blue forward, orange backward, grey messages; numbers: micro-batch"
        if any(r["op"] == "bwd_weight" for r in rows):
            title = "blue forward, orange B (input gradient), red W (weight gradients), grey messages; numbers: micro-batch"
    return finish_timeline(fig, ax, run_dir, f"step {step} ({title})", "gantt", out,
                           fontsize=9 if len(ranks) > 4 else None)


def finish_timeline(fig, ax, run_dir, title, prefix, out, fontsize=9):
    """The common ending of the timeline charts: axes, title, the file name/png; returns the name."""
    ax.invert_yaxis()
    ax.set_xlabel("time since the start of the step (ms)")
    label = os.path.basename(os.path.normpath(run_dir))
    ax.set_title(f"{label}: {title}", fontsize=fontsize)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    name = f"{prefix}-{label}.png"
    save(fig, out, name)
    return name


def plot_ring_gantt(run_dir, step, rows, ranks, out):
    """Chapter 03's --cp ring, one step: per rank a row of its attention blocks (grey: blocked
    waiting for the next block) above a row of its sends in flight, from posting to their wait,
    so that a send running under a block is seen running under it. Numbers: the hop."""
    fig, ax = plt.subplots(figsize=(10, 1.2 * len(ranks) + 1.8))
    for r in rows:
        rank, start, end = int(r["rank"]), float(r["start_us"]) / 1e3, float(r["end_us"]) / 1e3
        lane = 0 if r["op"] in RING_COMPUTE else 1
        ax.barh(2 * rank + lane, end - start, left=start, height=0.6, color=GANTT_COLOURS.get(r["op"], "#b0b0b0"),
                edgecolor="white", linewidth=0.5)
        if r["op"].startswith("attn") and end - start > 0:
            ax.text((start + end) / 2, 2 * rank, r["micro"], ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks([2 * k + lane for k in ranks for lane in (0, 1)])
    ax.set_yticklabels([f"rank {k} {what}" for k in ranks for what in ("blocks", "sends")])
    return finish_timeline(fig, ax, run_dir, f"step {step} of the context-parallel ring\nblue forward blocks, "
                           "orange backward, grey waiting; green k|v and purple d(k|v) in flight; numbers: hop",
                           "gantt", out)


OFFLOAD_LANES = [("compute", ("fwd", "bwd", "bwd_input", "bwd_weight")), ("grad D2H", ("grad_d2h",)),
                 ("CPU AdamW", ("cpu_adam",)),
                 ("param H2D", ("param_h2d",))]


def plot_offload_timeline(run_dir, step, out):
    step, rows, ranks = timeline_step(run_dir, step)
    lanes = len(OFFLOAD_LANES)
    colours = {"fwd": "#4c72b0", "bwd": "#dd8452", "bwd_input": "#dd8452", "bwd_weight": "#937860",
               "grad_d2h": "#55a868", "cpu_adam": "#c44e52", "param_h2d": "#8172b3"}
    fig, ax = plt.subplots(figsize=(10, 0.5 * lanes * len(ranks) + 1.8))
    span = max(float(r["end_us"]) for r in rows) / 1e3
    labels = []
    for i, rank in enumerate(ranks):
        for lane, (name, ops) in enumerate(OFFLOAD_LANES):
            y = i * (lanes + 1) + lane
            labels.append((y, f"rank {rank}: {name}"))
            for r in rows:
                if int(r["rank"]) == rank and r["op"] in ops:
                    start, end = float(r["start_us"]) / 1e3, float(r["end_us"]) / 1e3
                    ax.barh(y, max(end - start, span / 500), left=start, height=0.7, color=colours[r["op"]],
                            edgecolor="white", linewidth=0.5)
    ax.set_yticks([y for y, _ in labels])
    ax.set_yticklabels([text for _, text in labels], fontsize=8)
    return finish_timeline(fig, ax, run_dir, f"step {step} of an offloaded run (a copy per unit; zb-h1: after its B, "
                           "orange, and its W, brown; with --dpu the CPU AdamW row is the previous step's update)", "offload", out)


def plot_capacity(path, out):
    rows = read_csv(path, MODE_INPUT["capacity"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    by_program = OrderedDict()
    for r in rows:
        by_program.setdefault(r["program"], []).append((int(r["budget_bytes"]) / 1048576, int(r["params"]) / 1e6))
    names = {"01": "01: everything on the device", "06": "06: --offload (optimizer on the host)"}
    for program, points in by_program.items():
        points.sort()
        ax.plot([b for b, _ in points], [p for _, p in points], marker="o", label=names.get(program, program))
    if "01" in by_program and "06" in by_program:
        base = dict(by_program["01"])
        last = max(b for b, _ in by_program["06"])
        for budget, params in by_program["06"]:
            if budget in base:
                # below the point, on its right (the last one's on its left, inside the axes)
                right = budget != last
                ax.annotate(f"{params / base[budget]:.1f}x", (budget, params), textcoords="offset points",
                            xytext=(6 if right else -6, -12), ha="left" if right else "right", fontsize=8)
    precision = rows[0]["precision"] if rows else ""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    # plain numbers on the log axes (8, 16, 32 MiB; 0.25 .. 32 M parameters), not powers of two
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.yaxis.set_major_formatter(plain)
    ax.set_xlabel("device budget, --device-mem-limit (MiB)")
    ax.set_ylabel("parameters of the largest model trained (M)")
    # two lines, so that the title fits the figure's width
    ax.set_title(f"The largest model per device budget\n({precision}: 16 bytes per parameter on the device, "
                 "against 2 with offload)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    save(fig, out, "capacity.png")


def plot_offload_bench(path, out):
    """common/scripts/bench_offload.sh's summary: step time per configuration, grouped by ranks."""
    rows = read_csv(path, MODE_INPUT["offload_bench"])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    x = list(range(len(rows)))
    medians = [float(r["median_step_ms"]) for r in rows]
    low = [m - float(r["min_step_ms"]) for m, r in zip(medians, rows)]
    high = [float(r["max_step_ms"]) - m for m, r in zip(medians, rows)]
    colors = ["tab:blue" if r["ranks"] == "1" else "tab:orange" for r in rows]
    ax.bar(x, medians, yerr=[low, high], capsize=4, color=colors)
    for i, r in enumerate(rows):
        note = f"dev {float(r['peak_device_bytes']) / 1048576:.1f} MiB"
        if float(r["peak_host_bytes"] or 0) > 0:
            note += f"\nhost {float(r['peak_host_bytes']) / 1048576:.1f} MiB"
        ax.annotate(note, (i, medians[i] + high[i]), textcoords="offset points", xytext=(0, 3), ha="center",
                    fontsize=7)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{r['config']}\n({r['ranks']} rank{'s' if r['ranks'] != '1' else ''})" for r in rows],
                       fontsize=7)
    ax.set_ylabel("median step time (ms)")
    first = rows[0] if rows else {}
    ax.set_title(f"Offload, DPU and the combined trainer: {first.get('model', '')} preset, "
                 f"{first.get('precision', '')}, {first.get('machine', '')}\n(bars: min-max over repeats)",
                 fontsize=9)
    ax.set_ylim(0, max(m + h for m, h in zip(medians, high)) * 1.25 if rows else 1)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save(fig, out, "offload.png")


def plot_sweep(groups, out):
    """Two panels against M, one line per schedule. Configurations are compared
    by their fastest repeat: background load only ever adds time, so the
    minimum over repeats is the least disturbed estimate (every repeat is drawn
    as a dot, so the noise stays visible)."""
    lines = OrderedDict()  # schedule -> {micro: [(median_step_ms, bubble_measured, bubble_theory) per repeat]}
    for runs in groups.values():
        for run in runs:
            row = run["run"][0]
            lines.setdefault(row.get("schedule", "?"), {}).setdefault(int(row["micro"]), []).append(
                (float(row["median_step_ms"]), float(row.get("bubble_measured") or "nan"),
                 float(row.get("bubble_theory") or "nan")))
    fig, (ax_time, ax_bubble) = plt.subplots(1, 2, figsize=(12, 4.5))
    formula = {}  # micro -> bubble_theory, the same for every schedule
    for schedule, by_micro in lines.items():
        micros = sorted(by_micro)
        best = [min(by_micro[m]) for m in micros]  # the fastest repeat of each configuration
        line, = ax_time.plot(micros, [b[0] for b in best], marker="o", label=f"{schedule} (fastest repeat)")
        every = [(m, r[0]) for m in micros for r in by_micro[m]]
        ax_time.plot(*zip(*every), ".", color=line.get_color(), alpha=0.4,
                     label=f"{schedule}, each repeat" if len(every) > len(micros) else None)
        ax_bubble.plot(micros, [b[1] for b in best], marker="o", color=line.get_color(),
                       label=f"{schedule}, measured (fastest repeat)")
        for m, (step_ms, bubble, theory) in zip(micros, best):
            print(f"plot.py: sweep {schedule} M={m}: fastest of {len(by_micro[m])} repeats {step_ms:.1f} ms,"
                  f" bubble {bubble:.3f} measured, {theory:.3f} formula")
        formula.update({m: b[2] for m, b in zip(micros, best)})
    if formula:
        micros = sorted(formula)
        stages = next(iter(groups.values()))[0]["run"][0].get("pp", "P")
        ax_bubble.plot(micros, [formula[m] for m in micros], "k--", marker="x",
                       label=f"formula (run.csv bubble_theory), P = {stages}")
    all_micros = sorted({m for by_micro in lines.values() for m in by_micro})
    for ax in (ax_time, ax_bubble):
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_micros)
        ax.set_xticklabels([str(m) for m in all_micros])
        ax.set_xlabel("micro-batches per global batch (M)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    ax_time.set_ylabel("step time (ms; median over a run's steps)")
    ax_time.set_title("Step time against M (line: fastest of the repeats)")
    ax_bubble.set_ylabel("bubble: idle fraction of the stages' time")
    ax_bubble.set_ylim(bottom=0)
    ax_bubble.set_title("Measured bubble against the formula")
    fig.tight_layout()
    save(fig, out, "sweep.png")


def plot_bubbles(groups, out):
    """The measured bubble of each configuration against its schedule's formula."""
    labels, measured, formula, at_times, replays = [], [], [], [], []
    for label, runs in groups.items():
        rows = [r["run"][0] for r in runs]
        values = [float(r.get("bubble_measured") or "nan") for r in rows]
        schedule, theory = rows[0].get("schedule", "?"), float(rows[0].get("bubble_theory") or "nan")
        P, M, tp = int(rows[0].get("pp", 1)), int(rows[0].get("micro", 1)), int(rows[0].get("tp") or 1)
        timed = zb_h1_formula_measured(runs[0]["dir"], P, M) if schedule == "zb-h1" else None
        replayed = [t for t in (timeline_replay(r["dir"], P, tp) for r in runs) if t is not None]
        replayed = median(replayed) if replayed else None
        labels.append(label)
        measured.append(values)
        formula.append(theory)
        at_times.append(timed)
        replays.append(replayed)
        extra = f", {timed:.3f} at the measured F, B, W" if timed is not None else ""
        if replayed is not None:
            extra += f", {replayed:.3f} replayed at the run's own times ({median(values) / replayed - 1:+.0%})"
        print(f"plot.py: bubbles {label} ({schedule}, P={P}, M={M}): measured {median(values):.3f} "
              f"(median of {len(values)} repeats), formula {theory:.3f}{extra}")
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(labels) + 2), 4.5))
    xs = range(len(labels))
    mids = [median(v) for v in measured]
    errs = [[m - min(v) for m, v in zip(mids, measured)], [max(v) - m for m, v in zip(mids, measured)]]
    ax.bar(xs, mids, width=0.6, color="#4c72b0", yerr=errs, capsize=4, label="measured (median; bars min-max)")
    for x, v in zip(xs, measured):
        ax.plot([x] * len(v), v, "k.", alpha=0.4)
    ax.scatter(xs, formula, marker="_", s=900, color="#c44e52", linewidths=3, zorder=3,
               label="formula (run.csv bubble_theory)")
    timed = [(x, t) for x, t in zip(xs, at_times) if t is not None]
    if timed:
        ax.scatter(*zip(*timed), marker="x", s=80, color="#55a868", zorder=4,
                   label="zb-h1's formula at the measured F, B, W")
    replayed = [(x, t) for x, t in zip(xs, replays) if t is not None]
    if replayed:
        ax.scatter(*zip(*replayed), marker="D", s=40, facecolors="none", edgecolors="#dd8452", linewidths=2,
                   zorder=4, label="the schedule replayed at the run's own times (no message costs)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=15)
    ax.set_ylabel("bubble: idle fraction of the stages' time")
    top = max(max(v) for v in measured) if all(v == v for m in measured for v in m) else None
    ax.set_ylim(0, 1.5 * top if top else None)  # room for the legend above the bars
    ax.set_title("Measured bubble against each schedule's formula")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, out, "bubbles.png")


def zero_formula_bytes(stage, params, n, precision="fp32"):
    """Model-state bytes per rank as the ZeRO paper counts them: fp32 4 + 4 + 8 bytes a parameter,
    16-bit 2 + 2 + 12 (the fp32 master weights are optimizer state)."""
    if precision == "fp32":
        per_param = {0: 16.0, 1: 8.0 + 8.0 / n, 2: 4.0 + 12.0 / n, 3: 16.0 / n}[stage]
    else:
        per_param = {0: 16.0, 1: 4.0 + 12.0 / n, 2: 2.0 + 14.0 / n, 3: 16.0 / n}[stage]
    return per_param * params


def zero_grad_bytes(run):
    """Bytes per parameter of a run's gradients (run.csv's precision: 05 writes it; fp32 before)."""
    return 4 if run.get("precision", "fp32") == "fp32" else 2


def plot_zero(groups, out):
    """Chapter 05: memory, bytes sent and step time per ZeRO stage, against the formulas."""
    rows = []  # (label, run.csv row, {category: bytes of the largest rank}, [step times over repeats])
    for label, runs in groups.items():
        run = runs[0]["run"][0]
        per_rank = {}
        for row in runs[0]["memory"]:
            if row["space"] == "device" and row["category"] in ("params", "grads", "optimizer"):
                per_rank.setdefault(int(row["rank"]), {})[row["category"]] = int(row["peak_bytes"])
        largest = max(per_rank.values(), key=lambda cats: sum(cats.values()))
        rows.append((label, run, largest, [float(r["run"][0]["median_step_ms"]) for r in runs]))
    rows.sort(key=lambda r: (int(r[1]["world_size"]), int(r[1]["zero"]), r[0]))
    x = range(len(rows))
    labels = [label for label, _, _, _ in rows]
    fig, axes = plt.subplots(1, 3, figsize=(max(12, 1.6 * len(rows) * 3), 4.5))
    ax = axes[0]
    bottom = [0.0] * len(rows)
    for cat in ("params", "grads", "optimizer"):
        heights = [cats.get(cat, 0) / 2**20 for _, _, cats, _ in rows]
        ax.bar(x, heights, bottom=bottom, label=cat, color=COLOURS[cat])
        bottom = [b + h for b, h in zip(bottom, heights)]
    formula = [zero_formula_bytes(int(r["zero"]), int(r["params"]), int(r["world_size"]),
                                  r.get("precision", "fp32")) / 2**20 for _, r, _, _ in rows]
    ax.scatter(x, formula, color="black", marker="_", s=600, zorder=3, label="formula")
    ax.set_ylabel("model state per rank (MiB)")
    ax.set_title("Memory: params + grads + optimizer")
    ax.legend(fontsize=8)
    ax = axes[1]
    sent = [float(r["bytes_sent_per_step"]) / 2**20 for _, r, _, _ in rows]
    allreduce = [2 * (int(r["world_size"]) - 1) / int(r["world_size"]) * zero_grad_bytes(r) * int(r["params"])
                 * (1.5 if int(r["zero"]) == 3 else 1.0) / 2**20 for _, r, _, _ in rows]
    ax.bar(x, sent, color="#8172b3", label="measured")
    ax.scatter(x, allreduce, color="black", marker="_", s=600, zorder=3, label="formula")
    ax.set_ylabel("MiB sent per rank per step")
    ax.set_title("Communication")
    ax.legend(fontsize=8)
    ax = axes[2]
    medians = [median(times) for _, _, _, times in rows]
    low = [m - min(times) for m, (_, _, _, times) in zip(medians, rows)]
    high = [max(times) - m for m, (_, _, _, times) in zip(medians, rows)]
    ax.bar(x, medians, yerr=[low, high], capsize=4, color="#4c72b0")
    ax.set_ylabel("median step time (ms)")
    ax.set_title("Time (bars: min-max over repeats)")
    for ax in axes:
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=8, rotation=30, ha="right")
        ax.grid(axis="y", alpha=0.3)
    for (label, _, cats, _), f, m, a, t in zip(rows, formula, sent, allreduce, medians):
        print(f"zero {label}: model state {sum(cats.values()) / 2**20:.3f} MiB per rank (formula {f:.3f}), "
              f"sent {m:.3f} MiB per step (formula {a:.3f}), step {t:.1f} ms")
    fig.tight_layout()
    save(fig, out, "zero.png")


def plot_precision(groups, out):
    """Loss curves of the precisions overlaid; their memory by category with bytes per parameter."""
    fig, (ax_loss, ax_diff, ax_mem) = plt.subplots(1, 3, figsize=(15, 4.5),
                                                   gridspec_kw={"width_ratios": [3, 3, 2]})
    styles = ["-", "--", ":", "-."]
    first = None
    for i, (label, runs) in enumerate(groups.items()):
        steps = runs[0]["steps"]
        x, loss = [int(s["step"]) for s in steps], [float(s["loss"]) for s in steps]
        ax_loss.plot(x, loss, styles[i % len(styles)], label=label, linewidth=1.5)
        if first is None:
            first = (label, loss)
            ax_diff.plot([], [])  # keep the colours of the two panels in step
            continue
        n = min(len(loss), len(first[1]))
        ax_diff.semilogy(x[:n], [max(abs(a - b) / b, 1e-9) for a, b in zip(loss, first[1])],
                         styles[i % len(styles)], label=label, linewidth=1.2)
    ax_loss.set_xlabel("optimizer step")
    ax_loss.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_loss.set_ylabel("training loss")
    ax_loss.set_title("fp32, bf16, fp16: close curves, not equal ones")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=8)
    if first is not None:
        ax_diff.set_title(f"relative difference from {first[0]}")
    ax_diff.set_xlabel("optimizer step")
    ax_diff.set_ylabel("|loss - reference| / reference")
    ax_diff.grid(alpha=0.3, which="both")
    if len(groups) > 1:
        ax_diff.legend(fontsize=8)
    labels = list(groups)
    bottom = [0.0] * len(labels)
    for cat in CATEGORIES:
        bytes_of = []
        for label in labels:
            rows = [r for r in groups[label][0]["memory"] if r["space"] == "device" and r["category"] == cat]
            bytes_of.append(sum(int(r["peak_bytes"]) for r in rows))
        if not any(bytes_of):
            continue
        heights = [b / 2**20 for b in bytes_of]
        ax_mem.bar(range(len(labels)), heights, bottom=bottom, label=cat, color=COLOURS[cat])
        if cat in ("params", "grads", "optimizer"):
            for x, label in enumerate(labels):
                per_param = bytes_of[x] / int(groups[label][0]["run"][0]["params"])
                ax_mem.text(x, bottom[x] + heights[x] / 2, f"{per_param:.3g} B/param", ha="center",
                            va="center", fontsize=7, color="white")
        bottom = [b + h for b, h in zip(bottom, heights)]
    for label in labels:
        run = groups[label][0]
        params = int(run["run"][0]["params"])
        per_param = {cat: sum(int(r["peak_bytes"]) for r in run["memory"]
                              if r["space"] == "device" and r["category"] == cat) / params
                     for cat in ("params", "grads", "optimizer")}
        print(f"precision {label}: bytes per parameter: params {per_param['params']:g}, grads "
              f"{per_param['grads']:g}, optimizer {per_param['optimizer']:g}; final loss "
              f"{float(run['run'][0]['final_loss']):.6g}")
    ax_mem.set_xticks(range(len(labels)))
    ax_mem.set_xticklabels(labels, fontsize=8, rotation=15, ha="right")
    ax_mem.set_ylabel("peak device memory, all ranks (MiB)")
    ax_mem.set_title("Memory by category")
    ax_mem.grid(axis="y", alpha=0.3)
    ax_mem.legend(fontsize=7)
    fig.tight_layout()
    save(fig, out, "precision.png")


def cp_formula_bytes(run, cp):
    """Chapter 03 --cp: a rank's activations (course.md, "Long sequences"): 01's for B x T/N
    tokens, per token L (12C + NH + 4) + 2C + 2V + 5 floats, plus the whole sequences'
    tokens and targets (8 B T bytes) when the sequence is split."""
    r = run["run"][0]
    B, T, L, C, NH = (int(r[k]) for k in ("batch", "seq", "layers", "dmodel", "heads"))
    V = 256
    per_token = L * (12 * C + NH + 4) + 2 * C + 2 * V + 5
    return 4 * B * T // cp * per_token + (8 * B * T if cp > 1 else 0)


def plot_cp(groups, out):
    """Chapter 03 --cp: rank 0's activation bytes against the sequence length, one line per cp
    (labels 03-cpN-seqT), measured (memory.csv) and the formula (dashed)."""
    lines = OrderedDict()  # cp -> [(seq, measured, formula)]
    for label, runs in groups.items():
        m = re.fullmatch(r"03-cp(\d+)-seq(\d+)", label)
        if not m:
            refuse(f"--cp takes runs labelled 03-cpN-seqT, not {label}")
        cp, seq = int(m.group(1)), int(m.group(2))
        measured = [int(row["peak_bytes"]) for row in runs[0]["memory"]
                    if row["rank"] == "0" and row["space"] == "device" and row["category"] == "activations"]
        lines.setdefault(cp, []).append((seq, measured[0], cp_formula_bytes(runs[0], cp)))
        print(f"cp {cp} seq {seq}: activations {measured[0]} bytes, formula {cp_formula_bytes(runs[0], cp)}")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for cp, points in sorted(lines.items()):
        points.sort()
        seqs = [p[0] for p in points]
        line, = ax.plot(seqs, [p[1] / 2**20 for p in points], "o-", label=f"cp {cp} measured")
        ax.plot(seqs, [p[2] / 2**20 for p in points], "--", color=line.get_color(), label=f"cp {cp} formula")
    ax.set(xlabel="sequence length T (tokens)", ylabel="activations per rank (MiB)",
           title="Context parallelism: a rank keeps T/N tokens' activations")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, out, "cp_memory.png")


def plot_plan(groups, out):
    """plan.png: common/plan's predictions against the runs. A run directory
    planned holds, besides the run's CSVs, plan.csv (the planner's --csv) and
    plan-time.csv (its --time-csv, on a machine file); the others (a layout the
    planner refuses) are left out, named on stdout. Left, the measured median
    step time (the median over repeats) against the predicted step, with the
    line of equality and the band tests/tools/plan_time.bats allows (predicted /
    measured at most 1.5; at least 0.1, which the test takes of the fastest step);
    right, the measured peak device bytes of the fullest rank against the
    planned ones (on the CPU they are equal: the points sit on the line)."""
    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(13, 6))
    planned, skipped = 0, []
    device = lambda rows: max(sum(int(r["peak_bytes"]) for r in rows if r["rank"] == rank and r["space"] == "device")
                              for rank in {r["rank"] for r in rows})
    for label, runs in groups.items():
        run = runs[0]
        if not all(os.path.exists(os.path.join(run["dir"], n)) for n in ("plan.csv", "plan-time.csv")):
            skipped.append(label)
            continue
        planned += 1
        time_rows = read_csv(os.path.join(run["dir"], "plan-time.csv"), PLAN_FILES)
        predicted_ms = next(float(r["exposed_ms"]) for r in time_rows if r["part"] == "step")
        measured_ms = median([float(r["run"][0]["median_step_ms"]) for r in runs])
        planned_bytes = device(read_csv(os.path.join(run["dir"], "plan.csv"), PLAN_FILES))
        measured_bytes = device(run["memory"])
        ax_time.scatter(predicted_ms, measured_ms, s=14)
        ax_time.annotate(label, (predicted_ms, measured_ms), fontsize=6)
        ax_mem.scatter(planned_bytes / 2**20, measured_bytes / 2**20, s=14)
        ax_mem.annotate(label, (planned_bytes / 2**20, measured_bytes / 2**20), fontsize=6)
    if not planned:
        refuse("no run directory holds plan.csv and plan-time.csv (write them with common/plan ... --csv FILE "
               "--time-csv FILE, as demo.sh does)")
    if skipped:
        print(f"plot.py: not planned, left out of plan.png: {', '.join(skipped)}")
    for ax in (ax_time, ax_mem):
        ax.set_xscale("log")
        ax.set_yscale("log")
        lo = min(ax.get_xlim()[0], ax.get_ylim()[0])
        hi = max(ax.get_xlim()[1], ax.get_ylim()[1])
        ax.plot([lo, hi], [lo, hi], color="gray", linewidth=1, label="measured = predicted")
    lo, hi = ax_time.get_xlim()
    ax_time.fill_between([lo, hi], [lo / 1.5, hi / 1.5], [lo / 0.1, hi / 0.1], color="gray", alpha=0.15,
                         label="the test's band: predicted / measured in 0.1x-1.5x")
    ax_time.set_xlabel("predicted step (ms, common/plan --machine)")
    ax_time.set_ylabel("measured median step (ms)")
    ax_time.set_title(f"Step time: predicted against measured ({planned} layouts)")
    ax_time.legend(fontsize=8)
    ax_mem.set_xlabel("planned peak device memory, fullest rank (MiB)")
    ax_mem.set_ylabel("measured (memory.csv, MiB)")
    ax_mem.set_title("Memory: planned against measured")
    ax_mem.legend(fontsize=8)
    fig.tight_layout()
    save(fig, out, "plan.png")


MODES = ("plan", "cp", "commbench", "grid", "gantt", "offload", "capacity", "offload_bench", "bubbles", "zero",
         "precision", "sweep")


def main():
    parser = argparse.ArgumentParser(description="Plot course runs from their CSVs.")
    parser.add_argument("runs", nargs="+", help="run directories (each with steps.csv, memory.csv, run.csv), "
                                                "or commbench CSV files with --commbench")
    parser.add_argument("--out", default="runs/plots", help="the directory of the PNGs, new or existing: a PNG there is replaced only "
                                                     "if it is an earlier plot (default runs/plots)")
    parser.add_argument("--commbench", action="store_true", help="the inputs are commbench CSVs: plot bus bandwidth")
    parser.add_argument("--gantt", action="store_true", help="Gantt chart of each run's timeline.csv (chapters 04, 05)")
    parser.add_argument("--step", type=int, default=None, help="--gantt, --offload: which step (default: the last)")
    parser.add_argument("--sweep", action="store_true", help="step time against micro-batches, per schedule")
    parser.add_argument("--bubbles", action="store_true", help="chapter 04: each schedule's measured bubble and formula")
    parser.add_argument("--zero", action="store_true", help="chapter 05: memory, bytes and time per ZeRO stage")
    parser.add_argument("--precision", action="store_true",
                        help="chapter 05: loss curves and memory by category of fp32, bf16 and fp16 runs")
    parser.add_argument("--offload", action="store_true", help="chapter 06: one step's compute, copies and CPU AdamW")
    parser.add_argument("--capacity", action="store_true", help="06_offload/capacity.py's CSV: parameters per budget")
    parser.add_argument("--offload-bench", action="store_true",
                        help="common/scripts/bench_offload.sh's offload_summary.csv: step time per configuration")
    parser.add_argument("--cp", action="store_true",
                        help="chapter 03 --cp runs (labels 03-cpN-seqT): activations per rank against T")
    parser.add_argument("--grid", action="store_true",
                        help="chapter 04: memory per rank and bytes per grid axis of pp x tp x dp runs")
    parser.add_argument("--plan", action="store_true",
                        help="common/plan's predicted step time and memory against the runs' (plan.csv, plan-time.csv)")
    args = parser.parse_args()
    mode = next((m for m in MODES if getattr(args, m)), None)
    valid = MODE_INPUT.get(mode, RUN_DIRECTORY)  # what the mode reads, for a refusal's "(valid: ...)"
    make_output_dir(args.out, "--out")
    if args.plan:
        plot_plan(load_runs(args.runs, valid), args.out)
        print(f"plot.py: wrote plan.png to {args.out}")
        return
    if args.cp:
        plot_cp(load_runs(args.runs, valid), args.out)
        print(f"plot.py: wrote cp_memory.png to {args.out}")
        return
    if args.commbench:
        plot_commbench(args.runs, args.out)
        return
    if args.grid:
        names = plot_grid(load_runs(args.runs, valid), args.out)
        print(f"plot.py: wrote {', '.join(names)} to {args.out}")
        return
    if args.gantt:
        names = [plot_gantt(d, args.step, args.out) for d in args.runs]
        print(f"plot.py: wrote {', '.join(names)} to {args.out}")
        return
    if args.offload:
        names = [plot_offload_timeline(d, args.step, args.out) for d in args.runs]
        print(f"plot.py: wrote {', '.join(names)} to {args.out}")
        return
    if args.capacity:
        plot_capacity(args.runs[0], args.out)
        print(f"plot.py: wrote capacity.png to {args.out}")
        return
    if args.offload_bench:
        plot_offload_bench(args.runs[0], args.out)
        print(f"plot.py: wrote offload.png to {args.out}")
        return
    if args.bubbles:
        plot_bubbles(load_runs(args.runs, valid), args.out)
        print(f"plot.py: wrote bubbles.png to {args.out}")
        return
    if args.zero:
        plot_zero(load_runs(args.runs, valid), args.out)
        print(f"plot.py: wrote zero.png to {args.out}")
        return
    if args.precision:
        plot_precision(load_runs(args.runs, valid), args.out)
        print(f"plot.py: wrote precision.png to {args.out}")
        return
    if args.sweep:
        plot_sweep(load_runs(args.runs, valid), args.out)
        print(f"plot.py: wrote sweep.png to {args.out}")
        return
    groups = load_runs(args.runs, valid)
    plot_loss(groups, args.out)
    plot_bars(groups, args.out, "median_step_ms", "median step time (ms)",
              "Runtime per optimizer step (median; bars: min-max over repeats)", "runtime.png")
    plot_bars(groups, args.out, "tokens_per_s", "tokens per second",
              "Training throughput (median; bars: min-max over repeats)", "throughput.png")
    plot_memory(groups, args.out)
    plot_breakdown(groups, args.out)
    idle = plot_idle(groups, args.out)
    print(f"plot.py: wrote loss.png, runtime.png, throughput.png, memory.png, breakdown.png"
          f"{', idle.png' if idle else ''} to {args.out}")


if __name__ == "__main__":
    run_tool("plot.py: ", main)
