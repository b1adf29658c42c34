"""plot_zero.py: plot.py's figures of chapter 05: --zero (per ZeRO stage, the model state per rank
next to the ZeRO paper's formula, the bytes sent next to an all-reduce's, and the step time) and
--precision (fp32, bf16 and fp16 runs: loss curves, their difference, memory by category).

The memory formula is the planner's (common/plan --zero-table, plan_layout.c's plan_model_state),
asked rather than written again here."""
import functools
import os
import subprocess

from figure import CATEGORIES, COLOURS, MaxNLocator, finish, plt, stack_categories, style
from tool import Refusal, median

PLAN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plan")


@functools.lru_cache(maxsize=None)
def planner_model_state(params, n, precision):
    """{stage: model-state bytes per device} of the ZeRO paper's formula for params parameters on n
    devices (fp32, or 16-bit: bf16/fp16 share it), as common/plan --zero-table prints it (4 digits:
    enough for a mark on the plot)."""
    command = [PLAN, "--zero-table", "--params", str(params), "--gpus", str(n),
               "--precision", "fp32" if precision == "fp32" else "bf16"]
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except OSError as e:
        raise Refusal(f"--zero: cannot run {PLAN} for the ZeRO formula ({e.strerror}) "
                      "(valid: the planner, built by make)") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise Refusal(f"--zero: {' '.join(command)} failed: {why}")
    by_stage = {}
    for line in done.stdout.splitlines():
        words = line.split()  # "  P_os   1   params grads optimizer total_GB"
        if len(words) == 6 and words[1].isdigit():
            by_stage[int(words[1])] = sum(float(w) for w in words[2:5])
    if sorted(by_stage) != [0, 1, 2, 3]:
        raise Refusal(f"--zero: {' '.join(command)} printed no table of stages 0..3")
    return by_stage


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
    stack_categories(ax, [cats for _, _, cats, _ in rows], ("params", "grads", "optimizer"), 2**20, keep_empty=True)
    formula = [planner_model_state(int(r["params"]), int(r["world_size"]), r.get("precision", "fp32"))[int(r["zero"])]
               / 2**20 for _, r, _, _ in rows]
    ax.scatter(x, formula, color="black", marker="_", s=600, zorder=3, label="formula (common/plan --zero-table)")
    style(ax, ylabel="model state per rank (MiB)", title="Memory: params + grads + optimizer", grid=None)
    ax = axes[1]
    sent = [float(r["bytes_sent_per_step"]) / 2**20 for _, r, _, _ in rows]
    allreduce = [2 * (int(r["world_size"]) - 1) / int(r["world_size"]) * zero_grad_bytes(r) * int(r["params"])
                 * (1.5 if int(r["zero"]) == 3 else 1.0) / 2**20 for _, r, _, _ in rows]
    ax.bar(x, sent, color="#8172b3", label="measured")
    ax.scatter(x, allreduce, color="black", marker="_", s=600, zorder=3, label="formula")
    style(ax, ylabel="MiB sent per rank per step", title="Communication", grid=None)
    ax = axes[2]
    medians = [median(times) for _, _, _, times in rows]
    low = [m - min(times) for m, (_, _, _, times) in zip(medians, rows)]
    high = [max(times) - m for m, (_, _, _, times) in zip(medians, rows)]
    ax.bar(x, medians, yerr=[low, high], capsize=4, color="#4c72b0")
    style(ax, ylabel="median step time (ms)", title="Time (bars: min-max over repeats)", grid=None, legend=None)
    for ax in axes:
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=8, rotation=30, ha="right")
        ax.grid(axis="y", alpha=0.3)
    for (label, _, cats, _), f, m, a, t in zip(rows, formula, sent, allreduce, medians):
        print(f"zero {label}: model state {sum(cats.values()) / 2**20:.3f} MiB per rank (formula {f:.3f}), "
              f"sent {m:.3f} MiB per step (formula {a:.3f}), step {t:.1f} ms")
    return [finish(fig, out, "zero.png")]


def device_bytes(run, cat):
    """A run's peak device bytes of one category, all ranks together (memory.csv)."""
    return sum(int(r["peak_bytes"]) for r in run["memory"] if r["space"] == "device" and r["category"] == cat)


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
    ax_loss.xaxis.set_major_locator(MaxNLocator(integer=True))
    style(ax_loss, "optimizer step", "training loss", "fp32, bf16, fp16: close curves, not equal ones", grid="both")
    if first is not None:
        ax_diff.set_title(f"relative difference from {first[0]}")
    ax_diff.grid(alpha=0.3, which="both")
    style(ax_diff, "optimizer step", "|loss - reference| / reference", grid=None,
          legend=8 if len(groups) > 1 else None)
    labels = list(groups)
    bottom = [0.0] * len(labels)
    for cat in CATEGORIES:
        bytes_of = [device_bytes(groups[label][0], cat) for label in labels]
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
        per_param = {cat: device_bytes(run, cat) / params for cat in ("params", "grads", "optimizer")}
        print(f"precision {label}: bytes per parameter: params {per_param['params']:g}, grads "
              f"{per_param['grads']:g}, optimizer {per_param['optimizer']:g}; final loss "
              f"{float(run['run'][0]['final_loss']):.6g}")
    ax_mem.set_xticks(range(len(labels)))
    ax_mem.set_xticklabels(labels, fontsize=8, rotation=15, ha="right")
    style(ax_mem, ylabel="peak device memory, all ranks (MiB)", title="Memory by category", legend=7)
    return [finish(fig, out, "precision.png")]
