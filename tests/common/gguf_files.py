#!/usr/bin/python3
"""Writes the valid GGUF files gguf_test.cc reads back, with the independent
writer in tests/reference/gguf_writer.py, and prints a JSON manifest of what
each file holds (tensor types, dims, offsets, byte sizes, data offset).

    gguf_files.py OUT_DIR
writes OUT_DIR/v3.gguf, OUT_DIR/v2.gguf (alignment 64), and
OUT_DIR/split-0000{1,2}-of-00002.gguf (the v3 file's tensors in two parts).
Tensor bytes are pattern(n, k): byte i = (k * 37 + 11 * i) mod 256, k the
tensor's index in its writer, counting from 1.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import gguf_writer as g  # noqa: E402

SPECS = [("token_embd.weight", g.F32, [8, 3]),
         ("blk.0.attn_norm.weight", g.F16, [8]),
         ("blk.0.attn_q.weight", g.BF16, [8, 4]),
         ("blk.0.ffn_gate_exps.weight", g.Q8_0, [64, 3, 4]),
         ("blk.0.ffn_up_exps.weight", g.Q4_0, [32, 3, 4]),
         ("blk.0.ffn_down_exps.weight", g.Q4_1, [32, 2, 4]),
         ("blk.1.ffn_gate_exps.weight", g.Q5_0, [32, 2, 2]),
         ("blk.1.ffn_up_exps.weight", g.Q5_1, [32, 2, 2]),
         ("blk.1.ffn_down_exps.weight", g.Q4_K, [256, 2, 2]),
         ("blk.2.ffn_down_exps.weight", g.Q5_K, [256, 1, 2]),
         ("output.weight", g.Q6_K, [256, 3]),
         ("blk.2.ffn_gate_exps.weight", g.MXFP4, [64, 2, 2, 1])]


def pattern(n, k):
    return bytes((k * 37 + 11 * i) & 0xFF for i in range(n))


def writer(version, alignment=None):
    w = g.GGUFWriter(version=version, alignment=alignment)
    w.add("general.architecture", g.STRING, "qwen3moe")
    w.add("general.name", g.STRING, "tiny \u00e9")
    w.add("qwen3moe.block_count", g.UINT32, 3)
    w.add("qwen3moe.expert_count", g.UINT64, 4)
    w.add("qwen3moe.expert_used_count", g.INT32, 2)
    w.add("qwen3moe.attention.layer_norm_rms_epsilon", g.FLOAT32, 1e-6)
    w.add("qwen3moe.rope.freq_base", g.FLOAT64, 1000000.0)
    w.add("general.file_type", g.UINT16, 15)
    w.add("test.int8", g.INT8, -5)
    w.add("test.int16", g.INT16, -300)
    w.add("test.int64", g.INT64, -(1 << 40))
    w.add("test.uint8", g.UINT8, 250)
    w.add("test.big", g.UINT64, (1 << 64) - 1)
    w.add("test.flag", g.BOOL, 1)
    w.add("tokenizer.ggml.tokens", g.ARRAY, ["<s>", "</s>", "a", ""], elem=g.STRING)
    w.add("tokenizer.ggml.scores", g.ARRAY, [0.0, -1.5, -2.25, 3.0], elem=g.FLOAT32)
    w.add("tokenizer.ggml.token_type", g.ARRAY, [3, 3, 1, -1], elem=g.INT32)
    w.add("test.empty", g.ARRAY, [], elem=g.UINT8)
    for k, (name, t, dims) in enumerate(SPECS):
        w.add_tensor(name, t, dims, pattern(g.tensor_nbytes(t, dims), k + 1))
    return w


def describe(w):
    return {"data_offset": w.data_offset(), "alignment": w.alignment,
            "tensors": [{"name": t["name"], "type": t["type"], "dims": t["dims"],
                         "offset": t["offset"], "nbytes": len(t["data"]),
                         "seed": 1 + [s[0] for s in SPECS].index(t["name"])}
                        for t in w.tensors]}


def main():
    out = sys.argv[1]
    manifest = {}
    for name, w in [("v3.gguf", writer(3)), ("v2.gguf", writer(2, alignment=64))]:
        w.write(os.path.join(out, name))
        manifest[name] = describe(w)
    for k, w in enumerate(g.split_writers(writer(3), 2)):
        name = g.split_path("split", k + 1, 2)
        w.write(os.path.join(out, name))
        manifest[name] = describe(w)
    print(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
