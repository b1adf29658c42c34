#!/usr/bin/env python3
"""adambench_torch.py: torch.optim.AdamW on the CPU, beside 06_offload/adambench (chapter 06).

    python3 06_offload/adambench_torch.py [--n 16M] [--threads T] [--reps 10] [--tensors 1] [--out DIR]

Times the three CPU implementations of torch.optim.AdamW on the problem adambench times: n fp32 parameters
(in --tensors equal tensors), fp32 gradients, adambench's hyper-parameters (lr 1e-3, betas 0.9/0.95, eps 1e-8,
weight decay 0.1), the same number of threads (torch.set_num_threads), the median of --reps steps after one
warm-up step:
  single-tensor  foreach=False: a Python loop over the tensors, several elementwise kernels each
  foreach        foreach=True: the same kernels, each over the whole list of tensors (torch._foreach_*)
  fused          fused=True: one fused kernel per step (PyTorch >= 2.4 on the CPU)
Alternately with the steps, a copy of the 16 bytes of state per parameter (tensor.copy_) is timed, as
adambench times its memcpy, for the copy bandwidth beside each row.

DIR/adambench_torch.csv gets adambench.csv's columns (kernel torch.optim.AdamW, path the mode, half none,
bytes_per_param 28: the same bytes moved) and one more, cpu_adamw_x: the params/s of the fastest fp32 row
of DIR/adambench.csv (written by `06_offload/adambench --out DIR` with the same --n and --threads) over
this row's; empty when there is none. When PyTorch cannot be imported, this says so and exits 0, writing
nothing.
"""
import argparse
import csv
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common", "python"))
from tool import median, read_csv, run_tool  # noqa: E402


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, like the C programs
        print(f"error: adambench_torch.py: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def count(text):
    """A parameter count with an optional binary suffix (K, M, G), 1K..1G."""
    m = re.fullmatch(r"(\d+)([KMG]?)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not a parameter count from 1K to 1G (e.g. 4M)")
    n = int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]
    if not 1024 <= n <= 1 << 30:
        raise argparse.ArgumentTypeError(f"'{text}' is not a parameter count from 1K to 1G (e.g. 4M)")
    return n


def bounded(name, lo, hi):
    def parse(text):
        if not re.fullmatch(r"\d+", text) or not lo <= int(text) <= hi:
            raise argparse.ArgumentTypeError(f"'{text}' is not an integer from {lo} to {hi}")
        return int(text)
    return parse


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip().replace(",", " ")
    except OSError:
        pass
    return "unknown"


def best_cpu_adamw(out, n, threads):
    """params/s of the fastest fp32 cpu_adamw row adambench wrote for the same n and threads, else None."""
    path = os.path.join(out, "adambench.csv")
    if not os.path.exists(path):
        return None
    rates = [float(r["params_per_s"]) for r in read_csv(path, "the adambench.csv of 06_offload/adambench --out DIR")
             if r["kernel"] == "cpu_adamw" and r["half"] == "none" and int(r["n"]) == n
             and int(r["threads"]) == threads]
    return max(rates) if rates else None


def main():
    parser = Parser(description="torch.optim.AdamW on the CPU in its three modes, beside adambench.")
    parser.add_argument("--n", type=count, default=1 << 24, help="parameters, 1K..1G, suffixes K M G (default 16M)")
    parser.add_argument("--threads", type=bounded("--threads", 1, 1024), default=None,
                        help="threads (default: OMP_NUM_THREADS or PyTorch's default)")
    parser.add_argument("--reps", type=bounded("--reps", 1, 1000), default=10, help="timed steps (default 10)")
    parser.add_argument("--tensors", type=bounded("--tensors", 1, 4096), default=1,
                        help="split the parameters into this many tensors (default 1, as adambench)")
    parser.add_argument("--out", default="", help="write DIR/adambench_torch.csv")
    args = parser.parse_args()

    try:
        import torch
    except ImportError:
        print("adambench_torch.py: PyTorch is not importable here; skipped (nothing written)")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    n, k = args.n, args.tensors
    sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
    gen = torch.Generator().manual_seed(0)
    copy_src = torch.empty(4 * n, dtype=torch.float32).uniform_(generator=gen)
    copy_dst = torch.empty_like(copy_src)

    def copy_ms():
        start = time.perf_counter()
        copy_dst.copy_(copy_src)
        return (time.perf_counter() - start) * 1e3

    rows = []
    for mode, flags in (("single-tensor", dict(foreach=False)), ("foreach", dict(foreach=True)),
                        ("fused", dict(fused=True))):
        params = [torch.nn.Parameter((torch.rand(s, generator=gen) - 0.5)) for s in sizes]
        for p in params:
            p.grad = (torch.rand(p.shape, generator=gen) - 0.5) * 1e-2
        try:
            opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **flags)
            opt.step()  # warm-up: allocates m and v
            copy_ms()
        except (RuntimeError, TypeError, ValueError) as e:  # e.g. no fused CPU AdamW before PyTorch 2.4
            print(f"adambench_torch.py: {mode} AdamW unavailable in PyTorch {torch.__version__}: {e}")
            continue
        steps, copies = [], []
        for _ in range(args.reps):
            start = time.perf_counter()
            opt.step()
            steps.append((time.perf_counter() - start) * 1e3)
            copies.append(copy_ms())
        ms, cms = median(steps), median(copies)
        rate = n / (ms * 1e-3)
        gbps, copy_gbps = rate * 28 / 1e9, 32.0 * n / (cms * 1e-3) / 1e9
        rows.append(dict(kernel="torch.optim.AdamW", path=mode, half="none", threads=threads, n=n, reps=args.reps,
                         clock="wall", bytes_per_param=28, median_ms=f"{ms:.4f}", params_per_s=f"{rate:.6g}", GBps=f"{gbps:.4f}",
                         copy_GBps=f"{copy_gbps:.4f}", pct_of_copy=f"{100 * gbps / copy_gbps:.1f}", x_scalar="",
                         cpu=cpu_model()))
        del opt, params

    ours = best_cpu_adamw(args.out, n, threads) if args.out else None
    print(f"torch.optim.AdamW (PyTorch {torch.__version__}): {n} parameters in {k} tensor(s), {threads} threads, "
          f"median of {args.reps} steps")
    print(f"{'mode':<14} {'ms':>10} {'Gparam/s':>10} {'GB/s':>8} {'copy GB/s':>10} {'% of copy':>10} "
          f"{'cpu_adamw x':>12}")
    for r in rows:
        r["cpu_adamw_x"] = f"{ours / float(r['params_per_s']):.2f}" if ours else ""
        print(f"{r['path']:<14} {float(r['median_ms']):>10.3f} {float(r['params_per_s']) / 1e9:>10.3f} "
              f"{float(r['GBps']):>8.2f} {float(r['copy_GBps']):>10.2f} {float(r['pct_of_copy']):>9.0f}% "
              f"{r['cpu_adamw_x']:>12}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "adambench_torch.csv")
        with open(path + ".tmp", "w", newline="") as f:
            fields = ["kernel", "path", "half", "threads", "n", "reps", "clock", "bytes_per_param", "median_ms",
                      "params_per_s", "GBps", "copy_GBps", "pct_of_copy", "x_scalar", "cpu", "cpu_adamw_x"]
            w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
        os.replace(path + ".tmp", path)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    run_tool("error: adambench_torch.py: ", main)
