#!/usr/bin/env python3
"""plan_sent.py: common/plan's bytes sent per step for a model split, rank by rank,
against the formulas (tests/tools/plan.bats). Reads the planner's output on stdin; its
arguments are the planner's flags (the tiny preset, --split given for stages, so
that their blocks need no balancing here). Exit 1, naming each stage and
collective, where the plan and the formula differ by more than a byte."""
import math
import re
import sys

args = sys.argv[1:]


def flag(name, default):
    return args[args.index(name) + 1] if name in args else default


L, C, T, V = int(flag("--layers", 2)), 64, 64, 256
dp, tp, pp, M = int(flag("--dp", 1)), int(flag("--tp", 1)), int(flag("--pp", 1)), int(flag("--micro", 1))
cp, sp, recompute = int(flag("--cp", 1)), "--sp" in args, "--recompute" in args
Th = T // cp  # --cp: each rank holds T / cp tokens of every sequence
chunks, zero = int(flag("--virtual", 1)), int(flag("--zero", 0))
pieces_n = pp * chunks
# per piece: chunk c of stage s is piece c*pp + s; without --split (tensor parallelism's one stage) all L
blocks = [int(b) for b in flag("--split", str(L)).split(",")]
B = int(flag("--batch", 8)) // dp // M
boundary = B * Th * C * 4  # one micro-batch's activations (or their gradient), fp32
eb = 4 if flag("--precision", "fp32") == "fp32" else 2  # a parameter's and a gradient's bytes
block = 12 * C * C + 13 * C
tp_block = (12 * C * C + 7 * C) // tp + 6 * C  # the four matrices sliced, layernorms and two biases whole


Vp = (V + 127) // 128 * 128  # the padded vocabulary (model_config.h)


def units(piece):
    """The elements of each unit a piece holds: under tensor parallelism wte and the head split by
    vocabulary rows (Vp / tp each), wpe and the final layernorm whole."""
    u = [block if tp == 1 else tp_block] * blocks[piece]
    if piece == 0:
        u = [(Vp // tp + T) * C] + u
    if piece == pieces_n - 1:
        u = u + [2 * C + Vp // tp * C]
    return u


want = {}
for stage in range(pp):
    pieces = [c * pp + stage for c in range(chunks)]
    send = sum(M * boundary * ((p > 0) + (p < pieces_n - 1)) for p in pieces)
    held = sum(sum(units(p)) for p in pieces)
    nblocks = sum(blocks[p] for p in pieces)
    zb_h1 = flag("--schedule", "1f1b") == "zb-h1" and flag("--chapter", "04") != "03"
    again = recompute * (2 if zb_h1 else 1)
    tp_allreduce = M * nblocks * (4 + again) * 2 * (tp - 1) / tp * boundary  # zb-h1's W recomputes too
    # the vocabulary split: the embedding's looked-up rows summed (forward); at the head its input
    # gradient summed, each row's exponentials' sum and target logit summed, its maxima gathered
    vocab_split = (0 in pieces) * M * 2 * (tp - 1) / tp * boundary
    vocab_split += (pieces_n - 1 in pieces) * M * 2 * (tp - 1) / tp * (boundary + 2 * B * Th * 4)
    vocab_gather = (pieces_n - 1 in pieces) * M * (tp - 1) * B * Th * 4
    reduce_scatter = allgather = 0
    if sp:  # the activation all-reduces become all-gathers and reduce-scatters of T/tp rows each
        rows = boundary / tp
        # forward: gather ln1 and ln2, scatter attproj's and fcproj's sums; backward: gather the
        # output gradient and dmid, gather each column layer's input, scatter its input gradient
        allgather = M * (nblocks * (2 + 4) + 2) * (tp - 1) * rows  # +2: the last output, the first input gradient
        reduce_scatter = M * nblocks * 4 * (tp - 1) * rows
        tp_allreduce = M * nblocks * 2 * 2 * (tp - 1) / tp * 2 * C * 4  # ln1's and ln2's (2C) gradients
    if cp > 1:  # the ring: per block the k|v of T/cp tokens (2C/tp floats each) cp-1 times forward
        kv = (B * Th * 2 * C // tp) * 4  # (again with --recompute), cp-1 times backward, d(k|v) cp times
        send += M * nblocks * ((cp - 1) * (2 + recompute) + cp) * kv
    if zero:
        reduce_scatter = allgather = 0
        shard = sum(math.ceil(n / dp) for p in pieces for n in units(p))
        reduce_scatter = (dp - 1) * shard * eb * (M if zero == 2 else 1)
        allgather = (dp - 1) * shard * eb
    W = dp * cp  # the ranks holding the same weights
    allgather += vocab_gather
    allreduce = tp_allreduce + vocab_split + (0 if zero else 2 * (W - 1) / W * held * eb)
    want[stage] = {"all-reduce": allreduce, "reduce-scatter": reduce_scatter, "all-gather": allgather, "send": send}

got, stage = {}, 0
for line in sys.stdin:
    m = re.match(r"ranks? [\d ]+\(stage (\d+)", line)
    if m:
        stage = int(m.group(1))
    m = re.match(r"  (all-reduce|reduce-scatter|all-gather|send) +(\d+)$", line)
    if m:
        got.setdefault(stage, {})[m.group(1)] = float(m.group(2))
bad = 0
for stage in range(pp):
    for what, formula in want[stage].items():
        planned = got.get(stage, {}).get(what, 0.0)
        if abs(planned - formula) > 1:
            print(f"stage {stage} {what}: planned {planned:.0f}, formula {formula:.0f}")
            bad = 1
sys.exit(bad)
