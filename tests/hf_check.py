#!/usr/bin/env python3
"""Hugging Face's GPT-2 layout, written and read here with json and struct
only (no safetensors, torch or numpy), to check `common/ckpt export --format
hf` and `common/ckpt import-hf` without trusting the C code.

usage:
  hf_check.py export DIR CHECKPOINT
      DIR (model.safetensors, config.json) is transformers' GPT2LMHeadModel of
      the checkpoint: the names listed below from GPT-2's own module tree, the
      Conv1D matrices (in, out), every value the checkpoint's parameter at its
      place (transposed here), config.json's shape and choices. Prints
      "ok N tensors", or exits 1 naming the first problem.
  hf_check.py synth CHECKPOINT DIR [--dtype F32|F16|BF16] [--bare-names]
                    [--mask-buffers] [--drop NAME] [--extra NAME] [--transpose NAME]
                    [--config KEY=JSON]...
      Write DIR as transformers' save_pretrained would, from the checkpoint's
      parameters (converted to dtype); --bare-names without "transformer."
      (as GPT-2's own upload); --mask-buffers adds the old attn.bias masks;
      the rest plant faults for the refusals.
  hf_check.py same CHECKPOINT IMPORTED [--dtype F32|F16|BF16]
      IMPORTED holds CHECKPOINT's parameters (bit for bit in F32; else the
      values rounded to dtype here), Adam's moments zero, at step 0.
"""
import json
import os
import struct
import sys

HEADER = struct.Struct("<8sII5i")  # magic, version, header_bytes, layers, dmodel, heads, seq, vocab


def fail(message):
    print(message)
    sys.exit(1)


def read_checkpoint(path):
    blob = open(path, "rb").read()
    magic, version, _, L, C, NH, T, V = HEADER.unpack_from(blob, 0)
    if magic != b"GPTCKPT\0" or version != 4:
        fail(f"{path}: not a version-4 checkpoint")
    num_params, data_offset = struct.unpack_from("<QQ", blob, 48)
    step, adam_t = struct.unpack_from("<ii", blob, 112)
    arrays = [blob[data_offset + 4 * num_params * a:data_offset + 4 * num_params * (a + 1)] for a in range(3)]
    return dict(L=L, C=C, NH=NH, T=T, V=V, n=num_params, step=step, adam_t=adam_t, arrays=arrays)


def course_tensors(L, C, V, T):
    """(course name, Hugging Face name, course shape (rows, cols), Conv1D) in the course's table order."""
    out = [("wte", "transformer.wte.weight", (V, C), False), ("wpe", "transformer.wpe.weight", (T, C), False)]
    for l in range(L):
        h = f"transformer.h.{l}."
        out += [(f"h{l}.ln1w", h + "ln_1.weight", (1, C), False), (f"h{l}.ln1b", h + "ln_1.bias", (1, C), False),
                (f"h{l}.qkvw", h + "attn.c_attn.weight", (3 * C, C), True),
                (f"h{l}.qkvb", h + "attn.c_attn.bias", (1, 3 * C), False),
                (f"h{l}.attprojw", h + "attn.c_proj.weight", (C, C), True),
                (f"h{l}.attprojb", h + "attn.c_proj.bias", (1, C), False),
                (f"h{l}.ln2w", h + "ln_2.weight", (1, C), False), (f"h{l}.ln2b", h + "ln_2.bias", (1, C), False),
                (f"h{l}.fcw", h + "mlp.c_fc.weight", (4 * C, C), True),
                (f"h{l}.fcb", h + "mlp.c_fc.bias", (1, 4 * C), False),
                (f"h{l}.fcprojw", h + "mlp.c_proj.weight", (C, 4 * C), True),
                (f"h{l}.fcprojb", h + "mlp.c_proj.bias", (1, C), False)]
    return out + [("lnf.w", "transformer.ln_f.weight", (1, C), False),
                  ("lnf.b", "transformer.ln_f.bias", (1, C), False), ("lm_head", "lm_head.weight", (V, C), False)]


def hf_shape(shape, conv1d):
    rows, cols = shape
    return [cols] if rows == 1 else [cols, rows] if conv1d else [rows, cols]


