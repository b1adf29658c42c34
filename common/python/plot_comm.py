"""plot_comm.py: plot.py's figures of communication: chapter 02's commbench (--commbench: bus
bandwidth against message size) and chapter 03's context parallelism (--cp: a rank's activations
against the sequence length, measured and the formula)."""
import re
from collections import OrderedDict

from figure import finish, plt, style
from tool import Refusal, read_csv

COMMBENCH = "a CSV written by 02_data_parallel/commbench"


def plot_commbench(paths, out):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for path in paths:
        rows = read_csv(path, COMMBENCH)
        for op in OrderedDict((r["op"], None) for r in rows):
            pts = [(int(r["size_bytes"]), float(r["busbw_GBps"])) for r in rows if r["op"] == op]
            ranks = rows[0]["ranks"]
            ax.plot(*zip(*pts), "o-", label=f"{op} ({ranks} ranks)", markersize=4)
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3, which="both")
    style(ax, "message size (bytes)", "bus bandwidth (GB/s)",
          "Collective bus bandwidth vs message size (latency-bound left, bandwidth-bound right)", grid=None)
    return [finish(fig, out, "busbw.png")]


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
            raise Refusal(f"--cp takes runs labelled 03-cpN-seqT, not {label}")
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
    style(ax, "sequence length T (tokens)", "activations per rank (MiB)",
          "Context parallelism: a rank keeps T/N tokens' activations", grid="both")
    return [finish(fig, out, "cp_memory.png")]
