"""pipeline_bubble.py: a pipeline step's bubble at the times its timeline measured: zero bubble's formula
at the measured F, B and W, and any schedule replayed with each computation's own time.

Used by plot.py (--bubbles) and common/scripts/bubble_bench.sh; no plotting library needed.
"""
from functools import lru_cache

from rundir import read
from tool import median


def zb_h1_formula(P, M, tf, tb, tw):
    """ZB-H1's idle fraction (schedule.h, schedule_bubble_formula) for a forward tf, B tb and W tw:
    W fills F + B - W of each piece's idle, but never the last stage's (P - 1) tf before its first F."""
    idle = (P - 1) * max(tf, tf + tb - tw)
    return idle / (M * (tf + tb + tw) + idle)


@lru_cache(maxsize=None)
def timeline_rows(run_dir):
    """A run's timeline.csv as a tuple of rows (dicts), read once however many of the functions
    below ask; None without one. One that is not a timeline (empty, cut short, binary) is refused
    (tool.Refusal: one line, exit status 2 under tool.run_tool)."""
    rows = read(run_dir, "timeline", "the timeline.csv of a pipeline run")
    return None if rows is None else tuple(rows)


def measured_op_times(run_dir):
    """{op: median duration in us} over rank 0's records of every step but the first, or {} without a timeline."""
    rows = [r for r in timeline_rows(run_dir) or () if r["rank"] == "0"]
    first = min((int(r["step"]) for r in rows), default=0)
    durations = {}
    for r in rows:
        if int(r["step"]) > first:
            durations.setdefault(r["op"], []).append(float(r["end_us"]) - float(r["start_us"]))
    return {op: median(v) for op, v in durations.items()}


def zb_h1_formula_measured(run_dir, P, M):
    """ZB-H1's formula at the F, B and W the run's timeline measured; None without them."""
    times = measured_op_times(run_dir)
    if not all(op in times for op in ("fwd", "bwd_input", "bwd_weight")):
        return None
    return zb_h1_formula(P, M, times["fwd"], times["bwd_input"], times["bwd_weight"])


# The computations of a timeline (timeline.csv's op column), as the schedules name them:
# a forward, a backward (or zero bubble's B, the input's gradient), zero bubble's W.
COMPUTE_OPS = {"fwd": "F", "bwd": "B", "bwd_input": "B", "bwd_weight": "W"}


def replay_bubble(actions, P, V=1):
    """The idle fraction of a pipeline step in which every computation takes the time it took and
    every message none: the schedule's bubble at the run's own times.

    actions[s] is stage s's computations in the order it ran them, (kind, micro, duration) with
    kind F, B or W. A stage's k-th F of a micro-batch is its chunk k, its k-th B (and W) chunk
    V-1-k (the backward runs the chunks in reverse); chunk c of stage s is piece c x P + s of
    the model (layer_split.h). F of a piece needs the previous piece's F of that micro-batch, B
    needs the next piece's B, W its own B; a stage runs its list in order, each action as soon as
    the stage is free and what it needs is done. With equal times this is each schedule's
    formula (schedule_bubble_formula); with the times a run measured it takes the stages'
    imbalance and the spread of their computations into the theory, and leaves to the
    measurement only what messages and waits add."""
    pieces = P * V
    lists = []
    for s in range(P):
        seen, out = {}, []
        for kind, micro, duration in actions[s]:
            k = seen.get((kind, micro), 0)
            seen[(kind, micro)] = k + 1
            chunk = k if kind == "F" else V - 1 - k
            out.append((kind, micro, chunk * P + s, duration))
        lists.append(out)
    done, at, free = {}, [0] * P, [0.0] * P
    moved = True
    while moved:
        moved = False
        for s in range(P):
            while at[s] < len(lists[s]):
                kind, micro, piece, duration = lists[s][at[s]]
                if kind == "F":
                    needs = [("F", micro, piece - 1)] if piece > 0 else []
                elif kind == "B":
                    needs = [("F", micro, piece)] + ([("B", micro, piece + 1)] if piece < pieces - 1 else [])
                else:
                    needs = [("B", micro, piece)]
                if any(n not in done for n in needs):
                    break
                free[s] = done[(kind, micro, piece)] = max([free[s]] + [done[n] for n in needs]) + duration
                at[s] += 1
                moved = True
    if any(at[s] < len(lists[s]) for s in range(P)):
        raise ValueError("replay_bubble: the actions wait on each other (not one schedule's lists)")
    span = max(free)
    busy = sum(a[3] for lst in lists for a in lst)
    return 1.0 - busy / (P * span) if span > 0 else 0.0


def timeline_replay(run_dir, P, tp=1):
    """replay_bubble over every step but the first of a run's timeline.csv (the ranks of replica 0's
    tensor rank 0: stage s is world rank s x tp, grid.h), the median over those steps; V is how
    many forwards stage 0 ran of micro-batch 0. None without a timeline, with one step, or with
    steps that do not replay (a timeline of some ranks or actions only)."""
    rows = timeline_rows(run_dir)
    if rows is None:
        return None
    steps = {}
    for r in rows:
        rank, kind = int(r["rank"]), COMPUTE_OPS.get(r["op"])
        if kind is None or rank % tp or rank // tp >= P:
            continue
        start, end = float(r["start_us"]), float(r["end_us"])
        steps.setdefault(int(r["step"]), [[] for _ in range(P)])[rank // tp].append(
            (start, kind, int(r["micro"]), end - start))
    replayed = []
    for step in sorted(steps)[1:]:
        actions = [[a[1:] for a in sorted(stage)] for stage in steps[step]]
        V = sum(1 for kind, micro, _ in actions[0] if kind == "F" and micro == 0)
        try:
            replayed.append(replay_bubble(actions, P, max(V, 1)))
        except ValueError:
            continue
    return median(replayed) if replayed else None
