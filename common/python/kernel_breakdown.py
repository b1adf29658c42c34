#!/usr/bin/env python3
"""kernel_breakdown.py: where one training step's GPU time goes, by kind of kernel.

    python3 common/python/kernel_breakdown.py ncu NCU_CSV LABEL OUT_CSV
    python3 common/python/kernel_breakdown.py torch MODEL LABEL OUT_CSV [--compile]
    python3 common/python/kernel_breakdown.py perf REPORT_TXT SAMPLE_HZ STEPS LABEL OUT_CSV
    python3 common/python/kernel_breakdown.py plot OUT_PNG CSV...

`ncu` reads the per-kernel times that Nsight Compute printed for one step of
the course's program (common/scripts/profile_kernels.sh makes it: ncu --csv
--metrics gpu__time_duration.sum, one step selected with COURSE_PROFILE_STEP).
`torch` profiles one step of common/python/pytorch_gpt.py's model with
torch.profiler (same model, batch 8, after 3 warm-up steps; COURSE_TF32=1 as
there). Both write OUT_CSV with the columns

    label,category,kernel,calls,time_us

one row per kernel name, time_us summed over the step. `plot` draws one
horizontal stacked bar per label (in the order the files and rows come),
split by category, into OUT_PNG. OUT_CSV and OUT_PNG are new names or the
tool's own earlier files (a CSV with that header, a PNG matplotlib wrote),
never another file: one line and exit status 2 (common/python/tool.py).

`perf` does the same for a CPU run from Linux perf's sampling profile: REPORT_TXT
is what `perf report --no-children --sort symbol -n -g none --percent-limit 0`
printed for a run recorded with `perf record -F SAMPLE_HZ` (cpu-clock
samples, every thread) over STEPS training steps. There `calls` holds the
number of samples and time_us the CPU time they stand for per step,
samples / SAMPLE_HZ / STEPS (summed over threads; the run's set-up and final
evaluation are included, so use enough steps). Kernel-mode symbols count as
"other".

Categories, from the kernel's name: matmul (cuBLAS/CUTLASS GEMMs), attention
(fused attention, or the softmax and head copies of the unfused one), norm
(layernorm forward and backward), cast (the course's conversions between fp32
and bf16/fp16 around its 16-bit matmuls), elementwise (GELU, residual, bias and its gradient's
column sums, fills, copies), optimizer (AdamW, gradient norm), loss (cross-entropy), embedding,
and other. The names differ between the course and PyTorch, so the patterns
list both.
"""
import os
import re
import sys
from collections import OrderedDict

from tool import check_output_file, file_starts_with, is_matplotlib_png, read_csv, run_tool

CATEGORY_PATTERNS = [
    ("attention", r"attention|fmha|flash|causal_softmax|softmax_row|softmax_backward_row|split_qkv|split_heads|"
                  r"merge_heads|merge_qkv"),
    ("matmul", r"gemm|xmma|cutlass|splitkreduce|cublas|nvjet"),  # nvjet_*: cuBLAS's own kernels on Hopper
    ("cast", r"cast_to_half|cast_from_half"),  # the course's fp32 <-> bf16/fp16 conversions
    ("norm", r"layernorm|layer_norm|gammabeta"),
    ("optimizer", r"adam|sum_squares|multi_tensor_apply|lpnorm"),
    ("loss", r"crossentropy|cross_entropy|log_softmax|softmax_warp|nll_loss"),
    # PyTorch's embedding backward sorts the token ids (radix sort, unique, segments)
    ("embedding", r"embedding|index_select|indexing_backward|index_put|scatter|gather|radix_sort|unique_by_key|"
                  r"segment|devicescan|devicecompact"),
    ("elementwise", r"gelu|residual|bias|column_partials|column_sums|scale_kernel|fill|memset|memmove|memcpy|"
                    r"elementwise|copy|cat|add|mul|reduce_kernel"),
]
CATEGORIES = [c for c, _ in CATEGORY_PATTERNS] + ["other"]
COLOURS = {"matmul": "#4c72b0", "cast": "#64b5cd", "attention": "#c44e52", "norm": "#55a868", "elementwise": "#dd8452",
           "optimizer": "#8172b3", "loss": "#937860", "embedding": "#da8bc3", "other": "#8c8c8c"}


def category(kernel):
    if kernel.startswith("[kernel] "):
        return "other"
    name = kernel.lower()
    for cat, pattern in CATEGORY_PATTERNS:
        if re.search(pattern, name):
            return cat
    return "other"


HEADER = "label,category,kernel,calls,time_us\n"


def check_out_csv(out_csv):
    """OUT_CSV is a new name or an earlier breakdown (its header), never another file (tool.py's rule)."""
    check_output_file(out_csv, "OUT_CSV", "kernel_breakdown CSV", lambda p: file_starts_with(p, HEADER.encode()))


