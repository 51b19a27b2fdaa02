#!/usr/bin/python3
"""Independent Hugging Face checkpoint writer and checker (numpy + json only).

Used by hf_checkpoint_test.cc to check that our reader handles checkpoints it
did not write, and that what `moectl make-model` writes is readable without
our code.

  hf_checkpoint.py write --family F --out DIR [--break KIND]
      Writes config.json and weights the way transformers/safetensors lay them
      out, prints {"total_bytes", "dense_bytes", "bytes_per_expert",
      "moe_layers", "files"} computed here.
      Tensor values: element i of tensor `name` is
      ((7 * i + sum(name.encode()) % 101) % 13 - 6) / 8, exact in every dtype.
  hf_checkpoint.py write --family gpt_oss_mxfp4 --out DIR
      An openai/gpt-oss-style checkpoint (config as published, MXFP4 experts):
      mlp.experts.{gate_up,down}_proj_blocks U8 [E, rows, cols/32, 16] with
      byte i = (37 * i + 11) % 256 (two FP4 codes, low nibble first) and
      _scales U8 [E, rows, cols/32] with scale i = 118 + (i % 5) (factors
      2^-9 .. 2^-5); every other tensor BF16 from values(). Prints the same
      byte counts (an expert: its codes, scales and BF16 biases).
  hf_checkpoint.py check DIR
      Reads DIR with numpy only, checks the layout, prints
      {"tensors", "total_bytes", "files", "merges"}.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (None, 2),
          "F64": (np.float64, 8), "I64": (np.int64, 8), "I32": (np.int32, 4),
          "I16": (np.int16, 2), "I8": (np.int8, 1), "U8": (np.uint8, 1),
          "BOOL": (np.bool_, 1), "U16": (np.uint16, 2), "U32": (np.uint32, 4),
          "U64": (np.uint64, 8), "F8_E4M3": (np.uint8, 1)}

# E4M3 ("fn": bias 7, 3 mantissa bits) codes of the magnitudes `values`
# produces (k / 8, k <= 6), worked out by hand: (1 + m/8) 2^(e-7) -> e << 3 | m.
E4M3 = {0.0: 0x00, 0.125: 0x20, 0.25: 0x28, 0.375: 0x2c, 0.5: 0x30, 0.625: 0x32,
        0.75: 0x34}

CONFIGS = {
    # Mixtral-style, BF16, one file.
    "mixtral": dict(
        dtype="BF16", shards=1,
        config={"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
                "num_experts_per_tok": 2, "vocab_size": 300, "rms_norm_eps": 1e-05,
                "rope_theta": 1000000.0, "sliding_window": None, "bos_token_id": 1,
                "eos_token_id": 2, "tie_word_embeddings": False, "hidden_act": "silu",
                "max_position_embeddings": 32768, "router_aux_loss_coef": 0.02,
                "torch_dtype": "bfloat16", "transformers_version": "4.36.0"}),
    # Qwen1.5-MoE-style: qkv bias, shared expert, one dense layer, F16, 2 shards.
    "qwen2_moe": dict(
        dtype="F16", shards=2,
        config={"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
                "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
                "shared_expert_intermediate_size": 40, "num_hidden_layers": 3,
                "num_attention_heads": 4, "num_key_value_heads": 4, "num_experts": 6,
                "num_experts_per_tok": 3, "decoder_sparse_step": 1, "mlp_only_layers": [1],
                "norm_topk_prob": False, "vocab_size": 300, "rms_norm_eps": 1e-06,
                "rope_theta": 1000000.0, "use_sliding_window": False, "sliding_window": 32768,
                "max_window_layers": 21, "bos_token_id": 299, "eos_token_id": 299,
                "tie_word_embeddings": False, "torch_dtype": "float16"}),
    # Qwen3-MoE-style: explicit head_dim != hidden/heads, q/k norm, F32.
    "qwen3_moe": dict(
        dtype="F32", shards=1,
        config={"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                "hidden_size": 32, "head_dim": 16, "intermediate_size": 64,
                "moe_intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
                "norm_topk_prob": True, "mlp_only_layers": [], "decoder_sparse_step": 1,
                "attention_bias": False, "vocab_size": 300, "rms_norm_eps": 1e-06,
                "rope_scaling": None, "rope_theta": 1000000.0, "eos_token_id": [298, 299],
                "tie_word_embeddings": False, "torch_dtype": "float32"}),
    # Qwen3-FP8-style: every Linear weight but the router F8_E4M3 with F32
    # weight_scale_inv per 16 x 16 block (partial blocks: width 24), the rest BF16.
    "qwen3_moe_fp8": dict(
        dtype="BF16", shards=2, fp8_block=[16, 16],
        config={"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                "hidden_size": 32, "head_dim": 16, "intermediate_size": 64,
                "moe_intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
                "norm_topk_prob": True, "mlp_only_layers": [1], "decoder_sparse_step": 1,
                "vocab_size": 300, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                "eos_token_id": 299, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                        "quant_method": "fp8",
                                        "weight_block_size": [16, 16]}}),
    # OLMoE-style, BF16, tied embeddings, an extra non-model tensor.
    "olmoe": dict(
        dtype="BF16", shards=1,
        config={"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe",
                "hidden_size": 32, "intermediate_size": 24, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 4, "num_experts": 4,
                "num_experts_per_tok": 2, "norm_topk_prob": False, "clip_qkv": None,
                "attention_bias": False, "vocab_size": 300, "rms_norm_eps": 1e-05,
                "rope_theta": 10000.0, "pad_token_id": 1, "eos_token_id": 299,
                "tie_word_embeddings": True}),
}


def values(name, n):
    seed = sum(name.encode()) % 101
    i = np.arange(n, dtype=np.int64)
    return (((7 * i + seed) % 13) - 6).astype(np.float32) / 8.0


def encode(arr, dtype):
    if dtype == "BF16":
        u = arr.astype(np.float32).view(np.uint32)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return u.astype("<u2").tobytes()
    return arr.astype(np.dtype(DTYPES[dtype][0]).newbyteorder("<")).tobytes()


def is_fp8(name, shape):
    """The tensors FP8 releases store as F8_E4M3: 2-D projections, not the
    embeddings, lm_head or routers."""
    return len(shape) == 2 and name.endswith("proj.weight") or ".experts." in name


def fp8_scale(bi, bj):
    """scale_inv of block (bi, bj): powers of two, so every product is exact."""
    return float(2 ** ((bi + 2 * bj) % 3))


def encode_fp8(name, shape, block):
    """(codes, scale_inv bytes, scale shape): code * scale_inv == values(name)
    * the block's scale, i.e. the stored weights are values() times scales."""
    rows, cols = shape
    v = values(name, rows * cols).reshape(rows, cols)
    codes = np.array([[E4M3[abs(float(x))] | (0x80 if x < 0 else 0) for x in row]
                      for row in v], dtype=np.uint8)
    sr, sc = -(-rows // block[0]), -(-cols // block[1])
    scales = np.array([[fp8_scale(i, j) for j in range(sc)] for i in range(sr)], "<f4")
    return codes.tobytes(), scales.tobytes(), [sr, sc]


def tensors_for(family, c):
    """(name, shape, is_expert) for every tensor, as transformers names them."""
    h, v, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or h // heads
    experts = c.get("num_local_experts") or c.get("num_experts")
    inter = c["intermediate_size"]
    moe_inter = c.get("moe_intermediate_size", inter) if family.startswith("qwen") else inter
    out = [("model.embed_tokens.weight", [v, h], False), ("model.norm.weight", [h], False)]
    if not c.get("tie_word_embeddings"):
        out.append(("lm_head.weight", [v, h], False))
    for i in range(L):
        p = "model.layers.%d." % i
        out += [(p + "input_layernorm.weight", [h], False),
                (p + "post_attention_layernorm.weight", [h], False),
                (p + "self_attn.q_proj.weight", [heads * hd, h], False),
                (p + "self_attn.k_proj.weight", [kv * hd, h], False),
                (p + "self_attn.v_proj.weight", [kv * hd, h], False),
                (p + "self_attn.o_proj.weight", [h, heads * hd], False)]
        if family == "qwen2_moe":
            out += [(p + "self_attn.q_proj.bias", [heads * hd], False),
                    (p + "self_attn.k_proj.bias", [kv * hd], False),
                    (p + "self_attn.v_proj.bias", [kv * hd], False)]
        if family == "qwen3_moe":
            out += [(p + "self_attn.q_norm.weight", [hd], False),
                    (p + "self_attn.k_norm.weight", [hd], False)]
        if family == "olmoe":
            out += [(p + "self_attn.q_norm.weight", [heads * hd], False),
                    (p + "self_attn.k_norm.weight", [kv * hd], False)]
        sparse = i not in c.get("mlp_only_layers", []) and \
            (i + 1) % c.get("decoder_sparse_step", 1) == 0
        if not sparse:
            out += [(p + "mlp.gate_proj.weight", [inter, h], False),
                    (p + "mlp.up_proj.weight", [inter, h], False),
                    (p + "mlp.down_proj.weight", [h, inter], False)]
            continue
        if family == "mixtral":
            m = p + "block_sparse_moe."
            names = ("w1", "w3", "w2")
        else:
            m = p + "mlp."
            names = ("gate_proj", "up_proj", "down_proj")
        out.append((m + "gate.weight", [experts, h], False))
        for j in range(experts):
            e = "%sexperts.%d." % (m, j)
            out += [(e + names[0] + ".weight", [moe_inter, h], True),
                    (e + names[1] + ".weight", [moe_inter, h], True),
                    (e + names[2] + ".weight", [h, moe_inter], True)]
        if family == "qwen2_moe":
            s = c["shared_expert_intermediate_size"]
            out += [(m + "shared_expert.gate_proj.weight", [s, h], False),
                    (m + "shared_expert.up_proj.weight", [s, h], False),
                    (m + "shared_expert.down_proj.weight", [h, s], False),
                    (m + "shared_expert_gate.weight", [1, h], False)]
    return out


def write_safetensors(path, entries):
    """entries: list of (name, dtype, shape, bytes); laid out as safetensors does
    (sorted by name), header padded with spaces to a multiple of 8."""
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    blobs = []
    for name, dtype, shape, data in sorted(entries, key=lambda e: e[0]):
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


GPT_OSS = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
           "attention_bias": True, "hidden_size": 64, "intermediate_size": 32,
           "head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_hidden_layers": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
           "experts_per_token": 2, "layer_types": ["sliding_attention", "full_attention"],
           "sliding_window": 4, "vocab_size": 300, "rms_norm_eps": 1e-05,
           "rope_theta": 150000, "max_position_embeddings": 4096,
           "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 4.0,
                            "original_max_position_embeddings": 1024, "rope_type": "yarn",
                            "truncate": False},
           "swiglu_limit": 7.0, "initial_context_length": 1024, "eos_token_id": 299,
           "pad_token_id": 298, "tie_word_embeddings": False, "hidden_act": "silu",
           "quantization_config": {"modules_to_not_convert": [
               "model.layers.*.self_attn", "model.layers.*.mlp.router",
               "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
           "torch_dtype": "bfloat16"}


def write_gpt_oss(out):
    c = GPT_OSS
    h, inter, e, v = c["hidden_size"], c["intermediate_size"], c["num_local_experts"], c["vocab_size"]
    heads, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    dense = [("model.embed_tokens.weight", [v, h]), ("model.norm.weight", [h]),
             ("lm_head.weight", [v, h])]
    entries, expert_bytes = [], 0
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        dense += [(p + "input_layernorm.weight", [h]), (p + "post_attention_layernorm.weight", [h]),
                  (p + "self_attn.q_proj.weight", [heads * hd, h]),
                  (p + "self_attn.q_proj.bias", [heads * hd]),
                  (p + "self_attn.k_proj.weight", [kv * hd, h]), (p + "self_attn.k_proj.bias", [kv * hd]),
                  (p + "self_attn.v_proj.weight", [kv * hd, h]), (p + "self_attn.v_proj.bias", [kv * hd]),
                  (p + "self_attn.o_proj.weight", [h, heads * hd]), (p + "self_attn.o_proj.bias", [h]),
                  (p + "self_attn.sinks", [heads]), (p + "mlp.router.weight", [e, h]),
                  (p + "mlp.router.bias", [e])]
        x = p + "mlp.experts."
        for name, shape in ((x + "gate_up_proj_bias", [e, 2 * inter]), (x + "down_proj_bias", [e, h])):
            entries.append((name, "BF16", shape, encode(values(name, int(np.prod(shape))), "BF16")))
            expert_bytes += len(entries[-1][3])
        for name, rows, cols in ((x + "gate_up_proj", 2 * inter, h), (x + "down_proj", h, inter)):
            g = cols // 32
            n = e * rows * g * 16
            codes = ((37 * np.arange(n, dtype=np.int64) + 11) % 256).astype(np.uint8)
            scales = (118 + np.arange(e * rows * g, dtype=np.int64) % 5).astype(np.uint8)
            entries.append((name + "_blocks", "U8", [e, rows, g, 16], codes.tobytes()))
            entries.append((name + "_scales", "U8", [e, rows, g], scales.tobytes()))
            expert_bytes += n + e * rows * g
    for name, shape in dense:
        entries.append((name, "BF16", shape, encode(values(name, int(np.prod(shape))), "BF16")))
    total = sum(len(d) for _, _, _, d in entries)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    write_safetensors(os.path.join(out, "model.safetensors"), entries)
    layers = c["num_hidden_layers"]
    print(json.dumps({"total_bytes": total, "dense_bytes": total - expert_bytes,
                      "bytes_per_expert": expert_bytes // (layers * e), "moe_layers": layers,
                      "files": 1}))


def cmd_write(args):
    if args.family == "gpt_oss_mxfp4":
        return write_gpt_oss(args.out)
    spec = CONFIGS[args.family]
    cfg, dtype, shards = dict(spec["config"]), spec["dtype"], spec["shards"]
    os.makedirs(args.out, exist_ok=True)
    specs = tensors_for(cfg["model_type"], cfg)
    size = DTYPES[dtype][1]
    total = sum(int(np.prod(s)) * size for _, s, _ in specs)
    expert_bytes = sum(int(np.prod(s)) * size for _, s, e in specs if e)
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    entries = []
    block = spec.get("fp8_block")
    if block:  # F8 weights are 1 byte, plus their scales
        total = expert_bytes = 0
    for name, shape, is_expert in specs:
        if args.break_kind == "missing-expert" and name.endswith(
                ("experts.1.up_proj.weight", "experts.1.w3.weight")):
            continue
        if args.break_kind == "bad-shape" and name == "model.layers.0.self_attn.q_proj.weight":
            shape = shape[::-1]
        n = int(np.prod(shape))
        if block and is_fp8(name, shape):
            codes, scales, sshape = encode_fp8(name, shape, block)
            entries.append((name, "F8_E4M3", shape, codes))
            entries.append((name + "_scale_inv", "F32", sshape, scales))
            nbytes = len(codes) + len(scales)
        else:
            entries.append((name, dtype, shape, encode(values(name, n), dtype)))
            nbytes = len(entries[-1][3])
        if block:
            total += nbytes
            expert_bytes += nbytes if is_expert else 0
    if args.family == "olmoe":  # older checkpoints carry rotary buffers
        entries.append(("model.layers.0.self_attn.rotary_emb.inv_freq", "F32", [4],
                        encode(np.ones(4, np.float32), "F32")))
    if args.break_kind == "bad-config":
        cfg["num_experts_per_tok"] = experts + 1
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if shards == 1:
        write_safetensors(os.path.join(args.out, "model.safetensors"), entries)
    else:
        entries.sort(key=lambda e: e[0])
        per = (len(entries) + shards - 1) // shards
        weight_map = {}
        for k in range(shards):
            fname = "model-%05d-of-%05d.safetensors" % (k + 1, shards)
            part = entries[k * per:(k + 1) * per]
            write_safetensors(os.path.join(args.out, fname), part)
            for e in part:
                weight_map[e[0]] = fname
        with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    moe_layers = sum(1 for n, _, _ in specs if n.endswith(".gate.weight") and "shared" not in n)
    print(json.dumps({"total_bytes": total, "dense_bytes": total - expert_bytes,
                      "bytes_per_expert": expert_bytes // (moe_layers * experts),
                      "moe_layers": moe_layers, "files": shards}))


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert n % 8 == 0, "%s: header length %d not padded to 8" % (path, n)
    header = json.loads(blob[8:8 + n].decode())
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    assert all(isinstance(v, str) for v in meta.values()), "metadata must map str->str"
    spans = []
    for name, t in header.items():
        assert set(t) == {"dtype", "shape", "data_offsets"}, name
        begin, end = t["data_offsets"]
        count = int(np.prod(t["shape"])) if t["shape"] else 1
        assert end - begin == count * DTYPES[t["dtype"]][1], name
        spans.append((begin, end))
        if t["dtype"] in ("F32", "F16"):
            arr = np.frombuffer(data[begin:end], dtype=DTYPES[t["dtype"]][0])
            assert np.all(np.isfinite(arr)), name
    spans.sort()
    pos = 0
    for begin, end in spans:  # contiguous from 0, as the reference writer does
        assert begin == pos, "%s: gap or overlap at %d" % (path, begin)
        pos = end
    assert pos == len(data), "%s: trailing bytes" % path
    return header, pos


def cmd_check(args):
    d = args.dir
    cfg = json.load(open(os.path.join(d, "config.json")))
    for key in ("model_type", "architectures", "hidden_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert key in cfg, "config.json lacks " + key
    index_path = os.path.join(d, "model.safetensors.index.json")
    names, total, files = set(), 0, 0
    if os.path.exists(index_path):
        index = json.load(open(index_path))
        shards = sorted(set(index["weight_map"].values()))
        for s in shards:
            header, size = read_safetensors(os.path.join(d, s))
            for name in header:
                assert index["weight_map"][name] == s, name
            names |= set(header)
            total += size
        assert names == set(index["weight_map"]), "index and shards disagree"
        assert index["metadata"]["total_size"] == total, "total_size is wrong"
        files = len(shards)
    else:
        header, total = read_safetensors(os.path.join(d, "model.safetensors"))
        names, files = set(header), 1
    tok = json.load(open(os.path.join(d, "tokenizer.json")))
    vocab = tok["model"]["vocab"]
    assert tok["model"]["type"] == "BPE" and len(vocab) >= 256
    for m in tok["model"]["merges"]:
        a, b = m.split(" ")
        assert a in vocab and b in vocab and a + b in vocab, m
    print(json.dumps({"tensors": len(names), "total_bytes": total, "files": files,
                      "merges": len(tok["model"]["merges"])}))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--family", required=True, choices=sorted(CONFIGS) + ["gpt_oss_mxfp4"])
    w.add_argument("--out", required=True)
    w.add_argument("--break", dest="break_kind", default="",
                   choices=["", "missing-expert", "bad-shape", "bad-config"])
    c = sub.add_parser("check")
    c.add_argument("dir")
    args = p.parse_args()
    (cmd_write if args.cmd == "write" else cmd_check)(args)


if __name__ == "__main__":
    sys.exit(main())
