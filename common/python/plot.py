#!/usr/bin/env python3
"""plot.py: draw the course's plots from run directories (steps.csv, memory.csv, run.csv).

    python3 common/python/plot.py RUN_DIR... [--out DIR]
    python3 common/python/plot.py --commbench CSV... [--out DIR]
    python3 common/python/plot.py --gantt RUN_DIR... [--step N] [--out DIR]
    python3 common/python/plot.py --ep RUN_DIR... [--step N] [--out DIR]
    python3 common/python/plot.py --sweep RUN_DIR... [--out DIR]
    python3 common/python/plot.py --bubbles RUN_DIR... [--out DIR]
    python3 common/python/plot.py --zero RUN_DIR... [--out DIR]
    python3 common/python/plot.py --precision RUN_DIR... [--out DIR]
    python3 common/python/plot.py --offload RUN_DIR... [--step N] [--out DIR]
    python3 common/python/plot.py --capacity CSV [--out DIR]
    python3 common/python/plot.py --offload-bench SUMMARY_CSV [--out DIR]
    python3 common/python/plot.py --plan RUN_DIR... [--out DIR]
    python3 common/python/plot.py --grid RUN_DIR... [--out DIR]
    python3 common/python/plot.py --experts RUN_DIR... [--out DIR]

Reads only the CSVs that every chapter program writes, so a learner can plot
their own runs next to the demo's. A run's label is its directory name;
directories named LABEL.rN (N = 1, 2, ...) are repeats of one configuration:
runtime bars show their median with min-max error bars, and loss curves use
the first repeat.

Anything it cannot draw (a file missing, empty, cut short or of another kind, a
column the mode needs) is refused in one line naming the file and what the mode
reads, exit status 2. --out is a new name or a directory; a PNG there is
replaced only if it is plot.py's own earlier plot (a PNG matplotlib wrote),
never another file (common/python/tool.py).

This file is the command; the figures live by chapter beside it (plot_runs.py,
plot_comm.py, plot_timeline.py, plot_pipeline.py, plot_zero.py, plot_offload.py,
plot_plan.py), share figure.py's epilogue (titles, saving), and read run
directories through rundir.py.

Plots written to --out (default runs/plots):
    loss.png        loss curves overlaid (they must coincide across chapters)
    runtime.png     median step time per configuration, with error bars
    throughput.png  tokens/s per configuration, with error bars
    memory.png      peak memory per rank, stacked by category (device space)
    breakdown.png   median step time split into forward, backward, optimizer,
                    exposed communication (comm_ms: the time the step waited
                    on it) and other (the rest of the step), so that
                    each bar adds up to the median step time, marked on it;
                    where the parts overlap (pipeline stages count their
                    waits in forward and backward) the bar says by how much
    idle.png        (runs with a busy.csv, chapter 03) per rank, the median time
                    per step spent computing and the rest: waiting or communicating
With --cp, from chapter 03's --cp runs labelled 03-cpN-seqT:
    cp_memory.png   rank 0's activation bytes against the sequence length, one
                    line per cp, measured (memory.csv) and the formula (dashed)
With --commbench, from 02_data_parallel/commbench CSVs:
    busbw.png       bus bandwidth against message size, one line per operation
With --gantt, from timeline.csv (chapters 04 and 05, and chapter 03's --cp ring;
chapter 03's --ep: as --ep below):
    gantt-LABEL.png what each rank did during one step (default: the last):
                    pipeline runs: forward and backward boxes numbered by
                    micro-batch; ZeRO runs: per rank a row of computation
                    and a row of communication (gathers, reduce-scatters)
With --ep (or --gantt), from chapter 03 --experts E --ep N runs' timeline.csv and steps.csv:
    ep-LABEL.png    one step (default: the last) of each rank: each MoE block's
                    dispatch all-to-all, its experts' computation and the
                    combine all-to-all, forward then backward (numbers: the
                    MoE block), beside the load per step: ep_rows_max (the
                    busiest rank's expert rows) against ep_rows_mean; one line
                    printed: the step's load and their ratio
With --zero, from chapter 05 runs (run.csv's zero, world_size, params,
bytes_sent_per_step; memory.csv):
    zero.png        per ZeRO stage: the model state per rank (params, grads,
                    optimizer; the largest rank) stacked by category next to
                    the ZeRO paper's formula as common/plan --zero-table
                    prints it for run.csv's params, world_size and precision
                    (fp32: 16, 8 + 8/N, 4 + 12/N, 16/N bytes per parameter;
                    bf16/fp16: 16, 4 + 12/N, 2 + 14/N, 16/N), the bytes each
                    rank sends per step next to an all-reduce's 2(N-1)/N x 4
                    (16-bit: 2) bytes per parameter (1.5x that at stage 3),
                    and the median step time
With --precision, from runs of one configuration in fp32, bf16 and fp16
(labelled by their directory names, e.g. 01-small-bf16):
    precision.png   the loss curves overlaid (left: they stay close, not
                    equal), each run's relative difference from the first
                    run's loss (middle; give fp32 first), and the device
                    memory of each run stacked by category (right), each of
                    params, grads and optimizer labelled with its bytes per
                    parameter (4, 4, 8 in fp32; 2, 2, 12 in 16 bits) from
                    memory.csv and run.csv's params
With --offload, from chapter 06 runs' timeline.csv:
    offload-LABEL.png  one step of each rank on four rows: compute (forward
                    and backward), gradient copies to the host (one per unit),
                    the CPU's AdamW, weight copies back to the device
With --capacity, from 06_offload/capacity.py's capacity.csv:
    capacity.png    the most parameters each program trains against the
                    device budget, with the ratio 06 / 01 at each budget
With --offload-bench, from common/scripts/bench_offload.sh's offload_summary.csv:
    offload.png     the median step time of each configuration (1 rank: 01,
                    06 --offload with and without --dpu; 4 ranks: 04, 05's
                    stage 2, the combined 06 with and without --dpu), with
                    min-max bars and each one's peak device and host MiB
With --sweep, from pipeline runs' run.csv (columns schedule, micro,
median_step_ms, bubble_measured, bubble_theory):
    sweep.png       against the number of micro-batches, one line per
                    schedule: the step time (each repeat a dot, the line
                    through the fastest repeat, the least disturbed by
                    background load), and the measured bubble of that repeat
                    next to the formula (bubble_theory)
With --plan, from run directories that also hold common/plan's plan.csv
(--csv) and plan-time.csv (--time-csv, on a machine file); those without
(a layout the planner refuses) are left out and named:
    plan.png        the measured median step time against the predicted one,
                    with the band of tests/tools/plan_time.bats (predicted at most
                    1.5x the measured median; at least 0.1x, which the test
                    holds against the fastest step), and the
                    measured peak device bytes of the fullest rank against the
                    planned ones
With --grid, from a pipeline run of several axes (chapter 04's pp x tp x dp;
run.csv's dp, tp, pp and bytes_AXIS_per_step; memory.csv):
    grid-LABEL.png  every rank's peak device memory stacked by category,
                    each bar named by the rank's place in the grid (stage,
                    tp rank, replica), next to the bytes each axis of the
                    grid sent per step, all ranks together; the first repeat
With --experts, from runs with --experts (chapters 01 and 02; steps.csv's
tokens_e0.., dropped, aux_loss):
    experts.png     per configuration, each expert's share of the step's choices
                    (tokens_eN over every choice, dropped included) against the
                    balanced 1/E, and the share dropped past the capacity; one
                    line per run printed: the last step's shares, dropped share
                    and balancing term
With --bubbles, from pipeline runs' run.csv (columns schedule, pp, micro,
bubble_measured, bubble_theory) and, for zb-h1, timeline.csv:
    bubbles.png     one bar per configuration (the directory's label): the
                    measured bubble (median over repeats, min-max bars,
                    each repeat a dot) next to its schedule's formula
                    (bubble_theory: zb-h1's with F = B = W); for zb-h1 also
                    the formula at the forward, B and W times the run
                    measured (timeline.csv's fwd, bwd_input, bwd_weight,
                    medians over its steps after the first); for every
                    schedule with a timeline, the schedule replayed with
                    each computation's own time and messages taking none
                    (pipeline_bubble.timeline_replay, median over repeats):
                    the theory at the run's own times, so that the bar's
                    excess over it is what messages and waits add
"""
import argparse