def write(out_csv, label, times, calls):
    with open(out_csv, "w") as f:
        f.write(HEADER)
        for kernel, t in sorted(times.items(), key=lambda kv: -kv[1]):
            name = kernel.replace(",", ";").replace('"', "")[:160]
            f.write(f"{label},{category(kernel)},{name},{calls[kernel]},{t:.3f}\n")
    total = sum(times.values())
    print(f"kernel_breakdown: {label}: {total / 1e3:.2f} ms of kernels in one step -> {out_csv}")


def from_ncu(ncu_csv, label, out_csv):
    """Nsight Compute's --csv output: one row per (kernel launch, metric)."""
    with open(ncu_csv, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own log lines are not quoted
    if len(lines) < 2:
        sys.exit(f"kernel_breakdown: no kernel rows in {ncu_csv} (did ncu profile anything?)")
    rows = read_csv(ncu_csv, "Nsight Compute's --csv output", text="".join(lines))
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
    times, calls = OrderedDict(), {}
    for r in rows:
        if r["Metric Name"] != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"]
        us = float(r["Metric Value"].replace(",", "")) * scale[r["Metric Unit"]]
        times[name] = times.get(name, 0.0) + us
        calls[name] = calls.get(name, 0) + 1
    write(out_csv, label, times, calls)


def from_perf(report_txt, sample_hz, steps, label, out_csv):
    """perf report's text: one line per symbol, "  12.34%   567  [.] name"."""
    times, calls = OrderedDict(), {}
    with open(report_txt) as f:
        for line in f:
            m = re.match(r"\s*[\d.]+%\s+(\d+)\s+\[(.)\]\s+(\S+)", line)
            if not m:
                continue
            samples, mode, name = int(m.group(1)), m.group(2), m.group(3)
            if mode == "k":
                name = "[kernel] " + name
            times[name] = times.get(name, 0.0) + samples / sample_hz / steps * 1e6
            calls[name] = calls.get(name, 0) + samples
    if not times:
        sys.exit(f"kernel_breakdown: no symbol rows in {report_txt} (perf report -n --sort symbol output?)")
    write(out_csv, label, times, calls)


def from_torch(model_name, label, out_csv, compiled):
    import torch
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pytorch_gpt as pg

    tf32 = os.environ.get("COURSE_TF32") == "1"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    L, C, NH, T = pg.PRESETS[model_name]
    B, dev = 8, torch.device("cuda")
    model = pg.GPT(L, C, NH, T).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    forward = torch.compile(model) if compiled else model
    tokens = torch.randint(0, pg.VOCAB, (B, T + 1), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = forward(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    times, calls = OrderedDict(), {}
    for e in prof.key_averages():
        if e.device_time_total > 0 and e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.key] = times.get(e.key, 0.0) + e.device_time_total
            calls[e.key] = calls.get(e.key, 0) + e.count
    write(out_csv, label, times, calls)


def plot(out_png, paths):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    totals = OrderedDict()  # label -> {category: ms}
    for path in paths:
        for r in read_csv(path, "a kernel_breakdown CSV"):
            by_cat = totals.setdefault(r["label"], {c: 0.0 for c in CATEGORIES})
            by_cat[r["category"]] += float(r["time_us"]) / 1e3
    labels = list(totals)
    fig, ax = plt.subplots(figsize=(9, 0.7 * len(labels) + 1.6))
    for i, label in enumerate(labels):
        left = 0.0
        for cat in CATEGORIES:
            ms = totals[label][cat]
            if ms <= 0:
                continue
            ax.barh(i, ms, left=left, color=COLOURS[cat])
            if ms > 0.06 * max(sum(t.values()) for t in totals.values()):
                ax.text(left + ms / 2, i, f"{ms:.0f}", ha="center", va="center", fontsize=8, color="white")
            left += ms
        ax.text(left, i, f"  {left:.1f} ms", va="center", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[c]) for c in CATEGORIES
               if any(totals[lab][c] > 0 for lab in labels)]
    names = [c for c in CATEGORIES if any(totals[lab][c] > 0 for lab in labels)]
    ax.legend(handles, names, ncol=len(names), fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0),
              frameon=False)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel("GPU time in one training step (ms), by kind of kernel")
    ax.set_xlim(0, max(sum(t.values()) for t in totals.values()) * 1.18)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    print(f"kernel_breakdown: wrote {out_png}")


def main(argv):
    """Each mode's output is checked before any work (tool.check_output_file)."""
    if len(argv) >= 4 and argv[0] == "ncu":
        check_out_csv(argv[3])
        from_ncu(argv[1], argv[2], argv[3])
    elif len(argv) >= 4 and argv[0] == "torch":
        check_out_csv(argv[3])
        from_torch(argv[1], argv[2], argv[3], "--compile" in argv[4:])
    elif len(argv) >= 6 and argv[0] == "perf":
        check_out_csv(argv[5])
        from_perf(argv[1], float(argv[2]), int(argv[3]), argv[4], argv[5])
    elif len(argv) >= 3 and argv[0] == "plot":
        check_output_file(argv[1], "OUT_PNG", "PNG matplotlib wrote", is_matplotlib_png)
        plot(argv[1], argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    run_tool("kernel_breakdown: ", lambda: main(sys.argv[1:]))
