"""pipeline_bubble.py: zero bubble's formula at measured times, and the times a timeline measured.

Used by plot.py (--bubbles) and common/scripts/bubble_bench.sh; no plotting library needed.
"""
import csv
import os
from statistics import median


def zb_h1_formula(P, M, tf, tb, tw):
    """ZB-H1's idle fraction (schedule.h, schedule_bubble_formula) for a forward tf, B tb and W tw."""
    idle = (P - 1) * (tf + tb - tw)
    return idle / (M * (tf + tb + tw) + idle)


def measured_op_times(run_dir):
    """{op: median duration in us} over rank 0's records of every step but the first, or {} without a timeline."""
    path = os.path.join(run_dir, "timeline.csv")
    if not os.path.exists(path):
        return {}
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["rank"] == "0"]
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
