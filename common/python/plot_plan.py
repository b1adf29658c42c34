"""plot_plan.py: plot.py --plan: common/plan's predicted step time and memory against the runs'."""
import os

from figure import finish, plt, style
from tool import Refusal, median, read_csv

PLAN_FILES = "common/plan's --csv and --time-csv of the run's layout"


def fullest_rank_device_bytes(rows):
    """The most device bytes of any rank in memory.csv's (or plan.csv's) rows."""
    return max(sum(int(r["peak_bytes"]) for r in rows if r["rank"] == rank and r["space"] == "device")
               for rank in {r["rank"] for r in rows})


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
    for label, runs in groups.items():
        run = runs[0]
        if not all(os.path.exists(os.path.join(run["dir"], n)) for n in ("plan.csv", "plan-time.csv")):
            skipped.append(label)
            continue
        planned += 1
        time_rows = read_csv(os.path.join(run["dir"], "plan-time.csv"), PLAN_FILES)
        predicted_ms = next(float(r["exposed_ms"]) for r in time_rows if r["part"] == "step")
        measured_ms = median([float(r["run"][0]["median_step_ms"]) for r in runs])
        planned_bytes = fullest_rank_device_bytes(read_csv(os.path.join(run["dir"], "plan.csv"), PLAN_FILES))
        measured_bytes = fullest_rank_device_bytes(run["memory"])
        ax_time.scatter(predicted_ms, measured_ms, s=14)
        ax_time.annotate(label, (predicted_ms, measured_ms), fontsize=6)
        ax_mem.scatter(planned_bytes / 2**20, measured_bytes / 2**20, s=14)
        ax_mem.annotate(label, (planned_bytes / 2**20, measured_bytes / 2**20), fontsize=6)
    if not planned:
        raise Refusal("no run directory holds plan.csv and plan-time.csv (write them with common/plan ... "
                      "--csv FILE --time-csv FILE, as demo.sh does)")
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
    style(ax_time, "predicted step (ms, common/plan --machine)", "measured median step (ms)",
          f"Step time: predicted against measured ({planned} layouts)", grid=None)
    style(ax_mem, "planned peak device memory, fullest rank (MiB)", "measured (memory.csv, MiB)",
          "Memory: planned against measured", grid=None)
    return [finish(fig, out, "plan.png")]
