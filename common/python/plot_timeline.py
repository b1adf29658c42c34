"""plot_timeline.py: plot.py's charts of one step of a run's timeline.csv: --gantt (chapter 03's
--cp ring, 04's pipeline schedules, 05's gathers and reduce-scatters), --ep (chapter 03's expert
parallelism: dispatch, experts, combine, and the load per step) and --offload (chapter 06:
compute, the copies each way and the CPU's AdamW)."""
import os

from figure import MaxNLocator, finish, plt, style
from rundir import grid_place, read
from tool import Refusal

TIMELINE_RUN = "a run of chapter 03 with --cp or --ep, or of chapter 04, 05 or 06: they write timeline.csv"
EP_RUN = "a run of chapter 03 with --experts E --ep N"
GANTT_COLOURS = {"fwd": "#4c72b0", "bwd": "#dd8452", "bwd_input": "#dd8452", "bwd_weight": "#c44e52",
                 "gather": "#55a868", "reduce_scatter": "#8172b3", "allreduce": "#8172b3", "allgather": "#55a868",
                 "attn_fwd": "#4c72b0", "attn_bwd": "#dd8452", "kv_wait": "#b0b0b0", "dkv_wait": "#b0b0b0",
                 "kv_send": "#55a868", "dkv_send": "#8172b3"}
# chapter 03's context-parallel ring (context_parallel.h): its blocks and waits, and its sends in flight
RING_COMPUTE = ("attn_fwd", "attn_bwd", "kv_wait", "dkv_wait")
# the computations of a timeline: forward, backward, or zero bubble's B and W (04_pipeline/schedule.h)
GANTT_COMPUTE = ("fwd", "bwd", "bwd_input", "bwd_weight")


def timeline_step(run_dir, step, valid=TIMELINE_RUN):
    """(step, its rows of timeline.csv, the ranks in them); step None: the last. A run without a
    timeline, or a step it does not have, ends the program with one line and exit status 2."""
    path = os.path.join(run_dir, "timeline.csv")
    rows = read(run_dir, "timeline", valid, required=True)
    steps = sorted({int(r["step"]) for r in rows})
    if step is None:
        step = steps[-1]
    if step not in steps:
        raise Refusal(f"--step {step}: {path} has no step {step} (valid: {steps[0]}..{steps[-1]}, "
                      "or no --step for the last)")
    rows = [r for r in rows if int(r["step"]) == step]
    return step, rows, sorted({int(r["rank"]) for r in rows})


def plot_gantt(run_dir, step, out):
    """One step of timeline.csv. Pipeline runs (chapter 04): a row per stage,
    messages as thin grey bars. ZeRO runs (chapter 05, ops gather and
    reduce_scatter): two rows per rank, computation above and communication
    below, so that what overlaps is seen overlapping."""
    step, rows, ranks = timeline_step(run_dir, step)
    if any(r["op"] == "attn_fwd" for r in rows):
        return plot_ring_gantt(run_dir, step, rows, ranks, out)
    if any(r["op"] in EP_OPS for r in rows):
        return plot_ep(run_dir, step, out)
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
        row = read(run_dir, "run", TIMELINE_RUN)[0] if os.path.exists(os.path.join(run_dir, "run.csv")) else {}
        if int(row.get("tp") or 1) * int(row.get("dp") or 1) > 1:  # ranks are not stages: say where each sits
            ax.set_yticklabels([f"rank {k}: stage {grid_place(row, k)[0]}, tp {grid_place(row, k)[1]}, "
                                f"replica {grid_place(row, k)[2]}" for k in ranks], fontsize=8)
        else:
            ax.set_yticklabels([f"stage {k}" for k in ranks])
        title = "blue forward, orange backward, grey messages; numbers: micro-batch"
        if any(r["op"] == "bwd_weight" for r in rows):
            title = "blue forward, orange B (input gradient), red W (weight gradients), grey messages; numbers: micro-batch"
    return finish_timeline(fig, ax, run_dir, f"step {step} ({title})", "gantt", out,
                           fontsize=9 if len(ranks) > 4 else 10)


def finish_timeline(fig, ax, run_dir, title, prefix, out, fontsize=9):
    """The common ending of the timeline charts: time axis, the run's label in the title, saved as
    PREFIX-LABEL.png; returns the name."""
    ax.invert_yaxis()
    label = os.path.basename(os.path.normpath(run_dir))
    style(ax, xlabel="time since the start of the step (ms)", title=f"{label}: {title}", grid="x", legend=None,
          title_size=fontsize)
    return finish(fig, out, f"{prefix}-{label}.png")


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


# chapter 03's expert parallelism (expert_parallel.h): per MoE block, forward then backward
EP_OPS = {"ep_dispatch": "#55a868", "ep_experts": "#4c72b0", "ep_combine": "#8172b3",
          "ep_dispatch_bwd": "#8fd19e", "ep_experts_bwd": "#dd8452", "ep_combine_bwd": "#b8a9d9"}


