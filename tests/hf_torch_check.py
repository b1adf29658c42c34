#!/usr/bin/env python3
"""The course and transformers' GPT2LMHeadModel compute the same thing, both
ways (needs torch and transformers; `make interop` installs them).

usage: hf_torch_check.py REPO WORKDIR

  export  a course checkpoint (01, tiny, 3 steps) -> common/ckpt export
          --format hf -> GPT2LMHeadModel.from_pretrained: its logits on the
          same tokens equal the course's (build/tests/hf_logits) within 1e-5.
  import  a randomly initialised GPT2LMHeadModel (untied, the course's tiny
          shape) -> save_pretrained(safe_serialization=True) -> common/ckpt
          import-hf: the course's logits equal transformers' within 1e-5;
          then it trains in 01 and in 04 --pp 2 (2 ranks), and the first
          step's loss in each equals transformers' loss on the course's batch
          of step 1 (the windows of common/model/data.c) within 1e-5.
Prints one "ok" line per check, or exits 1 naming the first difference."""
import os
import struct
import subprocess
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

REPO, WORK = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(REPO, "common", "python"))
from pytorch_gpt import course_starts  # noqa: E402  the course's windows (data.c)

CKPT = os.path.join(REPO, "common", "ckpt")
LOGITS = os.path.join(REPO, "build", "tests", "hf_logits")
TINY = dict(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=256)
SHAPE = ["--layers", "2", "--dmodel", "64", "--heads", "4", "--seq", "64", "--vocab", "256"]
B, T, SEED = 4, 64, 1337
FLAGS = ["--device", "cpu", "--batch", str(B), "--sample", "0", "--quiet", "--seed", str(SEED)]
TOLERANCE = 1e-5


def fail(message):
    print(message)
    sys.exit(1)


def run(*argv, **kw):
    done = subprocess.run(list(argv), capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), **kw)
    if done.returncode != 0:
        fail(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def course_batch():
    """The course's batch of step 1 over course.md's bytes: (B, T + 1) rows."""
    corpus = open(os.path.join(REPO, "course.md"), "rb").read()
    split_at = len(corpus) - max(len(corpus) // 10, T + 1)
    starts = course_starts(SEED, 0, B, split_at - T)
    return torch.tensor([list(corpus[s:s + T + 1]) for s in starts], dtype=torch.long)


def course_logits(checkpoint, rows):
    tokens = os.path.join(WORK, "tokens.bin")
    with open(tokens, "wb") as f:
        f.write(struct.pack(f"<{rows.numel()}i", *rows.flatten().tolist()))
    out = os.path.join(WORK, "logits.bin")
    loss = float(run(LOGITS, checkpoint, tokens, str(B), str(T), out).split()[1])
    raw = open(out, "rb").read()
    return torch.frombuffer(bytearray(raw), dtype=torch.float32).view(B, T, -1), loss


def compare(what, ours, theirs):
    worst = (ours - theirs).abs().max().item()
    if not worst <= TOLERANCE:
        fail(f"{what}: the logits differ by up to {worst:.3g} (tolerance {TOLERANCE})")
    print(f"ok {what}: logits within {worst:.2g}")


def transformers_loss(model, rows):
    with torch.no_grad():
        out = model(rows[:, :-1], labels=rows[:, :-1])  # logits and loss; the loss is recomputed below
        logits = out.logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), rows[:, 1:].reshape(B * T))
    return logits, loss.item()


def first_loss(run_dir):
    lines = open(os.path.join(run_dir, "steps.csv")).read().split("\n")
    return float(lines[1].split(",")[1])


def main():
    torch.manual_seed(0)
    rows = course_batch()

    # export: the course -> transformers
    ck = os.path.join(WORK, "course.ckpt")
    run(os.path.join(REPO, "01_single_gpu", "train"), *FLAGS, "--model", "tiny", "--steps", "3", "--out",
        os.path.join(WORK, "first"), "--save", ck)
    exported = os.path.join(WORK, "exported")
    run(CKPT, "export", ck, exported, "--format", "hf")
    model = GPT2LMHeadModel.from_pretrained(exported).eval()
    theirs, their_loss = transformers_loss(model, rows)
    ours, our_loss = course_logits(ck, rows)
    compare("export (common/ckpt export --format hf, from_pretrained)", ours, theirs)
    if abs(our_loss - their_loss) > TOLERANCE:
        fail(f"export: loss {our_loss} in the course, {their_loss} in transformers")

    # import: transformers -> the course
    config = GPT2Config(**TINY, activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=False,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=255, eos_token_id=255)
    model = GPT2LMHeadModel(config).eval()
    saved = os.path.join(WORK, "saved")
    model.save_pretrained(saved, safe_serialization=True)
    imported = os.path.join(WORK, "imported.ckpt")
    run(CKPT, "import-hf", saved, imported)
    theirs, their_loss = transformers_loss(model, rows)
    ours, our_loss = course_logits(imported, rows)
    compare("import (save_pretrained, common/ckpt import-hf)", ours, theirs)

    # the import trains: step 1's loss is transformers' loss on the course's batch of step 1
    for name, launcher in (("01", [os.path.join(REPO, "01_single_gpu", "train")]),
                           ("04 --pp 2", [os.path.join(REPO, "common", "scripts", "mpirun.sh"), "-np", "2",
                                          os.path.join(REPO, "04_pipeline", "train"), "--pp", "2"])):
        out = os.path.join(WORK, "train" + name.split()[0] + name.split()[-1])
        run(*launcher, *FLAGS, *SHAPE, "--steps", "2", "--resume", imported, "--out", out)
        loss = first_loss(out)
        if abs(loss - their_loss) > TOLERANCE * max(1.0, abs(their_loss)):
            fail(f"{name}: the imported model's first loss is {loss}, transformers' {their_loss}")
        print(f"ok {name} trains the import: first loss {loss:.7f}, transformers' {their_loss:.7f}")


main()
