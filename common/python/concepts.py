#!/usr/bin/env python3
"""concepts.py: the course's concept drawings, generated so that they stay true.

    python3 common/python/concepts.py OUT_DIR            (all drawings)
    python3 common/python/concepts.py --slots SCHEDULE P M   (print one schedule's slot table)

Writes into OUT_DIR:
    ring-allreduce.png   chapter 02: the ring all-reduce on 4 ranks, step by
                         step: what each rank holds of each chunk after each
                         step of the reduce-scatter and of the all-gather
                         (the algorithm of 02_data_parallel/ring.c)
    tensor-parallel.png  chapter 03: where Megatron's f and g operators sit in
                         the MLP on 2 ranks (column-parallel fc, row-parallel
                         fcproj; 03_model_parallel/tensor_parallel.h)
    pipeline-slots.png   chapter 04: GPipe and 1F1B for P = 4 stages and M = 8
                         micro-batches, one forward = 1 slot, one backward =
                         2 slots. The order of each stage's work is the real
                         schedule, read from `04_pipeline/train --print-schedule`
                         (so it needs the program and mpirun); each action then
                         starts as soon as its stage is free and its input has
                         arrived (the previous stage's forward, the next
                         stage's backward)
    rank-grid.png        chapter 04: which world rank is which (replica, stage)
                         with --dp 2 --pp 4 (replica = rank / P, stage =
                         rank % P, as 04_pipeline/train.c splits the world)
    formats.png          chapter 05: fp32, bf16 and fp16 bit by bit (sign,
                         exponent, mantissa), with the range and epsilon that
                         follow from the bit counts (common/core/half.h's table)
OUT_DIR is a new name or a directory, and each drawing is written at a new
name or over an earlier drawing (a PNG matplotlib wrote), never over another
file: one line and exit status 2 (common/python/tool.py).
"""
import argparse
import os
import re
import subprocess
import sys

from tool import check_output_file, is_matplotlib_png, make_output_dir, run_tool

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORWARD_SLOTS, BACKWARD_SLOTS = 1, 2


# ---- chapter 04: schedules as slot tables ----

