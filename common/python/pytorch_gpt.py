#!/usr/bin/env python3
"""pytorch_gpt.py: the course's GPT and training step, written independently in
plain eager PyTorch, as the yardstick for `make bench` (common/scripts/bench.sh).

It is the same model as common/model/model.c and the same step as
01_single_gpu/train.c, so that tokens/s can be compared like for like:

  tokens (B,T) bytes -> wte[token] + wpe[position]             (B,T,C)
  L pre-LN blocks:  x = x + attproj(attention(qkv(ln1(x))))    qkv: C -> 3C, bias
                    x = x + fcproj(gelu_tanh(fc(ln2(x))))      fc: C -> 4C, bias
  lnf -> lm_head (C -> V, no bias, untied) -> mean cross-entropy over B*T
  attention: causal, scores scaled by 1/sqrt(hs), q|k|v side by side in qkv,
             head h in columns h*hs..(h+1)*hs of each
  layernorm eps 1e-5; vocabulary 256 (bytes); fp32 throughout
  step: zero grads, forward, backward, clip the global grad norm to --clip,
        AdamW (betas 0.9/0.95, eps 1e-8, decoupled weight decay on ALL
        parameters), learning rate: linear warm-up then cosine to lr/10.

torch.optim.AdamW's decoupled decay, p -= lr*wd*p, applied with the Adam
update, is the course's p -= lr*(update + wd*p). Batches are random windows
of the same corpus (course.md); which windows need not match the course's,
only the sizes. TF32 matmuls on CUDA only when COURSE_TF32=1, as on the C side.

For an exact check of the claim "same model, same step", --init-from loads a
checkpoint written by `01_single_gpu/train --save` (parameters in the course's
table order, Adam's moments and step) and --course-batches draws the same
windows as the course (data.c); the printed losses then match the C program's.

With --compile the model's forward (and so its backward) goes through
torch.compile with its default settings; the optimizer step stays eager, as
in the course program's own loop.

usage: python3 common/python/pytorch_gpt.py --model small --batch 8 --steps 30 [--csv FILE] [--compile]
"""
import argparse
import math
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from tool import median

# layers, dmodel, heads, seq (as common/run/config.c); vocabulary is 256 for all
PRESETS = {
    "tiny": (2, 64, 4, 64),
    "small": (4, 128, 4, 128),
    "medium": (6, 384, 6, 256),
    "gpt2": (12, 768, 12, 1024),
}
VOCAB = 256
LAYERNORM_EPS = 1e-5


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C, eps=LAYERNORM_EPS)
        self.qkv = nn.Linear(C, 3 * C)
        self.attproj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C, eps=LAYERNORM_EPS)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.NH
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, hs).transpose(1, 2) for t in (q, k, v))  # (B, NH, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale defaults to 1/sqrt(hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attproj(y)
        x = x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, L, C, NH, T, V=VOCAB):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C, eps=LAYERNORM_EPS)
        self.lm_head = nn.Linear(C, V, bias=False)
        # GPT-2's initialisation, as common/model/model.c: N(0, 0.02), wpe N(0, 0.01),
        # residual projections N(0, 0.02/sqrt(2L)), biases 0, layernorm 1/0.
        resid_std = 0.02 / math.sqrt(2 * L)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln" in name or name.startswith("lnf"):
                nn.init.ones_(p)
            elif name.endswith(("attproj.weight", "fcproj.weight")):
                nn.init.normal_(p, 0.0, resid_std)
            else:
                nn.init.normal_(p, 0.0, 0.01 if name == "wpe.weight" else 0.02)

    def forward(self, tokens, targets):
        B, T = tokens.shape
        x = self.wte(tokens) + self.wpe(torch.arange(T, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.lnf(x))
        return F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))

    def course_table(self):
        """The parameters in the order of the course's one parameter buffer
        (param_table_build in common/model/param_table.c); torch stores Linear weights as
        (out, in), which is the course's (rows, cols) too."""
        table = [self.wte.weight, self.wpe.weight]
        for b in self.blocks:
            table += [b.ln1.weight, b.ln1.bias, b.qkv.weight, b.qkv.bias, b.attproj.weight, b.attproj.bias,
                      b.ln2.weight, b.ln2.bias, b.fc.weight, b.fc.bias, b.fcproj.weight, b.fcproj.bias]
        return table + [self.lnf.weight, self.lnf.bias, self.lm_head.weight]


