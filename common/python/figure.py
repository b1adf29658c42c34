"""figure.py: what every figure of plot.py shares: matplotlib (or one line saying it is missing), the
memory categories' colours, and the figure's epilogue: its axes' titles and labels (style), and
saving it (finish) under the output-file rule of common/python/tool.py.

The figures themselves live by chapter: plot_runs.py (every chapter's runs), plot_comm.py (02's
commbench, 03's --cp), plot_timeline.py (timeline.csv: 03's ring and --ep, 04, 05, 06), plot_pipeline.py
(04), plot_zero.py (05), plot_offload.py (06), plot_plan.py (common/plan). plot.py is their command.
"""
import os
import sys

from tool import check_output_file, is_matplotlib_png

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: F401 (for the figures)
except ImportError as e:  # before any argument is read: the one thing every mode needs
    print(f"plot.py: this python3 cannot import matplotlib ({e}) (valid: a python3 with matplotlib, "
          "which common/scripts/install-deps.sh installs)", file=sys.stderr)
    sys.exit(2)

CATEGORIES = ["params", "grads", "optimizer", "activations", "comm", "workspace", "gathered", "buckets"]
COLOURS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868",
           "activations": "#c44e52", "comm": "#8172b3", "workspace": "#937860",
           "gathered": "#da8bc3", "buckets": "#8c8c8c"}


def style(ax, xlabel=None, ylabel=None, title=None, grid="y", legend=8, title_size=None):
    """An axes' words and grid: its labels and title (those given), a light grid along grid ("x", "y",
    "both", or None for none) and a legend of that font size (None: no legend); title_size, when given,
    the title's font size (else matplotlib's for titles)."""
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title, **({} if title_size is None else {"fontsize": title_size}))
    if grid == "both":
        ax.grid(alpha=0.3)
    elif grid:
        ax.grid(axis=grid, alpha=0.3)
    if legend:
        ax.legend(fontsize=legend)


def stack_categories(ax, bars, categories=CATEGORIES, scale=1.0, keep_empty=False):
    """One stacked bar per entry of bars (each {category: value}), a segment per category in
    COLOURS, values divided by scale; a category empty in every bar is left out of the stack and the
    legend unless keep_empty. Returns the bars' tops."""
    bottom = [0.0] * len(bars)
    for cat in categories:
        heights = [cats.get(cat, 0) / scale for cats in bars]
        if not keep_empty and not any(heights):
            continue
        ax.bar(range(len(bars)), heights, bottom=bottom, label=cat, color=COLOURS[cat])
        bottom = [b + h for b, h in zip(bottom, heights)]
    return bottom


def finish(fig, out, name):
    """The end of every figure: laid out, written as out/name (a new name, or a PNG matplotlib wrote:
    an earlier plot; tool.check_output_file refuses anything else in one line) and closed. Returns name,
    for plot.py's "wrote NAMES to OUT"."""
    fig.tight_layout()
    path = os.path.join(out, name)
    check_output_file(path, "--out", "PNG plot.py wrote", is_matplotlib_png)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return name
