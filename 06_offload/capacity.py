#!/usr/bin/env python3
"""capacity.py: the largest model chapter 01 and chapter 06 train under a device budget.

    python3 06_offload/capacity.py [--budgets 8M,16M,32M] [--dmodel 128] [--out runs/capacity]

For each budget (--device-mem-limit) and each program, a bisection over
--layers (at a fixed --dmodel, --heads, --seq and a batch of one sequence)
finds the most layers whose run of one step fits (both programs with
--recompute, so that the activations, which offloading does not move, weigh
little next to the model state): the program refuses a
model past the budget with exit status 2 as soon as an allocation would cross
it, so a trial that does not fit ends before it computes anything. Chapter
01 keeps 16 bytes per parameter on the device (parameters, gradients, Adam's
moments in fp32; in bf16 2 + 2 + 12); chapter 06 with --offload in bf16
keeps 2 and a few unit-sized buffers, so the ratio tends to 8 as the units
get small against the model.

Writes capacity.csv (budget_bytes,program,precision,layers,dmodel,params,
peak_device_bytes,peak_host_bytes) into --out; `python3 common/plot.py
--capacity CSV` draws it.
"""
import argparse
import csv
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = {
    "01": [os.path.join(REPO, "01_single_gpu", "train")],
    "06": [os.path.join(REPO, "06_offload", "train"), "--offload"],
}


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


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
    with open(os.path.join(out_dir, "run.csv"), newline="") as f:
        return True, next(csv.DictReader(f))


def largest(program, budget, args, out_dir):
    """The most layers (1..max_layers) that fit, by bisection; None when not even one does."""
    fits, row = trial(program, 1, budget, args, out_dir)
    if not fits:
        return None
    lo, best, hi = 1, row, args.max_layers + 1  # lo fits, hi does not (or is past the search)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        fits, row = trial(program, mid, budget, args, out_dir)
        if fits:
            lo, best = mid, row
        else:
            hi = mid
    return best


def main():
    parser = argparse.ArgumentParser(description="Largest model per device budget: chapter 01 against 06.")
    parser.add_argument("--budgets", default="8M,16M,32M", help="device budgets, comma-separated (K/M/G)")
    parser.add_argument("--dmodel", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--max-layers", type=int, default=256, help="the bisection's upper end")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-recompute", dest="recompute", action="store_false",
                        help="keep every block's activations (default: --recompute in both programs)")
    parser.add_argument("--out", default="runs/capacity")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for budget in [parse_size(b) for b in args.budgets.split(",")]:
        for program in PROGRAMS:
            best = largest(program, budget, args, os.path.join(args.out, f"trial-{program}"))
            if best is None:
                print(f"capacity.py: budget {budget} bytes: {program} fits no model of d {args.dmodel}")
                continue
            rows.append({"budget_bytes": budget, "program": program, "precision": args.precision,
                         "layers": best["layers"], "dmodel": best["dmodel"], "params": best["params"],
                         "peak_device_bytes": best["peak_device_bytes"],
                         "peak_host_bytes": best.get("peak_host_bytes", "")})
            print(f"capacity.py: budget {budget / 1048576:.1f} MiB: {program} trains {best['layers']} layers, "
                  f"{int(best['params']) / 1e6:.2f} M parameters")
    path = os.path.join(args.out, "capacity.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["budget_bytes", "program", "precision", "layers", "dmodel", "params",
                                               "peak_device_bytes", "peak_host_bytes"])
        writer.writeheader()
        writer.writerows(rows)
    print(f"capacity.py: wrote {path}")


if __name__ == "__main__":
    main()
