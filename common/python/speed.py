#!/usr/bin/env python3
"""speed.py: the arithmetic of speed (course.md, "The arithmetic of speed"), and its graded problems.

    python3 common/python/speed.py problems              print the problems (no answers)
    python3 common/python/speed.py answers               print the reference answers, as an answers file
    python3 common/python/speed.py grade ANSWERS_FILE    grade a learner's answers (exit 0 only when all are right)

The formulas, each a function below so that the problems' answers come from
them and cannot drift from the text:

    FLOPs per token of training     6 P + 12 L T C      (forward 2P, backward 4P; attention's
                                                         q k^T and p v, forward and backward)
    MFU                             tokens/s x FLOPs per token / (devices x peak FLOP/s)
    alpha-beta time of a message    alpha + bytes / beta
    ring all-reduce over N ranks    2 (N - 1) alpha + 2 (N - 1) / N x bytes / beta
    model state per device          (bf16 params and grads, fp32 master, m, v) with ZeRO stage 1:
                                    (2 + 2 + 12 / dp) x P / (tp x pp) bytes
    pipeline bubble                 (P - 1) / (M + P - 1) of the step, (P - 1) / M of the ideal time

An answers file has one line per problem, "ID VALUE" (e.g. "1 48.4e9");
lines starting with # are ignored. A value is right within 1% of the
reference.
"""
import sys

TOLERANCE = 0.01


def flops_per_token(P, L, T, C):
    return 6 * P + 12 * L * T * C


def tokens_per_s(devices, mfu, peak, flops):
    return devices * mfu * peak / flops


def ring_allreduce_s(N, nbytes, alpha, beta):
    return 2 * (N - 1) * alpha + 2 * (N - 1) / N * nbytes / beta


def ring_allreduce_bytes_sent(N, nbytes):
    return 2 * (N - 1) / N * nbytes


def zero1_state_bytes(P, dp, tp, pp):
    return (2 + 2 + 12 / dp) * P / (tp * pp)


def bubble(P, M):
    return (P - 1) / (M + P - 1)


# A 7B-parameter model on 64 GPUs: L 32 blocks, width C 4096, sequences of
# T 4096 tokens; tp 8 inside each 8-GPU machine, dp 8 across machines;
# bf16 mixed precision; H100s at 989e12 dense bf16 FLOP/s.
MODEL = dict(P=7e9, L=32, T=4096, C=4096)
PEAK_BF16 = 989e12
NET = dict(alpha=10e-6, beta=50e9)  # between machines: 10 us, 400 Gb/s = 50 GB/s per GPU
NVLINK = dict(alpha=5e-6, beta=450e9)  # inside a machine

PROBLEMS = [
    ("1", "FLOPs per token of training for the 7B model (L 32, C 4096, T 4096), 6P + 12LTC",
     lambda: flops_per_token(**MODEL)),
    ("2", "Tokens per second of the whole 64-GPU job at an MFU of 0.40 (bf16 peak 989e12 FLOP/s per GPU)",
     lambda: tokens_per_s(64, 0.40, PEAK_BF16, flops_per_token(**MODEL))),
    ("3", "Model-state bytes per GPU with bf16 mixed precision and Adam, ZeRO-1 over dp 8, tp 8, pp 1",
     lambda: zero1_state_bytes(MODEL["P"], dp=8, tp=8, pp=1)),
    ("4", "Bytes each GPU sends per step in the data-parallel ring all-reduce of its bf16 gradients "
          "(its tensor-parallel slice, P/8 parameters, over dp 8)",
     lambda: ring_allreduce_bytes_sent(8, 2 * MODEL["P"] / 8)),
    ("5", "Seconds that all-reduce takes between machines (alpha 10e-6 s, beta 50e9 B/s)",
     lambda: ring_allreduce_s(8, 2 * MODEL["P"] / 8, **NET)),
    ("6", "Seconds of one tensor-parallel all-reduce of a bf16 activation (1 sequence of T 4096 x C 4096) "
          "over tp 8 inside a machine (alpha 5e-6 s, beta 450e9 B/s)",
     lambda: ring_allreduce_s(8, 2 * 4096 * 4096, **NVLINK)),
    ("7", "The same tensor-parallel all-reduce between machines (alpha 10e-6 s, beta 50e9 B/s): how many "
          "times slower?",
     lambda: ring_allreduce_s(8, 2 * 4096 * 4096, **NET) / ring_allreduce_s(8, 2 * 4096 * 4096, **NVLINK)),
    ("8", "Pipeline bubble (idle fraction of the step) with P 4 stages and M 16 micro-batches",
     lambda: bubble(4, 16)),
]


def reference():
    return {pid: f() for pid, _, f in PROBLEMS}


def grade(path):
    answers = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            try:
                answers[parts[0]] = float(parts[1])
            except (IndexError, ValueError):
                sys.exit(f"speed.py: {path}:{number}: expected 'ID VALUE', got {line!r}")
    right = 0
    for pid, text, f in PROBLEMS:
        want = f()
        got = answers.get(pid)
        ok = got is not None and abs(got - want) <= TOLERANCE * abs(want)
        right += ok
        shown = "missing" if got is None else f"{got:.6g}"
        print(f"{'PASS' if ok else 'FAIL'} problem {pid}: {shown}" + ("" if ok else " (not within 1%)"))
    print(f"{right}/{len(PROBLEMS)} problems right")
    return right == len(PROBLEMS)


def main(argv):
    if argv[:1] == ["problems"]:
        for pid, text, _ in PROBLEMS:
            print(f"{pid}. {text}")
    elif argv[:1] == ["answers"]:
        for pid, value in reference().items():
            print(f"{pid} {value:.6g}")
    elif len(argv) == 2 and argv[0] == "grade":
        sys.exit(0 if grade(argv[1]) else 1)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