def lr_at_step(step, lr, warmup, steps):
    """common/model/optim.c: linear warm-up, then cosine decay to lr/10."""
    if step < warmup:
        return lr * (step + 1) / warmup
    decay_steps = steps - warmup
    if decay_steps <= 1:
        return lr
    progress = (step - warmup) / (decay_steps - 1)
    min_lr = lr / 10
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))


# ---- the course's data order (common/model/data.c), for --course-batches ----
MASK64 = (1 << 64) - 1


def hash64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def course_starts(seed, step, B, positions):
    """Window starts of the training split for global batch `step` (SPLIT_TRAIN = 0)."""
    return [hash64(seed ^ hash64((step << 24) ^ j)) % positions for j in range(B)]


def load_course_checkpoint(path, model, opt):
    """Parameters, Adam's m and v and step from a checkpoint of any chapter
    (common/run/checkpoint.h, format version 3: a 240-byte header, a directory,
    then the params, adam_m and adam_v arrays from data_offset, in table order)."""
    with open(path, "rb") as f:
        blob = f.read()
    magic, version = struct.unpack_from("<8sI", blob, 0)
    if magic != b"GPTCKPT\0" or version != 3:
        sys.exit(f"--init-from {path}: not a version-3 checkpoint of the course")
    num_params, data_offset = struct.unpack_from("<QQ", blob, 48)
    step, adam_t = struct.unpack_from("<ii", blob, 112)
    table = model.course_table()
    if num_params != sum(p.numel() for p in table):
        sys.exit(f"--init-from {path}: holds {num_params} parameters, this model has "
                 f"{sum(p.numel() for p in table)}")
    flat = torch.frombuffer(bytearray(blob[data_offset:]), dtype=torch.float32)
    params, m, v = flat[:num_params], flat[num_params:2 * num_params], flat[2 * num_params:3 * num_params]
    offset = 0
    with torch.no_grad():
        for p in table:
            n = p.numel()
            p.copy_(params[offset:offset + n].view_as(p))
            opt.state[p] = {
                "step": torch.tensor(float(adam_t)),
                "exp_avg": m[offset:offset + n].view_as(p).to(p.device).clone(),
                "exp_avg_sq": v[offset:offset + n].view_as(p).to(p.device).clone(),
            }
            offset += n
    return step