from plot_comm import plot_commbench, plot_cp
from plot_offload import plot_capacity, plot_offload_bench
from plot_pipeline import plot_bubbles, plot_grid, plot_sweep
from plot_plan import plot_plan
from plot_runs import plot_experts, plot_runs
from plot_timeline import plot_ep, plot_gantt, plot_offload_timeline
from plot_zero import plot_precision, plot_zero
from rundir import RUN_DIRECTORY, load_runs
from tool import make_output_dir, run_tool

PIPELINE_RUN = "a pipeline run of chapter 04"
# The modes that draw run directories grouped by label (rundir.load_runs): what each reads, for a
# refusal's "(valid: ...)", and its figure (a module per chapter; figure.py their shared epilogue)
RUN_MODES = {"plan": (RUN_DIRECTORY, plot_plan), "cp": ("a run of chapter 03 with --cp, labelled 03-cpN-seqT", plot_cp),
             "grid": ("a run of chapter 04 or 05's pipeline", plot_grid), "bubbles": (PIPELINE_RUN, plot_bubbles),
             "zero": ("a run of chapter 05", plot_zero), "precision": (RUN_DIRECTORY, plot_precision),
             "sweep": (PIPELINE_RUN, plot_sweep),
             "experts": ("a run of chapter 01 or 02 with --experts", plot_experts)}
