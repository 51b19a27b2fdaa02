#!/usr/bin/python3
"""Zero-pads a Mixtral checkpoint's hidden and expert widths (F32 out), so
that llama.cpp can write K-quants for it (rows must be multiples of 256).

The function is unchanged up to f32 rounding: padded hidden values stay 0
through every layer (zero columns in, zero rows out; SiLU(0) * 0 = 0), and
RMSNorm, which now averages over the wider hidden, gets weights scaled by
sqrt(old / new) and eps scaled by old / new:
  x / sqrt(r m + r eps) * (w sqrt(r)) = x / sqrt(m + eps) * w,  r = old / new.
Heads keep their width (q/k/v gain zero input columns, o zero output rows).

usage: pad_mixtral.py MODEL_DIR OUT_DIR [--hidden 256] [--inter 256]
Needs numpy (run with /usr/bin/python3). A benchmark tool, never in CI.
"""
import argparse
import json
import os
import shutil
import struct

import numpy as np


def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        buf = raw[8 + n + a:8 + n + b]
        if h["dtype"] == "BF16":
            u = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif h["dtype"] == "F16":
            arr = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif h["dtype"] == "F32":
            arr = np.frombuffer(buf, dtype="<f4")
        else:
            raise SystemExit("pad_mixtral.py: %s has dtype %s" % (name, h["dtype"]))
        out[name] = arr.reshape(h["shape"]).astype(np.float32)
    return out


def write(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        b = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def pad(a, shape):
    out = np.zeros(shape, dtype=np.float32)
    out[tuple(slice(0, d) for d in a.shape)] = a
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--inter", type=int, default=256)
    a = p.parse_args()
    cfg = json.load(open(os.path.join(a.src, "config.json")))
    if cfg["model_type"] != "mixtral":
        raise SystemExit("pad_mixtral.py: only mixtral checkpoints")
    h0, i0 = cfg["hidden_size"], cfg["intermediate_size"]
    H, I = max(a.hidden, h0), max(a.inter, i0)
    r = h0 / H
    t = read(os.path.join(a.src, "model.safetensors"))
    out = {}
    for name, w in t.items():
        if name.endswith("norm.weight") and w.ndim == 1 and w.shape[0] == h0:
            out[name] = pad(w * np.float32(np.sqrt(r)), (H,))
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            out[name] = pad(w, (w.shape[0], H))
        elif name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            out[name] = pad(w, (w.shape[0], H))
        elif name.endswith("o_proj.weight"):
            out[name] = pad(w, (H, w.shape[1]))
        elif name.endswith("block_sparse_moe.gate.weight"):
            out[name] = pad(w, (w.shape[0], H))
        elif name.endswith(("w1.weight", "w3.weight")):
            out[name] = pad(w, (I, H))
        elif name.endswith("w2.weight"):
            out[name] = pad(w, (H, I))
        else:
            raise SystemExit("pad_mixtral.py: no rule for %s %s" % (name, w.shape))
    os.makedirs(a.dst, exist_ok=True)
    for f in os.listdir(a.src):
        if f.endswith(".json") and f != "model.safetensors.index.json":
            shutil.copy(os.path.join(a.src, f), os.path.join(a.dst, f))
    cfg.update(hidden_size=H, intermediate_size=I, rms_norm_eps=cfg["rms_norm_eps"] * r,
               torch_dtype="float32")
    cfg.setdefault("head_dim", h0 // cfg["num_attention_heads"])
    json.dump(cfg, open(os.path.join(a.dst, "config.json"), "w"), indent=2)
    write(os.path.join(a.dst, "model.safetensors"), out)


if __name__ == "__main__":
    main()
