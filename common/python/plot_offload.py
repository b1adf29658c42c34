"""plot_offload.py: plot.py's figures of chapter 06's tools: --capacity (06_offload/capacity.py's
largest model per device budget) and --offload-bench (common/scripts/bench_offload.sh's step time
per configuration). One step of an offloaded run's timeline is plot_timeline.py's --offload."""
from collections import OrderedDict

from figure import FuncFormatter, finish, plt, style
from tool import read_csv

CAPACITY = "the capacity.csv of 06_offload/capacity.py"
OFFLOAD_BENCH = "the offload_summary.csv of common/scripts/bench_offload.sh"


def plot_capacity(path, out):
    rows = read_csv(path, CAPACITY)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    by_program = OrderedDict()
    for r in rows:
        by_program.setdefault(r["program"], []).append((int(r["budget_bytes"]) / 1048576, int(r["params"]) / 1e6))
    names = {"01": "01: everything on the device", "06": "06: --offload (optimizer on the host)",
             "06p": "06: --offload --offload-params (the weights too)"}
    capped = {r["program"] for r in rows if r.get("at_cap") == "1"}  # "at least": the search's layer cap
    for program, points in by_program.items():
        points.sort()
        label = names.get(program, program) + (",\nat least: the --max-layers cap" if program in capped else "")
        ax.plot([b for b, _ in points], [p for _, p in points], marker="o", label=label)
    base = dict(by_program.get("01", []))
    for program in (p for p in ("06", "06p") if p in by_program and base):
        last = max(b for b, _ in by_program[program])
        for budget, params in by_program[program]:
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
    # two lines, so that the title fits the figure's width
    style(ax, "device budget, --device-mem-limit (MiB)", "parameters of the largest model trained (M)",
          f"The largest model per device budget\n({precision}: 16 bytes a parameter on the device, "
          "2 with offload, 0 with the weights too)", grid="both", legend=None, title_size=10)
    ax.legend(loc="lower right")
    return [finish(fig, out, "capacity.png")]


def plot_offload_bench(path, out):
    """common/scripts/bench_offload.sh's summary: step time per configuration, grouped by ranks."""
    rows = read_csv(path, OFFLOAD_BENCH)
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
    first = rows[0] if rows else {}
    ax.set_ylim(0, max(m + h for m, h in zip(medians, high)) * 1.25 if rows else 1)
    style(ax, ylabel="median step time (ms)",
          title=f"Offload, DPU and the combined trainer: {first.get('model', '')} preset, "
                f"{first.get('precision', '')}, {first.get('machine', '')}\n(bars: min-max over repeats)",
          legend=None, title_size=9)
    return [finish(fig, out, "offload.png")]