def main():
    ap = argparse.ArgumentParser(description="The course's GPT training step in eager PyTorch (fp32, or autocast), for comparison.")
    ap.add_argument("--model", choices=PRESETS, default="tiny")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0, help="global grad-norm clip, 0 = off")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", 0)) or os.cpu_count(),
                    help="CPU threads (default: OMP_NUM_THREADS, else all cores)")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "course.md"))
    ap.add_argument("--quiet", action="store_true", help="no per-step lines")
    ap.add_argument("--csv", help="append one row (the bench.csv columns) to this file")
    ap.add_argument("--device-label", help="the device column of --csv (default: the device's name)")
    ap.add_argument("--repeat", type=int, default=1, help="the repeat column of --csv")
    ap.add_argument("--init-from", help="start from a checkpoint of any chapter (--save)")
    ap.add_argument("--course-batches", action="store_true", help="draw the same windows as the course")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                    help="bf16/fp16: the forward and backward under torch.autocast (fp32 weights and AdamW, as "
                         "the course's master weights); fp16 with a GradScaler (default fp32)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (default settings); the first steps include compiling, "
                         "which the median over steps leaves out")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    tf32 = os.environ.get("COURSE_TF32") == "1"
    torch.backends.cuda.matmul.allow_tf32 = tf32  # off by default: plain fp32, as the C side
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)

    L, C, NH, T = PRESETS[args.model]
    B = args.batch
    with open(args.data, "rb") as f:
        corpus = f.read()
    split_at = len(corpus) - max(len(corpus) // 10, T + 1)  # the training split, as data.c
    data = torch.tensor(list(corpus[:split_at]), dtype=torch.long)
    positions = split_at - T

    model = GPT(L, C, NH, T).to(dev)
    num_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=args.wd)
    first_step = load_course_checkpoint(args.init_from, model, opt) if args.init_from else 0
    forward = torch.compile(model) if args.compile else model
    autocast_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    # fp16 scales the loss (the course's dynamic scale starts at 2^16 too); disabled, it passes through
    use_scaler = args.precision == "fp16"
    if hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
        scaler = torch.amp.GradScaler(dev.type, init_scale=65536.0, enabled=use_scaler)
    else:
        scaler = torch.cuda.amp.GradScaler(init_scale=65536.0, enabled=use_scaler)
    gen = torch.Generator().manual_seed(args.seed)
    offsets = torch.arange(T + 1)

    device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    program = "pytorch_compile" if args.compile else "pytorch_eager"
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    print(f"{program} | torch {torch.__version__} | device {device_name} ({args.threads} threads) | "
          f"{num_params} parameters | {L} layers, d {C}, {NH} heads, seq {T} | batch {B}", flush=True)

    step_ms = []
    for step in range(first_step, args.steps):
        t0 = time.perf_counter()
        if args.course_batches:
            starts = torch.tensor(course_starts(args.seed, step, B, positions))
        else:
            starts = torch.randint(0, positions, (B,), generator=gen)
        windows = data[starts[:, None] + offsets].to(dev, non_blocking=True)  # (B, T+1)
        tokens, targets = windows[:, :-1], windows[:, 1:]

        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            loss = forward(tokens, targets)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip) if args.clip > 0 else None
        lr = lr_at_step(step, args.lr, args.warmup, args.steps)
        for group in opt.param_groups:
            group["lr"] = lr
        scaler.step(opt)
        scaler.update()
        loss_value = loss.item()  # the C program also reads the loss back every step (and so waits for the GPU)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        step_ms.append(ms)
        if not math.isfinite(loss_value):
            sys.exit(f"the loss became {loss_value} at step {step + 1}")
        if not args.quiet or step + 1 == args.steps:
            norm_text = f" | norm {norm.item():6.3f}" if norm is not None else ""
            print(f"step {step + 1:5d}/{args.steps} | loss {loss_value:.6f} | lr {lr:.2e}{norm_text} | "
                  f"{ms:8.1f} ms | {B * T / (ms / 1e3):9.0f} tok/s", flush=True)

    # The median over every step, as run.csv's median_step_ms: robust to the slow first steps.
    median_ms = median(step_ms)
    tokens_per_s = B * T / (median_ms / 1e3)
    # Peak of the memory PyTorch's allocator handed out (the course's peak_device_bytes counts the
    # same thing: its own allocations, not the CUDA context nor cuBLAS's workspace).
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0
    print(f"done: median step {median_ms:.1f} ms | {tokens_per_s:.0f} tok/s | peak device memory "
          f"{peak / 2**20:.1f} MiB", flush=True)
    if args.csv:
        new = not os.path.exists(args.csv) or os.path.getsize(args.csv) == 0
        with open(args.csv, "a") as f:
            if new:
                f.write("device,program,model,batch,seq,params,repeat,median_step_ms,tokens_per_s,"
                        "peak_device_bytes\n")
            label = (args.device_label or device_name).replace(",", " ")
            f.write(f"{label},{program},{args.model},{B},{T},{num_params},{args.repeat},"
                    f"{median_ms:.4f},{tokens_per_s:.2f},{peak}\n")


if __name__ == "__main__":
    main()