def read_schedule(schedule, P, M):
    """Each stage's compute actions in order, [("F", m) or ("B", m), ...], from the real program."""
    train = os.path.join(REPO, "04_pipeline", "train")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    cmd = ["mpirun", "--oversubscribe", "-np", str(P), train, "--print-schedule", "--pp", str(P), "--micro",
           str(M), "--batch", str(M), "--schedule", schedule, "--layers", str(P), "--device", "cpu"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    stages = {}
    for line in out.splitlines():
        m = re.match(r"stage (\d+): (.*)", line)
        if m:
            stages[int(m.group(1))] = [(a[0], int(a[1:])) for a in re.findall(r"\b[FB]\d+\b", m.group(2))]
    if sorted(stages) != list(range(P)):
        sys.exit(f"concepts: could not read the {schedule} schedule from {train} --print-schedule")
    return [stages[s] for s in range(P)]


def simulate(actions):
    """Start and end slot of every action: an action starts when its stage is
    free and its input exists (F m on stage s after F m on s-1; B m on s after
    B m on s+1, or after F m on the last stage). Returns {(stage, kind, m): (start, end)}."""
    P = len(actions)
    done, times, position, clock = {}, {}, [0] * P, [0] * P
    progress = True
    while progress:
        progress = False
        for s in range(P):
            if position[s] == len(actions[s]):
                continue
            kind, m = actions[s][position[s]]
            if kind == "F":
                need = (s - 1, "F", m) if s > 0 else None
            else:
                need = (s + 1, "B", m) if s < P - 1 else (s, "F", m)
            if need is not None and need not in done:
                continue
            start = max(clock[s], done[need] if need else 0)
            end = start + (FORWARD_SLOTS if kind == "F" else BACKWARD_SLOTS)
            done[(s, kind, m)] = end
            times[(s, kind, m)] = (start, end)
            clock[s] = end
            position[s] += 1
            progress = True
    if any(position[s] != len(actions[s]) for s in range(P)):
        sys.exit("concepts: the schedule cannot finish (a stage waits for an action that never runs)")
    return times


def slot_table(times, P):
    """One text row per stage: F3 / B3 B3 / '.' per slot."""
    makespan = max(end for _, end in times.values())
    rows = [["." for _ in range(makespan)] for _ in range(P)]
    for (s, kind, m), (start, end) in times.items():
        for t in range(start, end):
            rows[s][t] = f"{kind}{m}"
    return makespan, rows


def draw_pipelines(out, P=4, M=8):
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, axes = plt.subplots(2, 1, figsize=(12, 5.2))
    for ax, schedule in zip(axes, ["gpipe", "1f1b"]):
        times = simulate(read_schedule(schedule, P, M))
        makespan, _ = slot_table(times, P)
        for (s, kind, m), (start, end) in times.items():
            colour = "#4c72b0" if kind == "F" else "#dd8452"
            ax.add_patch(Rectangle((start, P - 1 - s), end - start, 0.9, facecolor=colour, edgecolor="white"))
            ax.text((start + end) / 2, P - 1 - s + 0.45, f"{kind}{m}", ha="center", va="center", fontsize=7,
                    color="white")
        busy = P * M * (FORWARD_SLOTS + BACKWARD_SLOTS)
        bubble = 1 - busy / (P * makespan)
        ax.set_xlim(0, makespan)
        ax.set_ylim(0, P)
        ax.set_yticks([P - 1 - s + 0.45 for s in range(P)])
        ax.set_yticklabels([f"stage {s}" for s in range(P)])
        ax.set_title(f"{'GPipe' if schedule == 'gpipe' else '1F1B'}, P = {P}, M = {M}: {makespan} slots, "
                     f"idle fraction {bubble:.3f} = (P-1)/(M+P-1) = {(P - 1) / (M + P - 1):.3f}", fontsize=10)
        ax.set_xticks(range(0, makespan + 1, 3))
    axes[-1].set_xlabel("time slot (forward F = 1 slot, backward B = 2 slots)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "pipeline-slots.png"), dpi=110)
    plt.close(fig)


def draw_rank_grid(out, D=2, P=4):
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(7, 2.8))
    for rank in range(D * P):
        replica, stage = rank // P, rank % P
        ax.add_patch(Rectangle((stage, D - 1 - replica), 0.92, 0.85, facecolor="#c6d4ea", edgecolor="#4c72b0"))
        ax.text(stage + 0.46, D - 1 - replica + 0.5, f"rank {rank}", ha="center", fontsize=10)
        ax.text(stage + 0.46, D - 1 - replica + 0.2, f"replica {replica}, stage {stage}", ha="center", fontsize=7)
    ax.set_xlim(-0.05, P)
    ax.set_ylim(-0.05, D)
    ax.set_xticks([s + 0.46 for s in range(P)])
    ax.set_xticklabels([f"stage {s}\n(a data group: all replicas)" if s == 0 else f"stage {s}" for s in range(P)],
                       fontsize=8)
    ax.set_yticks([D - 1 - r + 0.42 for r in range(D)])
    ax.set_yticklabels([f"replica {r}\n(a pipeline group)" for r in range(D)], fontsize=8)
    ax.set_title(f"04_pipeline/train --dp {D} --pp {P}: replica = rank / P, stage = rank % P", fontsize=10)
    for side in ax.spines.values():
        side.set_visible(False)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "rank-grid.png"), dpi=110)
    plt.close(fig)


# ---- chapter 02: the ring all-reduce ----

def ring_steps(N):
    """What each rank holds of each chunk after every step, as sets of contributing ranks.
    Reduce-scatter step k: rank r sends chunk (r - k) mod N to rank r+1, which adds it.
    All-gather step k: rank r sends chunk (r + 1 - k) mod N, which the next rank copies."""
    holds = [[{r} for _ in range(N)] for r in range(N)]
    states = [("start", [[set(c) for c in row] for row in holds])]
    for k in range(N - 1):
        sends = [(r, (r - k) % N, set(holds[r][(r - k) % N])) for r in range(N)]
        for r, c, value in sends:
            holds[(r + 1) % N][c] |= value
        states.append((f"reduce-scatter {k + 1}", [[set(c) for c in row] for row in holds]))
    for k in range(N - 1):
        sends = [(r, (r + 1 - k) % N, set(holds[r][(r + 1 - k) % N])) for r in range(N)]
        for r, c, value in sends:
            holds[(r + 1) % N][c] = value
        states.append((f"all-gather {k + 1}", [[set(c) for c in row] for row in holds]))
    return states


