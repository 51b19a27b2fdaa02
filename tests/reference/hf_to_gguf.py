#!/usr/bin/python3
"""Converts a small Hugging Face MoE folder (config.json + model.safetensors)
to a GGUF file the way llama.cpp's converter lays it out, for tests: our own
code, standard library only (with tests/reference/gguf_writer.py) unless a
quantizing option asks for numpy.

    hf_to_gguf.py MODEL_DIR OUT.gguf [--experts TYPE] [--dense TYPE]
                  [--tensor-type GGUF_NAME=TYPE ...]
                  [--dequantized DIR]

Families: mixtral (GGUF architecture "llama" with experts), qwen2_moe
("qwen2moe"), qwen3_moe ("qwen3moe"), olmoe ("olmoe"), glm4_moe
("glm4moe", its nextn layers counted in block_count as llama.cpp does),
deepseek_v2 / deepseek_v3 ("deepseek2": latent attention kept as kv_b,
or with --split-kv-b as newer converters' attn_k_b / attn_v_b) and
gpt_oss ("gpt-oss": fused experts split into gate / up / down stacks and
biases; MXFP4 experts stay MXFP4, in ggml's blocks with F32 biases, as
llama.cpp's GptOssModel writes them). Tensors keep their dtype (F32, F16
or BF16), unless --experts quantizes the routed experts (and --dense the
other 2-D weights whose rows are whole blocks, the router excepted) to a
ggml block type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4)
with the numpy quantizers of gguf_quants.py; --dequantized then writes
DIR, the same model as a folder whose weights are the float64
dequantization of what went into the file (F64 safetensors, for
moe_reference.py). Our quantizer may write the Q8_0 code -128 (ggml's own
never does; files may hold it). What llama.cpp's
converter does and this does too: llama.cpp's tensor names, each layer's
routed experts stacked into one tensor per projection (ggml dims [in, out,
experts]), and the rows of a llama model's attn_q / attn_k permuted for its
interleaved rope (HF row h*d + j*d/2 + i goes to row h*d + 2*i + j). A
byte-level BPE tokenizer.json becomes tokenizer.ggml.* (model "gpt2", the
pre-tokenizer named by its split regex, tokens by id, merges, token types:
3 for special added tokens, 4 for other added ones, 1 otherwise), and
tokenizer_config.json's chat_template becomes tokenizer.chat_template.
"""
import argparse
import json
import os
import shutil
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_writer as gw  # noqa: E402

DTYPES = {"F32": (gw.F32, 4), "F16": (gw.F16, 2), "BF16": (gw.BF16, 2)}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], blob[base + a:base + b])
    return out


QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
         r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def add_tokenizer(w, path):
    tok = json.load(open(path))
    model = tok["model"]
    if model.get("type", "BPE") != "BPE" or model.get("byte_fallback"):
        sys.exit("hf_to_gguf.py: only byte-level BPE tokenizers are converted")
    ids = dict(model["vocab"])
    kinds = {}
    for a in tok.get("added_tokens", []):
        ids[a["content"]] = a["id"]
        kinds[a["id"]] = 3 if a.get("special") else 4
    tokens = [None] * (max(ids.values()) + 1)
    for t, i in ids.items():
        tokens[i] = t
    tokens = [t if t is not None else "[PAD%d]" % i for i, t in enumerate(tokens)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    pre = "default"
    text = json.dumps(tok.get("pre_tokenizer"))
    if json.dumps(QWEN2)[1:-1] in text:
        pre = "qwen2"
    elif json.dumps(LLAMA3)[1:-1] in text:
        pre = "llama-bpe"
    post = tok.get("post_processor") or {}
    add_bos = post.get("type") == "TemplateProcessing" and "SpecialToken" in post["single"][0]
    w.add("tokenizer.ggml.model", gw.STRING, "gpt2")
    w.add("tokenizer.ggml.pre", gw.STRING, pre)
    w.add("tokenizer.ggml.tokens", gw.ARRAY, tokens, elem=gw.STRING)
    w.add("tokenizer.ggml.token_type", gw.ARRAY,
          [kinds.get(i, 1) for i in range(len(tokens))], elem=gw.INT32)
    w.add("tokenizer.ggml.merges", gw.ARRAY, merges, elem=gw.STRING)
    w.add("tokenizer.ggml.add_bos_token", gw.BOOL, bool(add_bos))
    cfg_path = os.path.join(os.path.dirname(path), "tokenizer_config.json")
    if os.path.exists(cfg_path):
        template = json.load(open(cfg_path)).get("chat_template")
        if isinstance(template, str):
            w.add("tokenizer.chat_template", gw.STRING, template)


def permute_rows(data, rows, heads, row_bytes):
    d = rows // heads
    out = bytearray(len(data))
    for h in range(heads):
        for i in range(d // 2):
            for j in range(2):
                src = h * d + j * (d // 2) + i
                dst = h * d + 2 * i + j
                out[dst * row_bytes:(dst + 1) * row_bytes] = \
                    data[src * row_bytes:(src + 1) * row_bytes]
    return bytes(out)


def as_float64(dtype, shape, data):
    import numpy as np
    if dtype == "BF16":
        bits = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        a = bits.view(np.float32)
    else:
        a = np.frombuffer(data, dtype={"F32": "<f4", "F16": "<f2", "F64": "<f8"}[dtype])
    return a.astype(np.float64).reshape(shape)


class Quantizer:
    """Quantizes 2-D weights [out, in] row by row when a type applies to them,
    remembering the float64 dequantization of every tensor by its HF name."""

    def __init__(self, experts, dense, keep, overrides=None):
        self.types = {"experts": experts, "dense": dense, "router": None}
        self.overrides = overrides or {}  # GGUF tensor name -> ggml type
        self.keep = keep  # remember the dequantized weights
        self.dequantized = {}

    def convert(self, hf_name, kind, dtype, shape, data, gguf_name=None):
        """(ggml type, bytes) for the tensor, in HF row order. A --tensor-type
        override for `gguf_name` wins over the kind's type (llama.cpp's
        mixed files: Q4_K_M puts some layers' ffn_down_exps in Q6_K)."""
        t = self.overrides.get(gguf_name, self.types[kind])
        if t is not None:
            per, _ = gw.BLOCK[t]
            if len(shape) != 2 or shape[1] % per:
                t = None
        if t is None:
            if self.keep:
                self.dequantized[hf_name] = as_float64(dtype, shape, data)
            return DTYPES[dtype][0], data
        import gguf_quants as gq
        raw = gq.quantize(t, as_float64(dtype, shape, data))
        if self.keep:
            self.dequantized[hf_name] = gq.dequantize(t, raw).reshape(shape)
        return t, raw

    def write_folder(self, src, out):
        os.makedirs(out, exist_ok=True)
        for f in os.listdir(src):
            if f.endswith(".json") and f != "model.safetensors.index.json":
                shutil.copy(os.path.join(src, f), os.path.join(out, f))
        header, blobs, off = {}, [], 0
        for name in sorted(self.dequantized):
            a = self.dequantized[name]
            b = a.astype("<f8").tobytes()
            header[name] = {"dtype": "F64", "shape": list(a.shape),
                            "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        with open(os.path.join(out, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def parse_args():
    types = {v: k for k, v in gw.TYPE_NAMES.items()}
    p = argparse.ArgumentParser()
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--experts", choices=sorted(types), default=None)
    p.add_argument("--dense", choices=sorted(types), default=None)
    p.add_argument("--dequantized", default=None)
    p.add_argument("--split-kv-b", action="store_true",
                   help="deepseek2: attn_k_b + attn_v_b instead of attn_kv_b")
    p.add_argument("--fuse-gate-up-exps", action="store_true",
                   help="one ffn_gate_up_exps per layer (gate's rows then up's, per expert), "
                        "as llama.cpp's converter writes with the same flag")
    p.add_argument("--fuse-qkv", action="store_true",
                   help="one attn_qkv per layer (q's rows, k's, v's; llama's q and k permuted "
                        "first), as llama.cpp's converter writes with the same flag")
    p.add_argument("--drop", action="append", default=[],
                   help="leave out the GGUF tensor of this name (for refusal tests)")
    p.add_argument("--tensor-type", action="append", default=[],
                   help="GGUF_NAME=TYPE, e.g. blk.1.ffn_down_exps.weight=q6_k")
    a = p.parse_args()
    overrides = {}
    for o in a.tensor_type:
        name, _, t = o.partition("=")
        t = t.upper()  # ggml type names, any case (q6_k)
        if t not in types:
            p.error("--tensor-type %s: unknown type %r" % (o, t))
        overrides[name] = types[t]
    return a, types.get(a.experts), types.get(a.dense), overrides


PROJ = {"gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}

# model_type -> llama.cpp's architecture, our MoE block, the config field
# counting the routed experts, expert projection names.
FAMILIES = {
    "mixtral": ("llama", "block_sparse_moe", "num_local_experts",
                {"w1": "ffn_gate", "w3": "ffn_up", "w2": "ffn_down"}),
    "qwen2_moe": ("qwen2moe", "mlp", "num_experts", PROJ),
    "qwen3_moe": ("qwen3moe", "mlp", "num_experts", PROJ),
    "olmoe": ("olmoe", "mlp", "num_experts", PROJ),
    "glm4_moe": ("glm4moe", "mlp", "n_routed_experts", PROJ),
    "deepseek_v2": ("deepseek2", "mlp", "n_routed_experts", PROJ),
    "deepseek_v3": ("deepseek2", "mlp", "n_routed_experts", PROJ),
    "gpt_oss": ("gpt-oss", "mlp", "num_local_experts", PROJ),
}

# Per-layer HF names (after model.layers.N.) -> llama.cpp's (after blk.N.).
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    # the nextn (MTP) layers' own tensors
    "eh_proj.weight": "nextn.eh_proj.weight",
    "enorm.weight": "nextn.enorm.weight",
    "hnorm.weight": "nextn.hnorm.weight",
    "embed_tokens.weight": "nextn.embed_tokens.weight",
    "shared_head.head.weight": "nextn.shared_head_head.weight",
    "shared_head.norm.weight": "nextn.shared_head_norm.weight",
    # latent attention (deepseek2)
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.kv_b_proj.weight": "attn_kv_b.weight",
}
# Where an architecture names a tensor otherwise.
ARCH_LAYER_NAMES = {
    "gpt-oss": {
        "post_attention_layernorm.weight": "post_attention_norm.weight",
        "self_attn.o_proj.bias": "attn_output.bias",
        "self_attn.sinks": "attn_sinks.weight",
        "mlp.router.weight": "ffn_gate_inp.weight",
        "mlp.router.bias": "ffn_gate_inp.bias",
    },
}
# Kept as they are, as llama.cpp keeps routers.
ROUTERS = ("gate.weight", "shared_expert_gate.weight", "router.weight", "router.bias")


def add_arch_keys(w, arch, cfg, head_dim):
    """The keys llama.cpp's converter writes beyond the common ones."""
    U32, F32V = gw.UINT32, gw.FLOAT32
    if arch == "llama":
        w.add(arch + ".rope.dimension_count", U32, head_dim)
        return
    if arch == "deepseek2":
        return add_deepseek2_keys(w, arch, cfg)
    if arch == "gpt-oss":
        return add_gpt_oss_keys(w, arch, cfg, head_dim)
    if arch in ("qwen2moe", "qwen3moe", "glm4moe"):
        w.add(arch + ".expert_feed_forward_length", U32, cfg["moe_intermediate_size"])
    if arch != "olmoe":
        w.add(arch + ".attention.key_length", U32, head_dim)
        w.add(arch + ".attention.value_length", U32, head_dim)
    if arch == "qwen2moe":
        w.add(arch + ".expert_shared_feed_forward_length", U32,
              cfg["shared_expert_intermediate_size"])
    if arch == "olmoe" and cfg.get("clip_qkv") is not None:
        w.add(arch + ".attention.clamp_kqv", F32V, cfg["clip_qkv"])
    if arch == "glm4moe":
        w.add(arch + ".rope.dimension_count", U32,
              int(head_dim * cfg.get("partial_rotary_factor", 0.5)))
        w.add(arch + ".expert_shared_count", U32, cfg.get("n_shared_experts") or 0)
        w.add(arch + ".leading_dense_block_count", U32, cfg.get("first_k_dense_replace", 1))
        w.add(arch + ".expert_gating_func", U32, 2)  # sigmoid
        w.add(arch + ".expert_weights_scale", F32V, cfg.get("routed_scaling_factor", 1.0))
        w.add(arch + ".expert_weights_norm", gw.BOOL, bool(cfg.get("norm_topk_prob", True)))
        w.add(arch + ".expert_group_count", U32, cfg.get("n_group", 1))
        w.add(arch + ".expert_group_used_count", U32, cfg.get("topk_group", 1))
        if cfg.get("num_nextn_predict_layers"):
            w.add(arch + ".nextn_predict_layers", U32, cfg["num_nextn_predict_layers"])


def add_deepseek2_keys(w, arch, cfg):
    """As llama.cpp's DeepseekV2Model: the MQA view of the latent cache as
    key/value_length, the heads' sizes as key/value_length_mla."""
    U32, F32V = gw.UINT32, gw.FLOAT32
    rope, nope = cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"]
    w.add(arch + ".leading_dense_block_count", U32, cfg.get("first_k_dense_replace", 0))
    w.add(arch + ".expert_feed_forward_length", U32, cfg["moe_intermediate_size"])
    w.add(arch + ".expert_shared_count", U32, cfg.get("n_shared_experts") or 0)
    w.add(arch + ".expert_weights_scale", F32V, cfg.get("routed_scaling_factor", 1.0))
    w.add(arch + ".expert_weights_norm", gw.BOOL, bool(cfg.get("norm_topk_prob", False)))
    w.add(arch + ".expert_gating_func", U32, 2 if cfg.get("scoring_func") == "sigmoid" else 1)
    w.add(arch + ".expert_group_count", U32, cfg.get("n_group") or 1)
    w.add(arch + ".expert_group_used_count", U32, cfg.get("topk_group") or 1)
    if cfg.get("q_lora_rank") is not None:
        w.add(arch + ".attention.q_lora_rank", U32, cfg["q_lora_rank"])
    w.add(arch + ".attention.kv_lora_rank", U32, cfg["kv_lora_rank"])
    w.add(arch + ".attention.key_length", U32, cfg["kv_lora_rank"] + rope)
    w.add(arch + ".attention.value_length", U32, cfg["kv_lora_rank"])
    w.add(arch + ".attention.key_length_mla", U32, nope + rope)
    w.add(arch + ".attention.value_length_mla", U32, cfg["v_head_dim"])
    w.add(arch + ".rope.dimension_count", U32, rope)
    y = cfg.get("rope_scaling") or {}
    if y.get("rope_type", y.get("type")) == "yarn":
        w.add(arch + ".rope.scaling.type", gw.STRING, "yarn")
        w.add(arch + ".rope.scaling.factor", F32V, y["factor"])
        w.add(arch + ".rope.scaling.original_context_length", U32,
              y["original_max_position_embeddings"])
        w.add(arch + ".rope.scaling.yarn_log_multiplier", F32V, 0.1 * y.get("mscale_all_dim", 0))


def add_gpt_oss_keys(w, arch, cfg, head_dim):
    """As llama.cpp's GptOssModel; swiglu_clamp_exp only when the clamp is
    not the 7 llama.cpp's graph fixes."""
    U32, F32V = gw.UINT32, gw.FLOAT32
    w.add(arch + ".expert_feed_forward_length", U32, cfg["intermediate_size"])
    w.add(arch + ".attention.key_length", U32, head_dim)
    w.add(arch + ".attention.value_length", U32, head_dim)
    w.add(arch + ".attention.sliding_window", U32, cfg["sliding_window"])
    if cfg.get("swiglu_limit", 7.0) != 7.0:
        w.add(arch + ".swiglu_clamp_exp", F32V, cfg["swiglu_limit"])
    y = cfg.get("rope_scaling") or {}
    if y.get("rope_type", y.get("type")) == "yarn":
        w.add(arch + ".rope.scaling.type", gw.STRING, "yarn")
        w.add(arch + ".rope.scaling.factor", F32V, y["factor"])
        w.add(arch + ".rope.scaling.original_context_length", U32,
              y.get("original_max_position_embeddings", 4096))


def mxfp4_to_ggml(blocks, scales):
    """HF MXFP4 `_blocks` [..., G, 16] (byte b: weight 2b in the low nibble,
    2b + 1 in the high one) and `_scales` [..., G] (E8M0) as ggml's
    block_mxfp4 rows [..., G * 17]: per group the exponent byte, then 16
    bytes where byte j holds weight j (low) and j + 16 (high). Only bits
    move (llama.cpp's GptOssModel.transform_nibble_layout): the 4-bit codes
    and exponents are the checkpoint's."""
    import numpy as np
    codes = np.stack((blocks & 0x0F, blocks >> 4), axis=-1).reshape(blocks.shape[:-1] + (32,))
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    out = np.concatenate((scales[..., None], qs), axis=-1)
    return np.ascontiguousarray(out.reshape(blocks.shape[:-2] + (blocks.shape[-2] * 17,)))


def split_fused_experts(tensors, moe, mxfp4):
    """gpt_oss's fused experts (model_desc.h) as llama.cpp splits them: per
    layer and projection a stack [E, out, in] (and biases [E, out]), gate
    from the even columns of gate_up_proj (the even rows of an MXFP4
    gate_up_proj_blocks), up from the odd ones. Float weights keep their
    dtype; MXFP4 ones (`mxfp4`: config.json's quantization_config) become
    ggml MXFP4 (mxfp4_to_ggml) and their biases F32, as llama.cpp writes
    every 1-D tensor. Yields (layer, GGUF tensor name, ggml type, shape,
    bytes); numpy does the slicing."""
    import numpy as np
    np_dtype = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "U8": "u1"}

    def array(name):
        dtype, shape, data = tensors[name]
        return np.frombuffer(data, dtype=np_dtype[dtype]).reshape(shape)

    for name in sorted(tensors):
        parts = name.split(".")
        if len(parts) != 6 or parts[3] != moe or parts[4] != "experts":
            continue
        layer, what = int(parts[2]), parts[5]
        dtype, shape, data = tensors[name]
        if what in ("gate_up_proj_scales", "down_proj_scales"):
            continue  # with their _blocks
        if what in ("gate_up_proj_blocks", "down_proj_blocks"):  # [E, out, in / 32, 16]
            scales = name[:-len("_blocks")] + "_scales"
            if scales not in tensors:
                sys.exit("hf_to_gguf.py: %s has no %s" % (name, scales))
            a, s = array(name), array(scales)
            stacks = ([("ffn_gate", a[:, ::2], s[:, ::2]), ("ffn_up", a[:, 1::2], s[:, 1::2])]
                      if what == "gate_up_proj_blocks" else [("ffn_down", a, s)])
            for kind, b, bs in stacks:
                yield (layer, "%s_exps.weight" % kind, gw.MXFP4,
                       [b.shape[0], b.shape[1], b.shape[2] * 32], mxfp4_to_ggml(b, bs).tobytes())
            continue
        ggml_type = DTYPES[dtype][0]
        if mxfp4 and what.endswith("_bias"):
            a, ggml_type = as_float64(dtype, shape, data).astype("<f4"), gw.F32
        else:
            a = array(name)
        if what == "gate_up_proj":  # [E, H, 2I], x @ W
            for kind, part in (("ffn_gate", a[:, :, ::2]), ("ffn_up", a[:, :, 1::2])):
                b = np.ascontiguousarray(part.transpose(0, 2, 1))
                yield layer, "%s_exps.weight" % kind, ggml_type, list(b.shape), b.tobytes()
        elif what == "down_proj":  # [E, I, H]
            b = np.ascontiguousarray(a.transpose(0, 2, 1))
            yield layer, "ffn_down_exps.weight", ggml_type, list(b.shape), b.tobytes()
        elif what == "gate_up_proj_bias":  # [E, 2I]
            for kind, part in (("ffn_gate", a[:, ::2]), ("ffn_up", a[:, 1::2])):
                b = np.ascontiguousarray(part)
                yield layer, "%s_exps.bias" % kind, ggml_type, list(b.shape), b.tobytes()
        elif what == "down_proj_bias":
            yield layer, "ffn_down_exps.bias", ggml_type, shape, a.tobytes()
        else:
            sys.exit("hf_to_gguf.py: %s is not converted" % name)


def split_kv_b(shape, data, cfg, dtype):
    """Newer llama.cpp converters' attn_k_b (k_b transposed, [H, rank, nope])
    and attn_v_b ([H, v, rank]) in place of kv_b_proj [H*(nope+v), rank]."""
    import numpy as np
    heads, nope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    a = np.frombuffer(data, dtype={"F32": "<f4", "F16": "<f2", "BF16": "<u2"}[dtype])
    a = a.reshape(heads, nope + v, shape[1])
    k_b = np.ascontiguousarray(a[:, :nope, :].transpose(0, 2, 1))
    v_b = np.ascontiguousarray(a[:, nope:, :])
    return [("attn_k_b.weight", list(k_b.shape), k_b.tobytes()),
            ("attn_v_b.weight", list(v_b.shape), v_b.tobytes())]


def main():
    args, expert_type, dense_type, overrides = parse_args()
    src, dst = args.src, args.dst
    quant = Quantizer(expert_type, dense_type, args.dequantized is not None, overrides)
    cfg = json.load(open(os.path.join(src, "config.json")))
    tensors = read_safetensors(os.path.join(src, "model.safetensors"))
    family = cfg["model_type"]
    if family not in FAMILIES:
        sys.exit("hf_to_gguf.py: family %s is not converted" % family)
    arch, moe, experts_key, proj = FAMILIES[family]
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        sys.exit("hf_to_gguf.py: dense layers (mlp_only_layers, decoder_sparse_step) have "
                 "no GGUF form in llama.cpp's %s" % arch)
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    if arch == "deepseek2":
        kv_heads = 1  # llama.cpp's MQA view of latent attention
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    n_exp = cfg[experts_key]
    # llama.cpp's glm4moe counts the nextn (MTP) layers in block_count.
    blocks = cfg["num_hidden_layers"] + (cfg.get("num_nextn_predict_layers") or 0)

    w = gw.GGUFWriter(version=3)
    U32, F32V = gw.UINT32, gw.FLOAT32
    w.add("general.architecture", gw.STRING, arch)
    w.add(arch + ".embedding_length", U32, cfg["hidden_size"])
    w.add(arch + ".block_count", U32, blocks)
    w.add(arch + ".attention.head_count", U32, heads)
    w.add(arch + ".attention.head_count_kv", U32, kv_heads)
    w.add(arch + ".expert_count", U32, n_exp)
    w.add(arch + ".expert_used_count", U32, cfg["num_experts_per_tok"])
    w.add(arch + ".feed_forward_length", U32, cfg["intermediate_size"])
    w.add(arch + ".context_length", U32, cfg["max_position_embeddings"])
    w.add(arch + ".attention.layer_norm_rms_epsilon", F32V, cfg["rms_norm_eps"])
    w.add(arch + ".rope.freq_base", F32V, cfg.get("rope_theta", 10000.0))
    w.add(arch + ".vocab_size", U32, cfg["vocab_size"])
    add_arch_keys(w, arch, cfg, head_dim)
    for key, gkey in (("bos_token_id", "tokenizer.ggml.bos_token_id"),
                      ("eos_token_id", "tokenizer.ggml.eos_token_id")):
        v = cfg.get(key)
        if isinstance(v, list):
            v = v[0] if v else None
        if v is not None:
            w.add(gkey, U32, v)

    tok_path = os.path.join(src, "tokenizer.json")
    if os.path.exists(tok_path):
        add_tokenizer(w, tok_path)

    def add(name, ggml_type, shape, data):
        if name not in args.drop:
            w.add_tensor(name, ggml_type, list(reversed(shape)), data)

    simple = {"model.embed_tokens.weight": "token_embd.weight",
              "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}
    layer_names = dict(LAYER_NAMES)
    for r in ROUTERS:
        layer_names[moe + "." + r] = ("ffn_gate_inp.weight" if r == "gate.weight"
                                      else "ffn_gate_inp_shexp.weight")
    layer_names.update(ARCH_LAYER_NAMES.get(arch, {}))
    stacks = {}
    qkv = {}  # (layer, "weight" | "bias") -> {"attn_q": (type, shape, bytes), ...}
    if arch == "gpt-oss":
        if expert_type is not None:
            sys.exit("hf_to_gguf.py: gpt_oss experts are not requantized (--experts)")
        mxfp4 = (cfg.get("quantization_config") or {}).get("quant_method") == "mxfp4"
        for layer, gname, ggml_type, shape, data in split_fused_experts(tensors, moe, mxfp4):
            add("blk.%d.%s" % (layer, gname), ggml_type, shape, data)
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        if name in simple:
            t, raw = quant.convert(name, "dense", dtype, shape, data)
            add(simple[name], t, shape, raw)
            continue
        parts = name.split(".")
        layer, rest = int(parts[2]), ".".join(parts[3:])
        if arch == "gpt-oss" and len(parts) == 6 and parts[4] == "experts":
            continue  # split_fused_experts
        if args.split_kv_b and rest == "self_attn.kv_b_proj.weight":
            for gname, shape2, raw in split_kv_b(shape, data, cfg, dtype):
                add("blk.%d.%s" % (layer, gname), DTYPES[dtype][0], shape2, raw)
            continue
        if rest in layer_names:
            kind = "router" if rest[len(moe) + 1:] in ROUTERS else "dense"
            t, raw = quant.convert(name, kind, dtype, shape, data)
            if arch == "llama" and rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
                h = heads if "q_proj" in rest else kv_heads
                raw = permute_rows(raw, shape[0], h, len(raw) // shape[0])
            gname = layer_names[rest]
            if args.fuse_qkv and gname.split(".")[0] in ("attn_q", "attn_k", "attn_v"):
                qkv.setdefault((layer, gname.split(".")[1]), {})[gname.split(".")[0]] = (t, shape, raw)
                continue
            add("blk.%d.%s" % (layer, gname), t, shape, raw)
            continue
        if len(parts) != 8 or parts[4] != "experts":
            sys.exit("hf_to_gguf.py: no GGUF name for %s" % name)
        # model.layers.N.<moe>.experts.E.<proj>.weight
        e, p = int(parts[5]), parts[6]
        stacked = "blk.%d.%s_exps.weight" % (layer, proj[p])
        t, raw = quant.convert(name, "experts", dtype, shape, data, stacked)
        stacks.setdefault((layer, proj[p]), {})[e] = (t, shape, raw)
    for (layer, what), parts in sorted(qkv.items()):
        if sorted(parts) != ["attn_k", "attn_q", "attn_v"] or len({p[0] for p in parts.values()}) != 1:
            sys.exit("hf_to_gguf.py: layer %d's q, k, v %s are not all there in one type; not fused"
                     % (layer, what))
        rows = sum(parts[k][1][0] for k in ("attn_q", "attn_k", "attn_v"))
        data = b"".join(parts[k][2] for k in ("attn_q", "attn_k", "attn_v"))
        add("blk.%d.attn_qkv.%s" % (layer, what), parts["attn_q"][0],
            [rows] + parts["attn_q"][1][1:], data)
    for (layer, kind), by_expert in sorted(stacks.items()):
        t, shape, _ = by_expert[0]
        if args.fuse_gate_up_exps and kind in ("ffn_gate", "ffn_up"):
            if kind == "ffn_up":
                continue  # with ffn_gate
            up = stacks[(layer, "ffn_up")]
            if up[0][0] != t:
                sys.exit("hf_to_gguf.py: layer %d's gate and up differ in type; not fused" % layer)
            data = b"".join(by_expert[e][2] + up[e][2] for e in range(n_exp))
            add("blk.%d.ffn_gate_up_exps.weight" % layer, t, [n_exp, 2 * shape[0]] + shape[1:], data)
            continue
        data = b"".join(by_expert[e][2] for e in range(n_exp))
        add("blk.%d.%s_exps.weight" % (layer, kind), t, [n_exp] + shape, data)
    w.write(dst)
    if args.dequantized:
        quant.write_folder(src, args.dequantized)


if __name__ == "__main__":
    main()
