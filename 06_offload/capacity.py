#!/usr/bin/env python3
"""capacity.py: the largest model chapter 01 and chapter 06 train under a device budget.

    python3 06_offload/capacity.py [--budgets 8M,16M,32M] [--dmodel 128] [--programs 01,06,06p]
                                   [--out runs/capacity]

For each budget (--device-mem-limit) and each program, a bisection over
--layers (at a fixed --dmodel, --heads, --seq and a batch of one sequence)
finds the most layers whose run of one step fits (every program with
--recompute, so that the activations, which --offload does not move, weigh
little next to the model state): the program refuses a
model past the budget with exit status 2 as soon as an allocation would cross
it, so a trial that does not fit ends before it computes anything. Chapter
01 keeps 16 bytes per parameter on the device (parameters, gradients, Adam's
moments in fp32; in bf16 2 + 2 + 12); chapter 06 with --offload in bf16
keeps 2 and a few unit-sized buffers, so the ratio tends to 8 as the units
get small against the model; 06p, chapter 06 with --offload-params too, keeps
no byte per parameter on the device, only two units' weights, the working
buffers of one unit and the activations (with --recompute, one block input
per layer), so its capacity is bounded by those and by the host's memory
(20 bytes a parameter), and at these budgets by the --max-layers cap. Each
line printed gives the ratio of parameters to chapter 01's at that budget.

The search stops at --max-layers: a program that fits the cap is reported
as training "at least N layers (the --max-layers cap)" (at_cap 1 in the CSV),
since more might fit. A budget that fits not even one layer is an answer
("fits no model", exit 0); a budget that is not a positive size, or an --out
that cannot be written, is an error (one line; exit 2).

Writes capacity.csv (budget_bytes,program,precision,layers,dmodel,params,
peak_device_bytes,peak_host_bytes,at_cap) into --out, a new directory or an
existing one, at a new name or over an earlier capacity.csv (recognised by that
header), never over another file (one line, exit 2, before any trial); the
trials run in a directory of their own inside --out, removed at the end.
`python3 common/python/plot.py --capacity CSV` draws it.
"""
import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "common", "python"))
from rundir import run_row  # noqa: E402
from tool import Refusal, check_output_file, file_starts_with, make_output_dir, run_tool  # noqa: E402

PROGRAMS = {
    "01": [os.path.join(REPO, "01_single_gpu", "train")],
    "06": [os.path.join(REPO, "06_offload", "train"), "--offload"],
    "06p": [os.path.join(REPO, "06_offload", "train"), "--offload", "--offload-params"],
}


SIZE_FORM = "a positive number of bytes with an optional K, M or G suffix, e.g. 8M or 1.5G"


COLUMNS = ["budget_bytes", "program", "precision", "layers", "dmodel", "params", "peak_device_bytes",
           "peak_host_bytes", "at_cap"]


def fail(message, status=2):
    """One line on stderr and the exit status (tool.run_tool): 2 for bad input, 1 for what could not be written."""
    raise Refusal(message, status)


def parse_size(text):
    """Bytes from "512", "64K", "1.5G" (binary multiples, as --device-mem-limit reads them); None if not a size."""
    match = re.fullmatch(r"\s*([-+]?[0-9]+(?:\.[0-9]*)?)\s*([KMG]?)\s*", text, re.IGNORECASE)
    if not match:
        return None
    return int(float(match.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(2).upper()])


def parse_budgets(text):
    """The --budgets list; bad input ends the program (exit 2) naming the valid form."""
    budgets = []
    for item in text.split(","):
        size = parse_size(item)
        if size is None:
            fail(f"--budgets: '{item}' is not a size (valid: {SIZE_FORM}, comma-separated)")
        if size <= 0:
            fail(f"--budgets: '{item}' is not a positive size (valid: {SIZE_FORM}, comma-separated)")
        budgets.append(size)
    return budgets


def trial(program, layers, budget, args, out_dir):
    """(fits, run.csv row or None) for one step of the model with `layers` layers."""
    cmd = PROGRAMS[program] + [
        "--device", args.device, "--layers", str(layers), "--dmodel", str(args.dmodel), "--heads",
        str(args.heads), "--seq", str(args.seq), "--batch", "1", "--steps", "1", "--sample", "0", "--quiet",
        "--eval-batches", "1", "--precision", args.precision, "--device-mem-limit", str(budget),
        "--out", out_dir, "--overwrite"] + (["--recompute"] if args.recompute else [])
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"),
                                   OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive")))
    if done.returncode == 2 and "device-mem-limit" in done.stderr:
        return False, None
    if done.returncode != 0:
        sys.exit(f"capacity.py: {' '.join(cmd)} failed unexpectedly ({done.returncode}): {done.stderr.strip()}")
    return True, run_row(out_dir, "the run.csv of the trial run")