def draw_ring(out, N=4):
    import matplotlib.pyplot as plt

    states = ring_steps(N)
    if any(len(chunk) != N for row in states[-1][1] for chunk in row):
        sys.exit("concepts: the ring did not end with every chunk summed on every rank")
    letters = "abcdefgh"
    fig, axes = plt.subplots(1, len(states), figsize=(2.0 * len(states), 2.6))
    for ax, (title, holds) in zip(axes, states):
        for r in range(N):
            for c in range(N):
                count = len(holds[r][c])
                ax.add_patch(plt.Rectangle((c, N - 1 - r), 0.95, 0.9, color=plt.cm.Blues(0.15 + 0.8 * count / N)))
                parts = [f"{letters[c]}{x}" for x in sorted(holds[r][c])]
                label = "all" if count == N else "+".join(parts[:2]) + ("\n+" + "+".join(parts[2:]) if count > 2 else "")
                ax.text(c + 0.47, N - 1 - r + 0.45, label, ha="center", va="center", fontsize=5.5,
                        color="white" if count > N / 2 else "black")
        ax.set_xlim(0, N)
        ax.set_ylim(0, N)
        ax.set_xticks([c + 0.47 for c in range(N)])
        ax.set_xticklabels([f"chunk {letters[c]}" for c in range(N)], fontsize=6, rotation=90)
        ax.set_yticks([N - 1 - r + 0.45 for r in range(N)])
        ax.set_yticklabels([f"rank {r}" for r in range(N)] if ax is axes[0] else [], fontsize=7)
        ax.set_title(title, fontsize=8)
        ax.tick_params(length=0)
    fig.suptitle(f"Ring all-reduce on {N} ranks: a2 is rank 2's part of chunk a; each step, every rank "
                 f"sends one chunk to the next rank", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ring-allreduce.png"), dpi=110)
    plt.close(fig)


# ---- chapter 03: f and g in the MLP ----

def draw_tensor_parallel(out):
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig, ax = plt.subplots(figsize=(10, 3.4))
    ax.set_xlim(0, 10.3)
    ax.set_ylim(0, 3.4)
    ax.axis("off")

    def box(x, y, text, colour, w=1.3, h=0.55):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.03", facecolor=colour, edgecolor="#444"))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8)

    def arrow(x0, y0, x1, y1):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(arrowstyle="->", color="#444"))

    box(0.1, 1.4, "x (B,T,C)\nevery rank", "#eeeeee")
    box(1.8, 1.4, "f\nforward: copy\nbackward: all-reduce", "#f2c6a0", w=1.5, h=0.75)
    for i, y in enumerate([2.4, 0.4]):
        box(3.8, y, f"fc, columns\n{i * 2}C..{i * 2 + 2}C (rank {i})", "#c6d4ea", w=1.5)
        box(5.7, y, "GELU\n(local)", "#d9ead3", w=1.0)
        box(7.0, y, f"fcproj, rows\n{i * 2}C..{i * 2 + 2}C (rank {i})", "#c6d4ea", w=1.5)
        arrow(3.3, 1.78, 3.8, y + 0.28)
        arrow(5.3, y + 0.28, 5.7, y + 0.28)
        arrow(6.7, y + 0.28, 7.0, y + 0.28)
        arrow(8.5, y + 0.28, 8.7, 1.78)
    box(8.7, 1.4, "g\nforward: all-reduce\nbackward: copy", "#f2c6a0", w=1.45, h=0.75)
    arrow(1.4, 1.68, 1.8, 1.78)
    ax.text(5.0, 3.25, "The MLP on 2 ranks: f before the column-parallel fc, g after the row-parallel fcproj "
            "(one all-reduce each way per MLP)", ha="center", fontsize=9)
    fig.savefig(os.path.join(out, "tensor-parallel.png"), dpi=110, bbox_inches="tight")
    plt.close(fig)


# ---- chapter 05: the three floating-point formats ----

FORMATS = [("fp32", 8, 23), ("bf16", 8, 7), ("fp16", 5, 10)]  # name, exponent bits, mantissa bits


