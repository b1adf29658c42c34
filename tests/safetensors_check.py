#!/usr/bin/env python3
"""Check a safetensors file written by `common/ckpt export` against the
checkpoint it came from, without trusting the C code that wrote either.

usage: safetensors_check.py EXPORT CHECKPOINT LAYERS DMODEL VOCAB SEQ

- the tensors, their names and shapes are the GPT of the given shape, listed
  here from the model's definition (not read from the checkpoint);
- the file is valid safetensors: 8-byte little-endian header length, JSON,
  F32 tensors whose data_offsets tile the data exactly;
- every tensor's bytes equal the checkpoint's params array at that tensor's
  place (the checkpoint's header is parsed here with struct);
- the metadata's writer is the checkpoint header's writer text (the program
  and its layout), where that text is UTF-8;
- with safetensors + torch importable, safetensors.torch.load_file reads it
  and gives the same values.
Prints "writer TEXT", then "ok N tensors", or exits 1 naming the first problem."""
import json
import struct
import sys


def expected_tensors(L, C, V, T):
    shapes = [("wte", [V, C]), ("wpe", [T, C])]
    for l in range(L):
        shapes += [(f"h{l}.ln1w", [C]), (f"h{l}.ln1b", [C]), (f"h{l}.qkvw", [3 * C, C]), (f"h{l}.qkvb", [3 * C]),
                   (f"h{l}.attprojw", [C, C]), (f"h{l}.attprojb", [C]), (f"h{l}.ln2w", [C]), (f"h{l}.ln2b", [C]),
                   (f"h{l}.fcw", [4 * C, C]), (f"h{l}.fcb", [4 * C]), (f"h{l}.fcprojw", [C, 4 * C]),
                   (f"h{l}.fcprojb", [C])]
    return shapes + [("lnf.w", [C]), ("lnf.b", [C]), ("lm_head", [V, C])]


def fail(message):
    print(message)
    sys.exit(1)


def main():
    export, checkpoint = sys.argv[1], sys.argv[2]
    L, C, V, T = (int(x) for x in sys.argv[3:7])
    blob = open(export, "rb").read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", {})
    want = expected_tensors(L, C, V, T)
    if sorted(header) != sorted(name for name, _ in want):
        fail(f"tensors {sorted(header)} != {sorted(name for name, _ in want)}")

    ck = open(checkpoint, "rb").read()
    if ck[:8] != b"GPTCKPT\0":
        fail("the checkpoint has no magic")
    try:  # 88 bytes at offset 136 (checkpoint.h), NUL-padded
        writer = ck[136:136 + 88].split(b"\0")[0].decode("utf-8")
    except UnicodeDecodeError:
        writer = metadata.get("writer")  # escaped in the export: another test's business
    if metadata.get("writer") != writer:
        fail(f"the metadata's writer {metadata.get('writer')!r} is not the checkpoint's {writer!r}")
    print(f"writer {writer}")
    num_params, data_offset = struct.unpack_from("<QQ", ck, 48)
    params = ck[data_offset:data_offset + 4 * num_params]

    spans, place = [], 0  # the tensors sit in table order in the checkpoint's params
    for name, shape in want:
        entry = header[name]
        numel = 1
        for d in shape:
            numel *= d
        if entry["dtype"] != "F32" or entry["shape"] != shape:
            fail(f"{name}: {entry['dtype']} {entry['shape']}, expected F32 {shape}")
        begin, end = entry["data_offsets"]
        if end - begin != 4 * numel:
            fail(f"{name}: {end - begin} bytes for {numel} floats")
        if data[begin:end] != params[4 * place:4 * (place + numel)]:
            fail(f"{name}: its bytes differ from the checkpoint's")
        spans.append((begin, end))
        place += numel
    spans.sort()
    if spans[0][0] != 0 or spans[-1][1] != len(data) or any(a[1] != b[0] for a, b in zip(spans, spans[1:])):
        fail("the data_offsets do not tile the data")
    if place != num_params:
        fail(f"{place} parameters in the tensors, the checkpoint has {num_params}")
    ln = struct.unpack_from(f"<{C}f", data, header["h0.ln1w"]["data_offsets"][0])
    if not all(0.9 < x < 1.1 for x in ln):  # initialised to ones, a few small steps ago
        fail(f"h0.ln1w is not near 1: {ln[:4]}")

    try:
        from safetensors.torch import load_file
    except ImportError:
        load_file = None
    if load_file:
        tensors = load_file(export)
        for name, shape in want:
            got = tensors[name].contiguous().numpy().tobytes()
            begin, end = header[name]["data_offsets"]
            if list(tensors[name].shape) != shape or got != data[begin:end]:
                fail(f"{name}: safetensors.torch reads something else")
    print(f"ok {len(want)} tensors" + (" (and safetensors.torch agrees)" if load_file else ""))


main()