def largest(program, budget, args, out_dir):
    """(row, capped) for the most layers (1..max_layers) that fit, by bisection; row is None when not
    even one layer fits, and capped says the search stopped at --max-layers (more may fit)."""
    fits, row = trial(program, 1, budget, args, out_dir)
    if not fits:
        return None, False
    lo, best, hi = 1, row, args.max_layers + 1  # lo fits, hi does not (or is past the search)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        fits, row = trial(program, mid, budget, args, out_dir)
        if fits:
            lo, best = mid, row
        else:
            hi = mid
    return best, lo == args.max_layers


def parse_programs(text):
    """The --programs list, in PROGRAMS' order; an unknown name ends the program (exit 2)."""
    names = text.split(",")
    for name in names:
        if name not in PROGRAMS:
            fail(f"--programs: '{name}' is not a program (valid: {', '.join(PROGRAMS)}, comma-separated)")
    return [name for name in PROGRAMS if name in names]


def report(program, budget, best, capped, args, base=None):
    """The answer for one budget and program: no model fits, at least the cap fits, or the capacity;
    with base (chapter 01's row at that budget) the ratio of their parameters."""
    size = f"{budget / 1048576:.1f} MiB" if budget >= 1048576 else f"{budget} bytes"
    where = f"capacity.py: budget {size}: {program}"
    if best is None:
        print(f"{where} fits no model: not even 1 layer of d {args.dmodel}")
        return
    layers = f"{best['layers']} layer{'' if best['layers'] == '1' else 's'}"
    params = f"{int(best['params']) / 1e6:.2f} M parameters"
    if base is not None and program != "01":
        params += f", {int(best['params']) / int(base['params']):.1f}x 01's"
    if capped:
        print(f"{where} trains at least {layers} (the --max-layers cap), {params}")
    else:
        print(f"{where} trains {layers}, {params}")


def main():
    parser = argparse.ArgumentParser(description="Largest model per device budget: chapter 01 against 06.")
    parser.error = lambda message: fail(message)  # one line, exit 2: no usage block
    parser.add_argument("--budgets", default="8M,16M,32M", help="device budgets, comma-separated (K/M/G)")
    parser.add_argument("--dmodel", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--max-layers", type=int, default=256, help="the bisection's upper end")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"],
                        help="the backend of every trial (default cpu)")
    parser.add_argument("--programs", default=",".join(PROGRAMS),
                        help="which to search, comma-separated: 01, 06 (--offload), 06p (--offload "
                             "--offload-params); default all")
    parser.add_argument("--no-recompute", dest="recompute", action="store_false",
                        help="keep every block's activations (default: --recompute in both programs)")
    parser.add_argument("--out", default="runs/capacity",
                        help="the directory of capacity.csv, new or existing: a capacity.csv there is replaced "
                             "only if it is an earlier one (default runs/capacity)")
    args = parser.parse_args()
    budgets = parse_budgets(args.budgets)
    programs = parse_programs(args.programs)
    if args.max_layers < 1:
        fail(f"--max-layers: {args.max_layers} is below 1 (valid: a whole number of layers, at least 1)")
    # --out and the file written there are checked before any trial (tool.py's output-file rule)
    make_output_dir(args.out, "--out")
    path = os.path.join(args.out, "capacity.csv")
    check_output_file(path, "--out", "capacity.csv of capacity.py",
                      lambda p: file_starts_with(p, (",".join(COLUMNS) + "\n").encode()))
    rows = []
    # the trials' run directories: a fresh one inside --out, removed at the end, so that no
    # directory already there is replaced by a trial's files
    with tempfile.TemporaryDirectory(prefix=".capacity-trials-", dir=args.out) as trials:
        for budget in budgets:
            base = None  # chapter 01's answer at this budget, for the ratios
            for program in programs:
                best, capped = largest(program, budget, args, os.path.join(trials, program))
                report(program, budget, best, capped, args, base)
                if program == "01":
                    base = best
                if best is None:
                    continue
                rows.append({"budget_bytes": budget, "program": program, "precision": args.precision,
                             "layers": best["layers"], "dmodel": best["dmodel"], "params": best["params"],
                             "peak_device_bytes": best["peak_device_bytes"],
                             "peak_host_bytes": best.get("peak_host_bytes", ""), "at_cap": int(capped)})
    try:
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
    except OSError as e:
        fail(f"cannot write {path} ({e.strerror or e})", 1)
    print(f"capacity.py: wrote {path}")


if __name__ == "__main__":
    run_tool("capacity.py: error: ", main)
