"""plot_pipeline.py: plot.py's figures of chapter 04's pipeline runs: --sweep (step time and bubble
against the micro-batches, per schedule), --bubbles (each configuration's measured bubble against
its schedule's formula) and --grid (memory per rank and bytes per axis of a pp x cp x tp x dp run)."""
from collections import OrderedDict

from figure import finish, plt, stack_categories, style
from pipeline_bubble import timeline_replay, zb_h1_formula_measured
from plot_runs import device_memory_by_rank
from rundir import grid_place
from tool import Refusal, median

GRID_AXES = ("dp", "pp", "cp", "tp")


def pipeline_runs_only(groups):
    """Refuses (one line) a run whose run.csv has no measured bubble: --sweep and --bubbles read a
    pipeline's schedule, micro-batches and bubble, which another chapter's run does not have."""
    for runs in groups.values():
        for run in runs:
            if not run["run"][0].get("schedule") or not run["run"][0].get("bubble_measured"):
                raise Refusal(f"{run['dir']}/run.csv has no schedule and bubble_measured: not a pipeline run "
                              "(valid: runs of chapter 04, or 05-06 with --pp)")


def plot_grid(groups, out):
    """Per configuration: memory per rank by category, and the bytes per step of each grid axis."""
    names = []
    for label, runs in groups.items():
        run = runs[0]
        row = run["run"][0]
        missing = [a for a in GRID_AXES if f"bytes_{a}_per_step" not in row]
        if missing:
            raise Refusal(f"{run['dir']}/run.csv has no bytes_{missing[0]}_per_step "
                          "(valid: a run of chapter 04 or 05's pipeline)")
        by_rank = device_memory_by_rank(run["memory"])
        fig, (ax_mem, ax_bytes) = plt.subplots(1, 2, figsize=(max(10, 1.0 * len(by_rank) + 5), 4.5),
                                               gridspec_kw={"width_ratios": [max(2, len(by_rank)), 2]})
        ranks = list(by_rank)
        stack_categories(ax_mem, [by_rank[r] for r in ranks])
        ax_mem.set_xticks(range(len(ranks)))
        ax_mem.set_xticklabels([f"rank {r}\ns{grid_place(row, r)[0]} t{grid_place(row, r)[1]} d{grid_place(row, r)[2]}"
                                for r in ranks], fontsize=8)
        style(ax_mem, ylabel="peak device memory (MiB)", title=f"{label}: memory per rank (s stage, t tp rank, d replica)",
              legend=7, title_size=10)
        sent = [float(row[f"bytes_{a}_per_step"]) / 2**20 for a in GRID_AXES]
        bars = ax_bytes.bar(GRID_AXES, sent, color=["#55a868", "#4c72b0", "#8c8c8c", "#c44e52"])
        for bar, value in zip(bars, sent):
            ax_bytes.annotate(f"{value:.2f}", (bar.get_x() + bar.get_width() / 2, value), ha="center",
                              va="bottom", fontsize=8)
        style(ax_bytes, ylabel="MiB sent per step, all ranks",
              title=f"bytes per axis (dp {row['dp']}, pp {row['pp']}, tp {row['tp']})", legend=None, title_size=10)
        names.append(finish(fig, out, f"grid-{label}.png"))
        print(f"plot.py: {label}: bytes per step " +
              ", ".join(f"{a} {float(row[f'bytes_{a}_per_step']):.0f}" for a in GRID_AXES))
    return names


def plot_sweep(groups, out):
    """Two panels against M, one line per schedule. Configurations are compared
    by their fastest repeat: background load only ever adds time, so the
    minimum over repeats is the least disturbed estimate (every repeat is drawn
    as a dot, so the noise stays visible)."""
    pipeline_runs_only(groups)
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
        ax.grid(alpha=0.3, which="both")
        style(ax, xlabel="micro-batches per global batch (M)", grid=None)
    style(ax_time, ylabel="step time (ms; median over a run's steps)",
          title="Step time against M (line: fastest of the repeats)", grid=None, legend=None)
    ax_bubble.set_ylim(bottom=0)
    style(ax_bubble, ylabel="bubble: idle fraction of the stages' time", title="Measured bubble against the formula",
          grid=None, legend=None)
    return [finish(fig, out, "sweep.png")]


def plot_bubbles(groups, out):
    """The measured bubble of each configuration against its schedule's formula."""
    pipeline_runs_only(groups)
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
        if replayed is not None:  # (one stage replays to no bubble: no ratio to it)
            ratio = f" ({median(values) / replayed - 1:+.0%})" if replayed > 0 else ""
            extra += f", {replayed:.3f} replayed at the run's own times{ratio}"
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
    top = max(max(v) for v in measured) if all(v == v for m in measured for v in m) else None
    ax.set_ylim(0, 1.5 * top if top else None)  # room for the legend above the bars
    style(ax, ylabel="bubble: idle fraction of the stages' time", title="Measured bubble against each schedule's formula")
    return [finish(fig, out, "bubbles.png")]