def format_numbers(exponent_bits, mantissa_bits):
    """Largest finite, smallest normal, smallest subnormal and epsilon of an
    IEEE-style binary format, from its bit counts alone."""
    bias = 2 ** (exponent_bits - 1) - 1
    largest = (2 - 2.0 ** -mantissa_bits) * 2.0 ** bias
    smallest_normal = 2.0 ** (1 - bias)
    return largest, smallest_normal, smallest_normal * 2.0 ** -mantissa_bits, 2.0 ** -mantissa_bits


def draw_formats(out):
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    width = 0.25  # per bit
    fig, ax = plt.subplots(figsize=(11, 3.2))
    ax.set_xlim(-1.2, 32 * width + 0.2)
    ax.set_ylim(-0.2, 3.3)
    ax.axis("off")
    colours = {"sign": "#c44e52", "exponent": "#4c72b0", "mantissa": "#55a868"}
    for row, (name, e, m) in enumerate(FORMATS):
        y = 2.4 - row * 1.05
        fields = [("sign", 1), ("exponent", e), ("mantissa", m)]
        x = 0.0
        for field, bits in fields:
            for _ in range(bits):
                ax.add_patch(Rectangle((x, y), width, 0.42, facecolor=colours[field], edgecolor="white"))
                x += width
            ax.text(x - bits * width / 2, y + 0.21, f"{bits}" if bits > 1 else "s", ha="center", va="center",
                    fontsize=8, color="white", fontweight="bold")
        ax.text(-0.2, y + 0.21, name, ha="right", va="center", fontsize=11, fontweight="bold")
        largest, normal, subnormal, eps = format_numbers(e, m)
        ax.text(x + 0.15, y + 0.21,
                f"max {largest:.6g}   min normal {normal:.2g}   min subnormal {subnormal:.2g}   "
                f"epsilon 2^-{m} = {eps:.2g}", ha="left", va="center", fontsize=8)
    for i, (field, colour) in enumerate(colours.items()):
        ax.add_patch(Rectangle((i * 1.9, -0.15), 0.25, 0.2, facecolor=colour))
        ax.text(i * 1.9 + 0.35, -0.05, field, va="center", fontsize=8)
    ax.text(4.0, 3.15, "Three formats: the exponent bits set the range, the mantissa bits the precision",
            ha="center", fontsize=10)
    fig.savefig(os.path.join(out, "formats.png"), dpi=110, bbox_inches="tight")
    plt.close(fig)


DRAWINGS = ("ring-allreduce.png", "tensor-parallel.png", "pipeline-slots.png", "rank-grid.png", "formats.png")


def main():
    ap = argparse.ArgumentParser(description="Draw the course's concept figures.")
    ap.add_argument("out", nargs="?", help="directory for the PNG files")
    ap.add_argument("--slots", nargs=3, metavar=("SCHEDULE", "P", "M"),
                    help="print the slot table of one schedule instead of drawing")
    args = ap.parse_args()
    if args.slots:
        schedule, P, M = args.slots[0], int(args.slots[1]), int(args.slots[2])
        makespan, rows = slot_table(simulate(read_schedule(schedule, P, M)), P)
        print(f"{schedule}, P = {P}, M = {M}: {makespan} slots")
        for s, row in enumerate(rows):
            print(f"stage {s}: " + " ".join(f"{x:>3}" for x in row))
        return
    if not args.out:
        ap.error("give OUT_DIR (or --slots SCHEDULE P M)")
    # OUT_DIR and each drawing's name there: new, or the drawings of an earlier run (tool.py's rule)
    make_output_dir(args.out, "OUT_DIR")
    for name in DRAWINGS:
        check_output_file(os.path.join(args.out, name), "OUT_DIR", "PNG matplotlib wrote", is_matplotlib_png)
    import matplotlib
    matplotlib.use("Agg")
    draw_ring(args.out)
    draw_tensor_parallel(args.out)
    draw_pipelines(args.out)
    draw_rank_grid(args.out)
    draw_formats(args.out)
    print(f"concepts: wrote {', '.join(DRAWINGS)} in {args.out}")


if __name__ == "__main__":
    run_tool("concepts: ", main)
