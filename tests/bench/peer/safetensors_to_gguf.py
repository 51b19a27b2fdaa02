#!/usr/bin/python3
"""Writes a Mixtral-layout Hugging Face checkpoint as a llama.cpp GGUF.

tests/bench/peer_bench.sh uses it instead of llama.cpp's convert_hf_to_gguf.py,
which needs torch and transformers (not on these machines). It writes what
that script writes for MixtralForCausalLM (architecture "llama"), with the
writer of the gguf-py package from the llama.cpp bundle:

  - q_proj / k_proj rows permuted to llama.cpp's rope layout (LlamaModel.permute)
  - experts stacked: w1 -> ffn_gate_exps, w3 -> ffn_up_exps, w2 -> ffn_down_exps
  - matrices in their stored dtype (BF16 stays BF16, bit for bit); norms and
    routers (ffn_gate_inp) as F32 (exact from BF16)
  - no text vocabulary: tokenizer.ggml.model "none" with vocab_size dummy
    tokens (the benchmark feeds token ids, never text)

usage: safetensors_to_gguf.py MODEL_DIR OUT.gguf --gguf-py DIR
Needs numpy (Debian's python3-numpy: run with /usr/bin/python3).
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}


class Checkpoint:
    """Tensors of one or more safetensors files, as read-only numpy views."""

    def __init__(self, model_dir):
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            files = sorted(set(json.load(open(index))["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        self.tensors = {}
        for name in files:
            path = os.path.join(model_dir, name)
            with open(path, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(n))
            data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
            for key, info in header.items():
                if key == "__metadata__":
                    continue
                if info["dtype"] not in DTYPES:
                    sys.exit(f"{path}: tensor {key} has dtype {info['dtype']} (need BF16, F16 or F32)")
                b, e = info["data_offsets"]
                arr = data[b:e].view(DTYPES[info["dtype"]]).reshape(info["shape"])
                self.tensors[key] = (info["dtype"], arr)

    def get(self, name):
        if name not in self.tensors:
            sys.exit(f"missing tensor {name}")
        return self.tensors[name]


def to_f32(dtype, arr):
    if dtype == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)


def permute(w, n_head, n_head_kv):
    """llama.cpp's LlamaModel.permute (convert_hf_to_gguf): HF rotate-half
    rows -> interleaved pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--gguf-py", required=True, help="gguf-py directory of the llama.cpp bundle")
    args = ap.parse_args()
    sys.path.insert(0, args.gguf_py)
    import gguf  # noqa: E402

    cfg = json.load(open(os.path.join(args.model_dir, "config.json")))
    if cfg.get("model_type") != "mixtral":
        sys.exit(f"model_type {cfg.get('model_type')!r}: only mixtral is supported")
    ck = Checkpoint(args.model_dir)
    n_layer = cfg["num_hidden_layers"]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // n_head
    n_expert = cfg["num_local_experts"]
    big_dtype = ck.get("model.embed_tokens.weight")[0]
    gtype = {"BF16": gguf.GGMLQuantizationType.BF16, "F16": None, "F32": None}[big_dtype]
    ftype = {"BF16": gguf.LlamaFileType.MOSTLY_BF16, "F16": gguf.LlamaFileType.MOSTLY_F16,
             "F32": gguf.LlamaFileType.ALL_F32}[big_dtype]

    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name(os.path.basename(os.path.normpath(args.model_dir)))
    w.add_block_count(n_layer)
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    if head_dim != hidden // n_head:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(cfg.get("rope_theta", 1e6))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-5))
    w.add_expert_count(n_expert)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(ftype)
    w.add_tokenizer_model("none")

    def matrix(name, dtype, arr):
        if dtype != big_dtype:
            sys.exit(f"{name}: dtype {dtype}, the embeddings are {big_dtype}")
        w.add_tensor(name, np.ascontiguousarray(arr), raw_dtype=gtype)

    def vector(name, dtype, arr):
        w.add_tensor(name, np.ascontiguousarray(to_f32(dtype, arr)))

    matrix("token_embd.weight", *ck.get("model.embed_tokens.weight"))
    vector("output_norm.weight", *ck.get("model.norm.weight"))
    if "lm_head.weight" in ck.tensors and not cfg.get("tie_word_embeddings", False):
        matrix("output.weight", *ck.get("lm_head.weight"))
    for i in range(n_layer):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        vector(b + "attn_norm.weight", *ck.get(p + "input_layernorm.weight"))
        vector(b + "ffn_norm.weight", *ck.get(p + "post_attention_layernorm.weight"))
        dt, q = ck.get(p + "self_attn.q_proj.weight")
        matrix(b + "attn_q.weight", dt, permute(q, n_head, n_head))
        dt, k = ck.get(p + "self_attn.k_proj.weight")
        matrix(b + "attn_k.weight", dt, permute(k, n_head, n_kv))
        matrix(b + "attn_v.weight", *ck.get(p + "self_attn.v_proj.weight"))
        matrix(b + "attn_output.weight", *ck.get(p + "self_attn.o_proj.weight"))
        vector(b + "ffn_gate_inp.weight", *ck.get(p + "block_sparse_moe.gate.weight"))
        for hf, gg in (("w1", "ffn_gate_exps"), ("w3", "ffn_up_exps"), ("w2", "ffn_down_exps")):
            parts = [ck.get(f"{p}block_sparse_moe.experts.{x}.{hf}.weight") for x in range(n_expert)]
            matrix(f"{b}{gg}.weight", parts[0][0], np.stack([a for _, a in parts]))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