def plot_ep(run_dir, step, out):
    """--ep: one step of a chapter 03 --ep run, per rank its all-to-alls and its experts' work in
    turn (numbers: the MoE block, 0 the first), beside steps.csv's load per step: the most rows one
    rank's experts computed (ep_rows_max) against the ranks' mean (ep_rows_mean). Prints the step's
    load. A run without the ep_* rows is refused in one line."""
    step, rows, ranks = timeline_step(run_dir, step, EP_RUN)
    rows = [r for r in rows if r["op"] in EP_OPS]
    if not rows:
        raise Refusal(f"{os.path.join(run_dir, 'timeline.csv')} has no ep_dispatch, ep_experts or ep_combine "
                      f"rows in step {step} (valid: {EP_RUN})")
    ranks = sorted({int(r["rank"]) for r in rows})
    steps = read(run_dir, "steps", EP_RUN)
    fig, (gantt, load) = plt.subplots(1, 2, figsize=(14, 0.7 * len(ranks) + 2.6),
                                     gridspec_kw={"width_ratios": [2.2, 1]})
    rows.sort(key=lambda r: float(r["start_us"]))
    seen, blocks, legend = {}, {}, set()  # the k-th row of (rank, micro, op): the k-th MoE block (bwd: from the last)
    for r in rows:
        key = (r["rank"], r["micro"], r["op"])
        seen[key] = seen.get(key, 0) + 1
    for r in rows:
        key = (r["rank"], r["micro"], r["op"])
        k = blocks[key] = blocks.get(key, -1) + 1
        block = seen[key] - 1 - k if r["op"].endswith("_bwd") else k
        rank, start, end = int(r["rank"]), float(r["start_us"]) / 1e3, float(r["end_us"]) / 1e3
        gantt.barh(rank, end - start, left=start, height=0.6, color=EP_OPS[r["op"]], edgecolor="white",
                   linewidth=0.5, label=None if r["op"] in legend else r["op"])
        legend.add(r["op"])
        if r["op"].startswith("ep_experts") and end - start > 0:
            gantt.text((start + end) / 2, rank, block, ha="center", va="center", fontsize=7, color="white")
    gantt.set_yticks(ranks)
    gantt.set_yticklabels([f"rank {k}" for k in ranks])
    gantt.invert_yaxis()
    label = os.path.basename(os.path.normpath(run_dir))
    style(gantt, xlabel="time since the start of the step (ms)", grid="x", legend=None, title_size=9,
          title=f"{label}: step {step} per rank: each MoE block's dispatch, experts (numbers: the block) and combine,\n"
                "forward then backward; a rank whose experts finish first waits in the combine for the busiest")
    gantt.legend(fontsize=7, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    x = [int(s["step"]) for s in steps]
    most, mean = [float(s["ep_rows_max"]) for s in steps], [float(s["ep_rows_mean"]) for s in steps]
    load.plot(x, most, "o-", color="#c44e52", label="ep_rows_max (the busiest rank)")
    load.plot(x, mean, "o--", color="#4c72b0", label="ep_rows_mean (balanced)")
    load.axvline(step, color="grey", linewidth=0.8, linestyle=":")
    load.xaxis.set_major_locator(MaxNLocator(integer=True))
    load.set_ylim(bottom=0)
    style(load, "optimizer step", "expert rows computed per rank", grid="both", title_size=9,
          title="the load: max / mean is the imbalance")
    shown = next(s for s in steps if int(s["step"]) == step)
    imbalance = float(shown["ep_rows_max"]) / float(shown["ep_rows_mean"]) if float(shown["ep_rows_mean"]) else 0.0
    print(f"ep {label}: step {step}: ep_rows_max {shown['ep_rows_max']}, ep_rows_mean {shown['ep_rows_mean']}, "
          f"max / mean {imbalance:.3f}")
    return finish(fig, out, f"ep-{label}.png")


# --offload-activations adds its checkpoints' copies (act_d2h, act_h2d) to the copy lanes
OFFLOAD_LANES = [("compute", ("fwd", "bwd", "bwd_input", "bwd_weight")), ("D2H", ("grad_d2h", "act_d2h")),
                 ("CPU AdamW", ("cpu_adam",)),
                 ("H2D", ("param_h2d", "act_h2d"))]


def plot_offload_timeline(run_dir, step, out):
    step, rows, ranks = timeline_step(run_dir, step)
    lanes = len(OFFLOAD_LANES)
    colours = {"fwd": "#4c72b0", "bwd": "#dd8452", "bwd_input": "#dd8452", "bwd_weight": "#937860",
               "grad_d2h": "#55a868", "cpu_adam": "#c44e52", "param_h2d": "#8172b3",
               "act_d2h": "#64b5cd", "act_h2d": "#da8bc3"}
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
                           "orange, and its W, brown; with --dpu the CPU AdamW row is the previous step's update;\n"
                           "light blue and pink: --offload-activations' checkpoints; purple: the weights in, per unit with --offload-params)",
                           "offload", out)