# The modes that draw one step of each run's timeline.csv (--step), and those that draw a tool's CSV
TIMELINE_MODES = {"gantt": plot_gantt, "ep": plot_ep, "offload": plot_offload_timeline}
CSV_MODES = {"capacity": plot_capacity, "offload_bench": plot_offload_bench}
# The order in which a mode given wins over another given with it
MODES = ("plan", "cp", "commbench", "grid", "gantt", "ep", "offload", "capacity", "offload_bench", "bubbles", "zero",
         "precision", "sweep", "experts")


def main():
    parser = argparse.ArgumentParser(description="Plot course runs from their CSVs.")
    parser.add_argument("runs", nargs="+", help="run directories (each with steps.csv, memory.csv, run.csv), "
                                                "or commbench CSV files with --commbench")
    parser.add_argument("--out", default="runs/plots", help="the directory of the PNGs, new or existing: a PNG there is replaced only "
                                                     "if it is an earlier plot (default runs/plots)")
    parser.add_argument("--commbench", action="store_true", help="the inputs are commbench CSVs: plot bus bandwidth")
    parser.add_argument("--gantt", action="store_true", help="Gantt chart of each run's timeline.csv (chapters 04, 05)")
    parser.add_argument("--ep", action="store_true",
                        help="chapter 03 --ep runs: one step's dispatch, experts and combine per rank, and the load")
    parser.add_argument("--step", type=int, default=None, help="--gantt, --ep, --offload: which step (default: the last)")
    parser.add_argument("--sweep", action="store_true", help="step time against micro-batches, per schedule")
    parser.add_argument("--bubbles", action="store_true", help="chapter 04: each schedule's measured bubble and formula")
    parser.add_argument("--zero", action="store_true", help="chapter 05: memory, bytes and time per ZeRO stage")
    parser.add_argument("--precision", action="store_true",
                        help="chapter 05: loss curves and memory by category of fp32, bf16 and fp16 runs")
    parser.add_argument("--offload", action="store_true", help="chapter 06: one step's compute, copies and CPU AdamW")
    parser.add_argument("--capacity", action="store_true", help="06_offload/capacity.py's CSV: parameters per budget")
    parser.add_argument("--offload-bench", action="store_true",
                        help="common/scripts/bench_offload.sh's offload_summary.csv: step time per configuration")
    parser.add_argument("--experts", action="store_true",
                        help="runs with --experts: each expert's share of the choices and the dropped share per step")
    parser.add_argument("--cp", action="store_true",
                        help="chapter 03 --cp runs (labels 03-cpN-seqT): activations per rank against T")
    parser.add_argument("--grid", action="store_true",
                        help="chapter 04: memory per rank and bytes per grid axis of pp x tp x dp runs")
    parser.add_argument("--plan", action="store_true",
                        help="common/plan's predicted step time and memory against the runs' (plan.csv, plan-time.csv)")
    args = parser.parse_args()
    mode = next((m for m in MODES if getattr(args, m)), None)
    make_output_dir(args.out, "--out")
    if mode in RUN_MODES:
        valid, draw = RUN_MODES[mode]
        names = draw(load_runs(args.runs, valid), args.out)
    elif mode in TIMELINE_MODES:
        names = [TIMELINE_MODES[mode](d, args.step, args.out) for d in args.runs]
    elif mode in CSV_MODES:
        names = CSV_MODES[mode](args.runs[0], args.out)
    elif mode == "commbench":
        names = plot_commbench(args.runs, args.out)
    else:
        names = plot_runs(load_runs(args.runs), args.out)
    print(f"plot.py: wrote {', '.join(names)} to {args.out}")


if __name__ == "__main__":
    run_tool("plot.py: ", main)
