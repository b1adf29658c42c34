"""plot_runs.py: plot.py's figures of any chapter's runs (plot.py RUN_DIR...): loss curves, step time
and throughput per configuration, memory by category, the step's breakdown, (chapter 03 on,
busy.csv) busy and idle time per rank, and (--experts) a mixture of experts' routing per step."""
from collections import OrderedDict

from figure import MaxNLocator, finish, plt, stack_categories, style
from rundir import after_warmup
from tool import median


def bars_with_spread(ax, groups, column, ylabel, title):
    """run.csv's column per configuration: the median over repeats, min-max error bars."""
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
    style(ax, ylabel=ylabel, title=title, legend=None)
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
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    style(ax, "optimizer step", "loss (mean cross-entropy, nats per byte)",
          "Loss curves: the same model, seed and data give the same curve", grid="both")
    return finish(fig, out, "loss.png")


def plot_bars(groups, out, column, ylabel, title, filename):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    bars_with_spread(ax, groups, column, ylabel, title)
    return finish(fig, out, filename)


def device_memory_by_rank(memory):
    """memory.csv's device rows: OrderedDict rank -> {category: MiB}."""
    by_rank = OrderedDict()
    for row in memory:
        if row["space"] == "device":
            by_rank.setdefault(int(row["rank"]), {})[row["category"]] = int(row["peak_bytes"]) / 2**20
    return by_rank


def plot_memory(groups, out):
    """One bar per (configuration, rank), stacked by category, device space."""
    bars = []  # (label, {category: MiB})
    for label, runs in groups.items():
        by_rank = device_memory_by_rank(runs[0]["memory"])
        for rank, cats in by_rank.items():
            bars.append((label if len(by_rank) == 1 else f"{label}\nrank {rank}", cats))
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(bars) + 2), 4.5))
    stack_categories(ax, [cats for _, cats in bars])
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([b[0] for b in bars], fontsize=8)
    style(ax, ylabel="peak device memory (MiB)", title="Where device memory goes: peak bytes per rank, by category")
    return finish(fig, out, "memory.png")


def breakdown_parts(runs):
    """Median ms per step of forward, backward, optimizer, exposed communication,
    and 'other' = step - their sum: the rest of the step (data loading, the
    loss read-back, waits that no part counts). The first step (warm-up) is left
    out. When the parts overlap (a pipeline stage's forward and backward include
    its waits for messages), 'other' is negative: returned as it is, so that the
    plot can say so instead of stacking past the step."""
    samples = {key: [] for key in ("fwd_ms", "bwd_ms", "opt_ms", "exposed", "step_ms")}
    for run in runs:
        for row in after_warmup(run["steps"]):
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
    style(ax, ylabel="median time per step (ms)",
          title="Where a step's time goes: compute vs communication not hidden by it")
    return finish(fig, out, "breakdown.png")


def plot_idle(groups, out):
    """Per rank: median busy time per step and the rest of the step (first step left out).
    None when no run has a busy.csv."""
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
        return None
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
    style(ax, ylabel="median time per step (ms)", title="Busy and idle time per rank (busy.csv)")
    return finish(fig, out, "idle.png")


def plot_runs(groups, out):
    """plot.py's default mode: every figure of this module; returns the names written."""
    names = [plot_loss(groups, out),
             plot_bars(groups, out, "median_step_ms", "median step time (ms)",
                       "Runtime per optimizer step (median; bars: min-max over repeats)", "runtime.png"),
             plot_bars(groups, out, "tokens_per_s", "tokens per second",
                       "Training throughput (median; bars: min-max over repeats)", "throughput.png"),
             plot_memory(groups, out), plot_breakdown(groups, out), plot_idle(groups, out)]
    return [n for n in names if n]


def plot_experts(groups, out):
    """--experts: per configuration (its first repeat), each expert's share of the step's choices
    (steps.csv's tokens_e0.., chapters 01 and 02 with --experts) and the share dropped past the
    capacity; prints each run's last step."""
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
    for ax, (label, runs) in zip(axes[0], groups.items()):
        steps = runs[0]["steps"]
        experts = sorted((c for c in steps[0] if c.startswith("tokens_e")), key=lambda c: int(c[8:]))
        if not experts:
            steps[0]["tokens_e0"]  # refused in one line: no such column (valid: ...)
        x = [int(s["step"]) for s in steps]
        choices = [sum(float(s[c]) for c in experts) + float(s["dropped"]) for s in steps]
        for c in experts:
            ax.plot(x, [float(s[c]) / n for s, n in zip(steps, choices)], label=f"expert {c[8:]}", linewidth=1.2)
        ax.plot(x, [float(s["dropped"]) / n for s, n in zip(steps, choices)], "k--", label="dropped")
        ax.axhline(1 / len(experts), color="grey", linewidth=0.8, linestyle=":")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        style(ax, "optimizer step", "share of the step's choices",
              f"{label}: {len(experts)} experts (balanced: 1/{len(experts)}, dotted)", grid="both")
        last = steps[-1]
        shares = "/".join(f"{float(last[c]) / choices[-1]:.3f}" for c in experts)
        dropped = float(last["dropped"]) / choices[-1]
        print(f"experts {label}: step {last['step']}: shares {shares}, dropped {dropped:.3f}, "
              f"aux_loss {float(last['aux_loss']):.6g}")
    return [finish(fig, out, "experts.png")]