def transpose(raw, rows, cols, size=4):
    """(rows, cols) row-major elements of `size` bytes -> (cols, rows)."""
    out = bytearray(len(raw))
    for r in range(rows):
        for c in range(cols):
            i, j = (r * cols + c) * size, (c * rows + r) * size
            out[j:j + size] = raw[i:i + size]
    return bytes(out)


def to_dtype(raw, dtype):
    """fp32 bytes -> dtype bytes (round to nearest even)."""
    values = struct.unpack(f"<{len(raw) // 4}f", raw)
    if dtype == "F32":
        return raw
    if dtype == "F16":
        return struct.pack(f"<{len(values)}e", *values)
    out = []
    for (u,) in struct.iter_unpack("<I", raw):  # bf16: the top half, rounded
        out.append((u + 0x7FFF + ((u >> 16) & 1)) >> 16 & 0xFFFF)
    return struct.pack(f"<{len(out)}H", *out)


def from_dtype(raw, dtype):
    if dtype == "F32":
        return raw
    if dtype == "F16":
        return struct.pack(f"<{len(raw) // 2}f", *struct.unpack(f"<{len(raw) // 2}e", raw))
    return b"".join(struct.pack("<I", h << 16) for (h,) in struct.iter_unpack("<H", raw))


def read_safetensors(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n])
    return header.pop("__metadata__", {}), header, blob[8 + n:]


def check_export(directory, checkpoint):
    ck = read_checkpoint(checkpoint)
    L, C, NH, T, V = ck["L"], ck["C"], ck["NH"], ck["T"], ck["V"]
    if sorted(os.listdir(directory)) != ["config.json", "model.safetensors"]:
        fail(f"{directory} holds {sorted(os.listdir(directory))}")
    config = json.load(open(os.path.join(directory, "config.json")))
    want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": L, "n_embd": C, "n_head": NH,
            "n_positions": T, "vocab_size": V, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "tie_word_embeddings": False, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    for key, value in want.items():
        if config.get(key) != value:
            fail(f"config.json: {key} {config.get(key)!r}, expected {value!r}")
    metadata, header, data = read_safetensors(os.path.join(directory, "model.safetensors"))
    if metadata.get("format") != "pt":
        fail(f"metadata format {metadata.get('format')!r} (transformers needs 'pt')")
    tensors = course_tensors(L, C, V, T)
    if sorted(header) != sorted(hf for _, hf, _, _ in tensors):
        fail(f"names {sorted(set(header) ^ set(hf for _, hf, _, _ in tensors))} differ")
    params, place, spans = ck["arrays"][0], 0, []
    for name, hf, (rows, cols), conv1d in tensors:
        entry, numel = header[hf], rows * cols
        if entry["dtype"] != "F32" or entry["shape"] != hf_shape((rows, cols), conv1d):
            fail(f"{hf}: {entry['dtype']} {entry['shape']}, expected F32 {hf_shape((rows, cols), conv1d)}")
        begin, end = entry["data_offsets"]
        mine = params[4 * place:4 * (place + numel)]
        if conv1d:
            mine = transpose(mine, rows, cols)
        if data[begin:end] != mine:
            fail(f"{hf}: its values are not the checkpoint's {name}" + (" transposed" if conv1d else ""))
        spans.append((begin, end))
        place += numel
    spans.sort()
    if spans[0][0] != 0 or spans[-1][1] != len(data) or any(a[1] != b[0] for a, b in zip(spans, spans[1:])):
        fail("the data_offsets do not tile the data")
    print(f"ok {len(tensors)} tensors")


def synth(checkpoint, directory, args):
    ck = read_checkpoint(checkpoint)
    L, C, NH, T, V = ck["L"], ck["C"], ck["NH"], ck["T"], ck["V"]
    dtype = args.get("--dtype", "F32")
    params, place, header, chunks, at = ck["arrays"][0], 0, {}, [], 0
    entries = []
    for name, hf, (rows, cols), conv1d in course_tensors(L, C, V, T):
        raw = params[4 * place:4 * (place + rows * cols)]
        place += rows * cols
        shape = hf_shape((rows, cols), conv1d)
        if conv1d:
            raw = transpose(raw, rows, cols)
        if hf == args.get("--transpose"):  # a planted fault: the course's layout kept
            raw, shape = transpose(raw, shape[0], shape[1]), shape[::-1]
        entries.append((hf, shape, to_dtype(raw, dtype)))
    if "--mask-buffers" in args:
        mask = struct.pack(f"<{T * T}B", *(1 if j <= i else 0 for i in range(T) for j in range(T)))
        entries += [(f"transformer.h.{l}.attn.bias", [1, 1, T, T], mask) for l in range(L)]
    if "--extra" in args:
        entries.append((args["--extra"], [C], b"\0" * 4 * C))
    for hf, shape, raw in entries:
        if hf == args.get("--drop"):
            continue
        if "--bare-names" in args and hf.startswith("transformer."):
            hf = hf[len("transformer."):]
        kind = "BOOL" if hf.endswith(".attn.bias") else dtype
        header[hf] = {"dtype": kind, "shape": shape, "data_offsets": [at, at + len(raw)]}
        chunks.append(raw)
        at += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": L, "n_embd": C, "n_head": NH,
              "n_positions": T, "n_ctx": T, "vocab_size": V, "activation_function": "gelu_new",
              "layer_norm_epsilon": 1e-05, "n_inner": None, "tie_word_embeddings": False,
              "torch_dtype": {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype],
              "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}}}
    for setting in args.get("--config", []):
        key, value = setting.split("=", 1)
        if value == "DELETE":
            config.pop(key)
        else:
            config[key] = json.loads(value)
    json.dump(config, open(os.path.join(directory, "config.json"), "w"), indent=2)
    print(f"wrote {len(header) - 1} tensors ({dtype}) to {directory}")


def same(checkpoint, imported, dtype):
    a, b = read_checkpoint(checkpoint), read_checkpoint(imported)
    for key in ("L", "C", "NH", "T", "V", "n"):
        if a[key] != b[key]:
            fail(f"{key}: {a[key]} imported as {b[key]}")
    if b["step"] != 0 or b["adam_t"] != 0:
        fail(f"the import is at step {b['step']} with {b['adam_t']} Adam updates, not a fresh start")
    want = from_dtype(to_dtype(a["arrays"][0], dtype), dtype)
    if b["arrays"][0] != want:
        i = next(k for k in range(0, len(want), 4) if want[k:k + 4] != b["arrays"][0][k:k + 4]) // 4
        fail(f"parameter {i}: {struct.unpack_from('<f', b['arrays'][0], 4 * i)[0]!r}, "
             f"expected {struct.unpack_from('<f', want, 4 * i)[0]!r}")
    if any(b["arrays"][1]) or any(b["arrays"][2]):
        fail("Adam's moments are not zero")
    if dtype != "F32" and a["arrays"][0] == b["arrays"][0]:
        fail(f"{dtype}: the values were not rounded")  # the conversion ran
    changed = sum(1 for k in range(0, len(want), 4) if want[k:k + 4] != a["arrays"][0][k:k + 4])
    print(f"ok {a['n']} parameters" + (f" ({changed} rounded by {dtype})" if dtype != "F32" else " bit for bit"))


def parse(argv):
    args, i = {}, 0
    while i < len(argv):
        if argv[i] in ("--mask-buffers", "--bare-names"):
            args[argv[i]] = True
        elif argv[i] == "--config":
            args.setdefault("--config", []).append(argv[i + 1])
            i += 1
        else:
            args[argv[i]] = argv[i + 1]
            i += 1
        i += 1
    return args


def main():
    mode = sys.argv[1]
    if mode == "export":
        check_export(sys.argv[2], sys.argv[3])
    elif mode == "synth":
        synth(sys.argv[2], sys.argv[3], parse(sys.argv[4:]))
    elif mode == "same":
        same(sys.argv[2], sys.argv[3], parse(sys.argv[4:]).get("--dtype", "F32"))
    else:
        fail(__doc__)


if __name__ == "__main__":
    main()
