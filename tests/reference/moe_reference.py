#!/usr/bin/python3
"""Independent float64 reference forward pass for seven MoE families.

Run with /usr/bin/python3 (numpy only). Reads a Hugging Face model directory
(config.json plus model.safetensors, or model.safetensors.index.json and its
shards) and runs greedy generation in float64, printing one JSON object:

  moe_reference.py --model DIR --prompt-ids 1,2,3 --max-new-tokens N
                   [--top-logprobs K] [--dump-routing] [--eos-id ID]

  {"tokens": [...],                 # greedy tokens, N of them (fewer if --eos-id hit)
   "logprobs": [...],               # log-softmax (float64) of each chosen token
   "top_logprobs": [[[id, lp], ...], ...],   # K best per step, best first
   "routing": [[[e, ...], ...], ...],        # with --dump-routing: for every
                                    # position fed to the model (prompt, then
                                    # each generated token but the last), for
                                    # every MoE layer, the top-k experts in
                                    # descending router probability
   "moe_layers": [...]}             # indices of the layers in "routing"

What follows Hugging Face transformers, read from modeling_mixtral.py,
modeling_qwen2_moe.py, modeling_qwen3_moe.py, modeling_olmoe.py and the
matching configuration_*.py files:

* Safetensors: 8-byte little-endian header length, JSON header
  (dtype, shape, data_offsets relative to the data section), raw data.
  BF16 is widened exactly (uint16 << 16 viewed as float32), F16/F32/F64 too;
  everything is then float64. Sharded checkpoints through weight_map.
* FP8 block-scaled checkpoints (DeepSeek-V3 / Qwen3 FP8 layout, config
  quantization_config {quant_method fp8, fmt e4m3, weight_block_size
  [B0, B1]}): an F8_E4M3 weight W [out, in] (e4m3fn: bias 7, subnormals
  m * 2^-9, S.1111.111 NaN, no infinities) is W * scale_inv[r // B0, c // B1]
  with W.weight_scale_inv [ceil(out/B0), ceil(in/B1)]; the scales are then
  dropped. transformers dequantizes the same way (finegrained_fp8).
* Defaults when a key is absent from config.json: rms_norm_eps 1e-5
  (mixtral, olmoe) / 1e-6 (qwen2_moe, qwen3_moe); rope_theta 1e6 (mixtral) /
  1e4 (others), also read from rope_parameters.rope_theta (transformers v5);
  num_key_value_heads = num_attention_heads; head_dim = config.head_dim or
  hidden_size // num_attention_heads, except olmoe which always uses
  hidden_size // num_attention_heads; tie_word_embeddings False;
  norm_topk_prob False (qwen2_moe, qwen3_moe, olmoe); mixtral always
  renormalises its top-k; decoder_sparse_step 1; mlp_only_layers [];
  qkv_bias True (qwen2_moe: biases on q/k/v only, never on o_proj);
  attention_bias False (qwen3_moe, olmoe: bias on q/k/v/o when true);
  clip_qkv None (olmoe). hidden_act must be silu; only the default rope.
* RMSNorm: x * rsqrt(mean(x^2) + eps) * weight.
* Attention: q/k/v projections; qwen3_moe applies q_norm/k_norm (weight of
  size head_dim) to each head after the view to [.., heads, head_dim];
  olmoe applies q_norm (size hidden) and k_norm (size kv_heads*head_dim) to
  the whole projections before the view, then clamps q, k, v to
  [-clip_qkv, clip_qkv] when set. Rotary embedding: inv_freq =
  1 / theta^(arange(0, d, 2)/d), emb = cat(freqs, freqs),
  q*cos + rotate_half(q)*sin with rotate_half(x) = cat(-x2, x1). (HF computes
  cos/sin in float32; here float64.) Causal softmax(q k^T / sqrt(head_dim)),
  key/value head h // (heads / kv_heads) for query head h (repeat_kv);
  mixtral's sliding_window masks keys with q_pos - k_pos >= window.
  use_sliding_window for the qwen families is rejected (not implemented).
* MoE block: router logits = gate(x); softmax in float; top-k (descending,
  ties to the lower index); divide by the top-k sum when norm_topk_prob (or
  mixtral); sum of weight * down(silu(gate_proj(x)) * up_proj(x)) over the
  chosen experts (mixtral: w2(silu(w1 x) * w3 x)). qwen2_moe adds
  sigmoid(shared_expert_gate(x)) * shared_expert(x).
* Layer i of qwen2_moe/qwen3_moe is sparse iff i not in mlp_only_layers and
  num_experts > 0 and (i + 1) % decoder_sparse_step == 0; otherwise a dense
  SwiGLU MLP of intermediate_size. mixtral and olmoe layers are all sparse.
* Decoder layer: x += attn(input_layernorm(x)); x += mlp(post_attention_layernorm(x)).
  Final model.norm, then lm_head (the embedding matrix when
  tie_word_embeddings, whether or not lm_head.weight is stored).
  Greedy = argmax (first index on ties).
* Incremental decode with a float64 KV cache: the prompt in one pass, then
  one token per step.

DeepSeek (deepseek_v2, deepseek_v3), read from DeepSeek's own
modeling_deepseek.py and configuration_deepseek.py (the remote code shipped
with the Hugging Face repositories deepseek-ai/DeepSeek-V2-Lite and
deepseek-ai/DeepSeek-V3), checked against transformers'
models/deepseek_v2/modular_deepseek_v2.py (commit 000c33fd) and
models/deepseek_v3/modeling_deepseek_v3.py:

* Config defaults (transformers' configuration_deepseek_v2/v3.py):
  n_routed_experts 64 / 256, num_experts_per_tok None (a dense model:
  refused) / 8, moe_intermediate_size 1407 / 2048, n_shared_experts 2 / 1
  (null: none), first_k_dense_replace 0 / 3, moe_layer_freq 1,
  norm_topk_prob False / True, routed_scaling_factor 1.0 / 2.5, n_group and
  topk_group 1 / 8 and 4 (null: the default), scoring_func softmax / sigmoid,
  topk_method greedy / noaux_tc, q_lora_rank 1536 (explicit null: plain
  q_proj), kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64,
  v_head_dim 128, rms_norm_eps 1e-6, rope_theta 1e4.
* Layer i is MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0;
  dense layers are mlp.{gate,up,down}_proj of intermediate_size.
* Attention, the published (non-absorbed) way: q = q_proj(x) or
  q_b_proj(q_a_layernorm(q_a_proj(x))), viewed [T, H, nope + rope];
  kv_a_proj_with_mqa(x) splits into c_kv (kv_lora_rank) and k_pe (rope, one
  head shared by all); kv_b_proj(kv_a_layernorm(c_kv)) viewed [T, H, nope + v]
  splits into k_nope and the values. Rotary on q_pe and k_pe in the layout
  of modeling_deepseek.py's apply_rotary_pos_emb: view [d/2, 2], transpose
  (evens first, then odds), then x*cos + rotate_half(x)*sin with
  cos = cat(freqs, freqs). (transformers' v2 multiplies interleaved pairs as
  complex numbers instead; the same permutation of q_pe and k_pe leaves q.k
  unchanged, so both give the same attention; the engine rotates the pairs
  in place.) Keys = cat(k_nope, k_pe), queries = cat(q_nope, q_pe); full
  keys and values are cached here (the engine caches only c_kv and k_pe).
  softmax(q k^T * scale) v, causal; then o_proj.
* YaRN (rope_scaling type yarn; DeepseekV2YarnRotaryEmbedding): with
  d = qk_rope_head_dim, low = max(floor(cd(beta_fast)), 0),
  high = min(ceil(cd(beta_slow)), d - 1), cd(r) = d ln(L / (2 pi r)) / (2 ln
  theta), L = original_max_position_embeddings; mask_i = 1 - clamp((i - low)
  / (high - low), 0, 1) (high += 0.001 when equal); inv_freq =
  freq / factor * (1 - mask) + freq * mask; cos and sin times
  yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim), where
  yarn_mscale(s, m) = 1 if s <= 1 else 0.1 m ln(s) + 1. Softmax scale
  (nope + rope)^-0.5, times yarn_mscale(factor, mscale_all_dim)^2 when
  mscale_all_dim is set.
* Router (MoEGate): v2: scores = softmax(logits); greedy = top-k of scores;
  group_limited_greedy = groups ranked by their max score, the topk_group
  best kept, other experts' scores set to 0, then top-k; weights = the
  scores; if top_k > 1 and norm_topk_prob, divided by (sum + 1e-20), else
  multiplied by routed_scaling_factor. (transformers' v2 always multiplies
  and ignores norm_topk_prob; every published v2 config has it false, where
  the two agree.) v3: scores = sigmoid(logits); choice = scores +
  e_score_correction_bias; groups ranked by the sum of their two best
  choices; the other groups' choices set to 0; top-k of choice; weights =
  scores (no bias) of the chosen, divided by (sum + 1e-20) if top_k > 1
  and norm_topk_prob, then multiplied by routed_scaling_factor.
* MoE output: sum of weight * expert(x) plus shared_experts(x), a plain
  SwiGLU MLP of moe_intermediate_size * n_shared_experts (no gate).
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3")
DEEPSEEK = ("deepseek_v2", "deepseek_v3")

_DTYPES = {"F16": "<f2", "F32": "<f4", "F64": "<f8", "U8": "<u1"}  # U8: MXFP4


def _e4m3_table():
    out = np.zeros(256, dtype=np.float64)
    for b in range(256):
        e, m = (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = float("nan")
        elif e == 0:
            v = m * 2.0 ** -9
        else:
            v = (1.0 + m / 8.0) * 2.0 ** (e - 7)
        out[b] = -v if b & 0x80 else v
    return out


_E4M3 = _e4m3_table()
_SCALE_SUFFIX = "_scale_inv"


def _decode_tensor(dtype, shape, raw):
    count = int(np.prod(shape)) if shape else 1
    if dtype == "F8_E4M3":
        if len(raw) != count:
            raise ValueError("F8_E4M3 tensor size mismatch")
        arr = _E4M3[np.frombuffer(raw, dtype=np.uint8)]
    elif dtype == "BF16":
        if len(raw) != 2 * count:
            raise ValueError("BF16 tensor size mismatch")
        u16 = np.frombuffer(raw, dtype="<u2")
        arr = (u16.astype("<u4") << 16).view("<f4").astype(np.float64)
    elif dtype in _DTYPES:
        np_dtype = np.dtype(_DTYPES[dtype])
        if len(raw) != np_dtype.itemsize * count:
            raise ValueError("%s tensor size mismatch" % dtype)
        arr = np.frombuffer(raw, dtype=np_dtype).astype(np.float64)
    else:
        raise ValueError("unsupported safetensors dtype %s" % dtype)
    return arr.reshape(shape)


def read_safetensors(path):
    """Returns {name: float64 ndarray} of one .safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError("%s: too short for a safetensors file" % path)
    (header_len,) = struct.unpack("<Q", blob[:8])
    if 8 + header_len > len(blob):
        raise ValueError("%s: header length past end of file" % path)
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    data = memoryview(blob)[8 + header_len:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        if not 0 <= start <= end <= len(data):
            raise ValueError("%s: tensor %s out of bounds" % (path, name))
        out[name] = _decode_tensor(info["dtype"], list(info["shape"]), bytes(data[start:end]))
    return out


def apply_fp8_scales(weights, model_dir):
    """Multiplies every X by X_scale_inv (block-wise) and drops the scales."""
    scale_names = [k for k in weights if k.endswith(_SCALE_SUFFIX)]
    if not scale_names:
        return weights
    with open(os.path.join(model_dir, "config.json")) as f:
        q = json.load(f).get("quantization_config") or {}
    if q.get("quant_method") != "fp8" or q.get("fmt", "e4m3") != "e4m3":
        raise ValueError("block scales without an fp8 e4m3 quantization_config")
    b0, b1 = q["weight_block_size"]
    for sname in scale_names:
        name = sname[:-len(_SCALE_SUFFIX)]
        w, sc = weights[name], weights.pop(sname)
        rows, cols = w.shape
        if sc.shape != (-(-rows // b0), -(-cols // b1)):
            raise ValueError("%s: shape %s does not fit %s" % (sname, sc.shape, w.shape))
        full = np.repeat(np.repeat(sc, b0, axis=0), b1, axis=1)[:rows, :cols]
        weights[name] = w * full
    return weights


def load_weights(model_dir):
    return apply_fp8_scales(_load_raw_weights(model_dir), model_dir)


def _load_raw_weights(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        weights = {}
        for shard in sorted(set(weight_map.values())):
            weights.update(read_safetensors(os.path.join(model_dir, shard)))
        missing = [k for k in weight_map if k not in weights]
        if missing:
            raise ValueError("tensors listed in the index are missing: %s" % missing[:5])
        return weights
    return read_safetensors(os.path.join(model_dir, "model.safetensors"))


class Config:
    """The fields of config.json we use, with transformers' defaults."""

    def __init__(self, d):
        self.family = d.get("model_type")
        if self.family not in FAMILIES:
            raise ValueError("unsupported model_type %r" % self.family)
        fam = self.family
        if fam in DEEPSEEK:
            self._deepseek(d)
            return
        self.hidden = d["hidden_size"]
        self.layers = d["num_hidden_layers"]
        self.heads = d["num_attention_heads"]
        self.kv_heads = d.get("num_key_value_heads") or self.heads
        if fam == "olmoe":
            self.head_dim = self.hidden // self.heads
        else:
            self.head_dim = d.get("head_dim") or self.hidden // self.heads
        if self.heads % self.kv_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        self.vocab = d["vocab_size"]
        self.eps = d.get("rms_norm_eps", 1e-5 if fam in ("mixtral", "olmoe") else 1e-6)
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise NotImplementedError("rope type %r is not implemented" % rope_type)
        theta = d.get("rope_theta", rope.get("rope_theta"))
        self.rope_theta = float(theta if theta is not None else (1e6 if fam == "mixtral" else 1e4))
        if d.get("hidden_act", "silu") != "silu":
            raise NotImplementedError("hidden_act %r" % d.get("hidden_act"))
        self.tie = bool(d.get("tie_word_embeddings", False))
        self.sliding_window = None
        if fam == "mixtral":
            self.sliding_window = d.get("sliding_window")
        elif d.get("use_sliding_window", False):
            raise NotImplementedError("use_sliding_window is not implemented for %s" % fam)
        default_experts = {"mixtral": 8, "qwen2_moe": 60, "qwen3_moe": 128, "olmoe": 64}[fam]
        key = "num_local_experts" if fam == "mixtral" else "num_experts"
        self.num_experts = d.get(key, default_experts)
        default_topk = {"mixtral": 2, "qwen2_moe": 4, "qwen3_moe": 8, "olmoe": 8}[fam]
        self.top_k = d.get("num_experts_per_tok", default_topk)
        self.norm_topk = True if fam == "mixtral" else bool(d.get("norm_topk_prob", False))
        self.sparse_step = d.get("decoder_sparse_step", 1)
        self.mlp_only = list(d.get("mlp_only_layers") or [])
        self.qkv_bias = bool(d.get("qkv_bias", True)) if fam == "qwen2_moe" else (
            bool(d.get("attention_bias", False)) if fam in ("qwen3_moe", "olmoe") else False)
        self.o_bias = fam in ("qwen3_moe", "olmoe") and self.qkv_bias
        self.clip_qkv = d.get("clip_qkv") if fam == "olmoe" else None

    def _deepseek(self, d):
        v3 = self.family == "deepseek_v3"

        def get(key, default):
            v = d.get(key)
            return default if v is None else v

        self.hidden = d["hidden_size"]
        self.layers = d["num_hidden_layers"]
        self.heads = d["num_attention_heads"]
        self.vocab = d["vocab_size"]
        self.eps = get("rms_norm_eps", 1e-6)
        self.rope_theta = float(get("rope_theta", 1e4))
        if get("hidden_act", "silu") != "silu":
            raise NotImplementedError("hidden_act %r" % d.get("hidden_act"))
        if get("attention_bias", False):
            raise NotImplementedError("attention_bias")
        self.tie = bool(get("tie_word_embeddings", False))
        self.num_experts = get("n_routed_experts", 256 if v3 else 64)
        self.top_k = get("num_experts_per_tok", 8 if v3 else None)
        if self.top_k is None:
            raise ValueError("num_experts_per_tok is null: a dense model")
        self.moe_inter = get("moe_intermediate_size", 2048 if v3 else 1407)
        self.n_shared = (0 if "n_shared_experts" in d and d["n_shared_experts"] is None
                         else get("n_shared_experts", 1 if v3 else 2))
        self.first_dense = get("first_k_dense_replace", 3 if v3 else 0)
        self.moe_freq = get("moe_layer_freq", 1)
        self.norm_topk = bool(get("norm_topk_prob", v3))
        self.routed_scale = float(get("routed_scaling_factor", 2.5 if v3 else 1.0))
        self.n_group = get("n_group", 8 if v3 else 1)
        self.topk_group = get("topk_group", 4 if v3 else 1)
        self.scoring = get("scoring_func", "sigmoid" if v3 else "softmax")
        self.topk_method = get("topk_method", "noaux_tc" if v3 else "greedy")
        if self.topk_method == "gready":
            self.topk_method = "greedy"
        self.q_lora = (None if "q_lora_rank" in d and d["q_lora_rank"] is None
                       else get("q_lora_rank", 1536))
        self.kv_lora = get("kv_lora_rank", 512)
        self.nope = get("qk_nope_head_dim", 128)
        self.rope_dim = get("qk_rope_head_dim", 64)
        self.v_dim = get("v_head_dim", 128)
        self.qk_dim = self.nope + self.rope_dim
        self.sliding_window = None
        self.qkv_bias = self.o_bias = False
        self.clip_qkv = None
        rope = d.get("rope_scaling") or {}
        rope_type = rope.get("type", rope.get("rope_type", "default"))
        if rope_type not in ("default", "yarn"):
            raise NotImplementedError("rope type %r is not implemented" % rope_type)
        self.yarn = rope if rope_type == "yarn" else None

    def is_sparse(self, i):
        if self.family in DEEPSEEK:
            return i >= self.first_dense and i % self.moe_freq == 0
        if self.family in ("mixtral", "olmoe"):
            return True
        return (i not in self.mlp_only and self.num_experts > 0
                and (i + 1) % self.sparse_step == 0)


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))  # x * sigmoid(x), overflow-free


def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def softmax(x):
    z = x - np.max(x, axis=-1, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=-1, keepdims=True)


def log_softmax(x):
    z = x - np.max(x)
    return z - math.log(np.sum(np.exp(z)))


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def swiglu(x, gate, up, down):
    return (silu(x @ gate.T) * (x @ up.T)) @ down.T


class Model:
    def __init__(self, model_dir, config=None, weights=None):
        if config is None:
            with open(os.path.join(model_dir, "config.json")) as f:
                config = json.load(f)
        self.cfg = Config(config)
        self.w = weights if weights is not None else load_weights(model_dir)
        c = self.cfg
        self.embed = self._get("model.embed_tokens.weight")
        # Tied: transformers' tie_weights() makes lm_head the embedding matrix,
        # even when a checkpoint also stores lm_head.weight.
        self.lm_head = self.embed if c.tie else self._get("lm_head.weight")
        self.moe_layers = [i for i in range(c.layers) if c.is_sparse(i)]
        # Touch every tensor the forward pass needs, so a missing one fails now.
        for i in range(c.layers):
            self._layer_weights(i)

    def _get(self, name):
        if name not in self.w:
            raise KeyError("tensor %s is missing from the checkpoint" % name)
        return self.w[name]

    def _deepseek_layer_weights(self, i):
        c, p, g = self.cfg, "model.layers.%d." % i, self._get
        a = p + "self_attn."
        lw = {"in_norm": g(p + "input_layernorm.weight"),
              "post_norm": g(p + "post_attention_layernorm.weight"),
              "kv_a": g(a + "kv_a_proj_with_mqa.weight"),
              "kv_a_norm": g(a + "kv_a_layernorm.weight"),
              "kv_b": g(a + "kv_b_proj.weight"),
              "o": g(a + "o_proj.weight")}
        if c.q_lora is None:
            lw["q"] = g(a + "q_proj.weight")
        else:
            lw["q_a"] = g(a + "q_a_proj.weight")
            lw["q_a_norm"] = g(a + "q_a_layernorm.weight")
            lw["q_b"] = g(a + "q_b_proj.weight")
        if not c.is_sparse(i):
            lw["dense"] = tuple(g(p + "mlp.%s_proj.weight" % n) for n in ("gate", "up", "down"))
            return lw
        mp = p + "mlp."
        lw["router"] = g(mp + "gate.weight")
        if c.topk_method == "noaux_tc":
            lw["score_bias"] = g(mp + "gate.e_score_correction_bias")
        lw["experts"] = [tuple(g(mp + "experts.%d.%s_proj.weight" % (e, n))
                               for n in ("gate", "up", "down"))
                         for e in range(c.num_experts)]
        if c.n_shared > 0:
            lw["shared_experts"] = tuple(g(mp + "shared_experts.%s_proj.weight" % n)
                                         for n in ("gate", "up", "down"))
        return lw

    def _layer_weights(self, i):
        if self.cfg.family in DEEPSEEK:
            return self._deepseek_layer_weights(i)
        c, p, g = self.cfg, "model.layers.%d." % i, self._get
        lw = {"in_norm": g(p + "input_layernorm.weight"),
              "post_norm": g(p + "post_attention_layernorm.weight")}
        for n in ("q", "k", "v", "o"):
            lw[n] = g(p + "self_attn.%s_proj.weight" % n)
            has_bias = c.o_bias if n == "o" else c.qkv_bias
            lw[n + "_b"] = g(p + "self_attn.%s_proj.bias" % n) if has_bias else None
        if c.family in ("qwen3_moe", "olmoe"):
            lw["q_norm"] = g(p + "self_attn.q_norm.weight")
            lw["k_norm"] = g(p + "self_attn.k_norm.weight")
        if not c.is_sparse(i):
            lw["dense"] = tuple(g(p + "mlp.%s_proj.weight" % n) for n in ("gate", "up", "down"))
            return lw
        if c.family == "mixtral":
            mp = p + "block_sparse_moe."
            lw["router"] = g(mp + "gate.weight")
            lw["experts"] = [tuple(g(mp + "experts.%d.%s.weight" % (e, n))
                                   for n in ("w1", "w3", "w2"))
                             for e in range(c.num_experts)]
        else:
            mp = p + "mlp."
            lw["router"] = g(mp + "gate.weight")
            lw["experts"] = [tuple(g(mp + "experts.%d.%s_proj.weight" % (e, n))
                                   for n in ("gate", "up", "down"))
                             for e in range(c.num_experts)]
            if c.family == "qwen2_moe":
                lw["shared"] = tuple(g(mp + "shared_expert.%s_proj.weight" % n)
                                     for n in ("gate", "up", "down"))
                lw["shared_gate"] = g(mp + "shared_expert_gate.weight")
        return lw

    def new_cache(self):
        return [{"k": None, "v": None} for _ in range(self.cfg.layers)]

    def _deepseek_rope(self, positions):
        """cos, sin [T, rope_dim] (cat(freqs, freqs)), YaRN-scaled when set."""
        c = self.cfg
        d, base = c.rope_dim, c.rope_theta
        freq = 1.0 / (base ** (np.arange(0, d, 2, dtype=np.float64) / d))
        mscale = 1.0
        if c.yarn is not None:
            y = c.yarn
            factor = float(y.get("factor", 1.0))
            length = float(y.get("original_max_position_embeddings", 4096))

            def corr_dim(rot):
                return d * math.log(length / (rot * 2 * math.pi)) / (2 * math.log(base))

            def yarn_mscale(s, m):
                return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

            low = max(math.floor(corr_dim(float(y.get("beta_fast", 32)))), 0)
            high = min(math.ceil(corr_dim(float(y.get("beta_slow", 1)))), d - 1)
            if low == high:
                high += 0.001
            ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
            mask = 1.0 - ramp
            freq = freq / factor * (1.0 - mask) + freq * mask
            mscale = (yarn_mscale(factor, float(y.get("mscale", 1)))
                      / yarn_mscale(factor, float(y.get("mscale_all_dim", 0))))
        freqs = positions.astype(np.float64)[:, None] * freq[None, :]
        emb = np.concatenate([freqs, freqs], axis=-1)
        return np.cos(emb) * mscale, np.sin(emb) * mscale

    def _softmax_scale(self):
        c = self.cfg
        scale = c.qk_dim ** -0.5
        if c.yarn is not None and c.yarn.get("mscale_all_dim"):
            factor = float(c.yarn.get("factor", 1.0))
            m = 1.0 if factor <= 1 else 0.1 * float(c.yarn["mscale_all_dim"]) * math.log(factor) + 1
            scale *= m * m
        return scale

    def _mla_attention(self, lw, x, cache, cos, sin, pos0):
        c = self.cfg
        t, nh = x.shape[0], c.heads
        if "q" in lw:
            q = x @ lw["q"].T
        else:
            q = rms_norm(x @ lw["q_a"].T, lw["q_a_norm"], c.eps) @ lw["q_b"].T
        q = q.reshape(t, nh, c.qk_dim)
        q_nope, q_pe = q[..., :c.nope], q[..., c.nope:]
        ckv = x @ lw["kv_a"].T
        ckv, k_pe = ckv[:, :c.kv_lora], ckv[:, c.kv_lora:]
        kv = (rms_norm(ckv, lw["kv_a_norm"], c.eps) @ lw["kv_b"].T).reshape(t, nh, c.nope + c.v_dim)
        k_nope, v = kv[..., :c.nope], kv[..., c.nope:]

        def rotate(z):  # [T, heads, d]: evens then odds, then rotate_half
            z = np.concatenate([z[..., 0::2], z[..., 1::2]], axis=-1)
            return z * cos[:, None, :] + rotate_half(z) * sin[:, None, :]

        q_pe = rotate(q_pe)
        k_pe = rotate(k_pe[:, None, :])
        queries = np.concatenate([q_nope, q_pe], axis=-1)
        keys = np.concatenate([k_nope, np.broadcast_to(k_pe, (t, nh, c.rope_dim))], axis=-1)
        cache["k"] = keys if cache["k"] is None else np.concatenate([cache["k"], keys], axis=0)
        cache["v"] = v if cache["v"] is None else np.concatenate([cache["v"], v], axis=0)
        keys, vals = cache["k"], cache["v"]
        s = keys.shape[0]
        masked = np.arange(s)[None, :] > (pos0 + np.arange(t)[:, None])
        scale = self._softmax_scale()
        out = np.empty((t, nh, c.v_dim))
        for h in range(nh):
            scores = (queries[:, h, :] @ keys[:, h, :].T) * scale
            scores = np.where(masked, -np.inf, scores)
            out[:, h, :] = softmax(scores) @ vals[:, h, :]
        return out.reshape(t, nh * c.v_dim) @ lw["o"].T

    def _deepseek_route(self, lw, x):
        """(experts [T, k] in descending choice, weights [T, k])."""
        c = self.cfg
        logits = x @ lw["router"].T
        if c.scoring == "softmax":
            scores = softmax(logits)
        elif c.scoring == "sigmoid":
            scores = 1.0 / (1.0 + np.exp(-logits))
        else:
            raise NotImplementedError("scoring_func %r" % c.scoring)
        choice = scores + lw["score_bias"] if c.topk_method == "noaux_tc" else scores.copy()
        if c.topk_method in ("group_limited_greedy", "noaux_tc"):
            grouped = choice.reshape(x.shape[0], c.n_group, -1)
            if c.topk_method == "noaux_tc":
                group_scores = np.sort(grouped, axis=-1)[..., -2:].sum(axis=-1)
            else:
                group_scores = grouped.max(axis=-1)
            for t in range(x.shape[0]):
                keep = np.argsort(-group_scores[t], kind="stable")[:c.topk_group]
                drop = np.setdiff1d(np.arange(c.n_group), keep)
                grouped[t, drop, :] = 0.0
            choice = grouped.reshape(x.shape[0], -1)
        elif c.topk_method != "greedy":
            raise NotImplementedError("topk_method %r" % c.topk_method)
        ids, weights = [], []
        for t in range(x.shape[0]):
            order = np.argsort(-choice[t], kind="stable")[:c.top_k]
            w = scores[t, order]
            normalized = c.top_k > 1 and c.norm_topk
            if normalized:
                w = w / (np.sum(w) + 1e-20)
            if c.family == "deepseek_v3" or not normalized:
                w = w * c.routed_scale
            ids.append(order)
            weights.append(w)
        return ids, weights

    def _rope(self, positions):
        if self.cfg.family in DEEPSEEK:
            return self._deepseek_rope(positions)
        d = self.cfg.head_dim
        inv_freq = 1.0 / (self.cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
        freqs = positions.astype(np.float64)[:, None] * inv_freq[None, :]
        emb = np.concatenate([freqs, freqs], axis=-1)
        return np.cos(emb), np.sin(emb)

    def _attention(self, lw, x, cache, cos, sin, pos0):
        c = self.cfg
        if c.family in DEEPSEEK:
            return self._mla_attention(lw, x, cache, cos, sin, pos0)
        t = x.shape[0]
        q = x @ lw["q"].T
        k = x @ lw["k"].T
        v = x @ lw["v"].T
        if lw["q_b"] is not None:
            q, k, v = q + lw["q_b"], k + lw["k_b"], v + lw["v_b"]
        if c.family == "olmoe":
            q = rms_norm(q, lw["q_norm"], c.eps)
            k = rms_norm(k, lw["k_norm"], c.eps)
            if c.clip_qkv is not None:
                q, k, v = (np.clip(a, -c.clip_qkv, c.clip_qkv) for a in (q, k, v))
        q = q.reshape(t, c.heads, c.head_dim)
        k = k.reshape(t, c.kv_heads, c.head_dim)
        v = v.reshape(t, c.kv_heads, c.head_dim)
        if c.family == "qwen3_moe":
            q = rms_norm(q, lw["q_norm"], c.eps)
            k = rms_norm(k, lw["k_norm"], c.eps)
        q = q * cos[:, None, :] + rotate_half(q) * sin[:, None, :]
        k = k * cos[:, None, :] + rotate_half(k) * sin[:, None, :]
        cache["k"] = k if cache["k"] is None else np.concatenate([cache["k"], k], axis=0)
        cache["v"] = v if cache["v"] is None else np.concatenate([cache["v"], v], axis=0)
        keys, vals = cache["k"], cache["v"]  # [S, kv_heads, head_dim]
        s = keys.shape[0]
        qpos = pos0 + np.arange(t)[:, None]
        kpos = np.arange(s)[None, :]
        masked = kpos > qpos
        if c.sliding_window is not None:
            masked |= (qpos - kpos) >= c.sliding_window
        rep = c.heads // c.kv_heads
        out = np.empty((t, c.heads, c.head_dim))
        for h in range(c.heads):
            scores = (q[:, h, :] @ keys[:, h // rep, :].T) / math.sqrt(c.head_dim)
            scores = np.where(masked, -np.inf, scores)
            out[:, h, :] = softmax(scores) @ vals[:, h // rep, :]
        o = out.reshape(t, c.heads * c.head_dim) @ lw["o"].T
        if lw["o_b"] is not None:
            o = o + lw["o_b"]
        return o

    def _moe(self, lw, x):
        c = self.cfg
        if c.family in DEEPSEEK:
            ids, weights = self._deepseek_route(lw, x)
            out = np.zeros_like(x)
            for t in range(x.shape[0]):
                for e, wgt in zip(ids[t], weights[t]):
                    out[t] += wgt * swiglu(x[t], *lw["experts"][e])
            if "shared_experts" in lw:
                out += swiglu(x, *lw["shared_experts"])
            return out, [[int(e) for e in order] for order in ids]
        probs = softmax(x @ lw["router"].T)  # [T, E]
        out = np.zeros_like(x)
        chosen = []
        for t in range(x.shape[0]):
            order = np.argsort(-probs[t], kind="stable")[:c.top_k]
            weights = probs[t, order]
            if c.norm_topk:
                weights = weights / np.sum(weights)
            for e, wgt in zip(order, weights):
                out[t] += wgt * swiglu(x[t], *lw["experts"][e])
            chosen.append([int(e) for e in order])
        if "shared" in lw:
            out += sigmoid(x @ lw["shared_gate"].T) * swiglu(x, *lw["shared"])
        return out, chosen

    def forward(self, ids, cache):
        """Runs `ids` after what `cache` holds; returns (logits [T, V],
        routing [T][moe layer] -> experts)."""
        c = self.cfg
        ids = np.asarray(ids, dtype=np.int64)
        if ids.min() < 0 or ids.max() >= self.embed.shape[0]:
            raise ValueError("token id out of range")
        pos0 = 0 if cache[0]["k"] is None else cache[0]["k"].shape[0]
        cos, sin = self._rope(pos0 + np.arange(len(ids)))
        x = self.embed[ids]
        routing = [[] for _ in ids]
        for i in range(c.layers):
            lw = self._layer_weights(i)
            x = x + self._attention(lw, rms_norm(x, lw["in_norm"], c.eps), cache[i], cos, sin,
                                    pos0)
            h = rms_norm(x, lw["post_norm"], c.eps)
            if "dense" in lw:
                x = x + swiglu(h, *lw["dense"])
            else:
                y, chosen = self._moe(lw, h)
                x = x + y
                for t, experts in enumerate(chosen):
                    routing[t].append(experts)
        x = rms_norm(x, self._get("model.norm.weight"), c.eps)
        return x @ self.lm_head.T, routing


def load_model(model_dir):
    """Model, or the model of gpt_oss_reference / glm4_moe_reference for
    model_type gpt_oss / glm4_moe."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    if config.get("model_type") == "glm4_moe":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import glm4_moe_reference
        return glm4_moe_reference.Glm4MoeModel(glm4_moe_reference.Glm4MoeConfig(config),
                                               load_weights(model_dir))
    if config.get("model_type") == "gpt_oss":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gpt_oss_reference
        return gpt_oss_reference.GptOssModel(gpt_oss_reference.GptOssConfig(config),
                                             _load_raw_weights(model_dir))
    return Model(model_dir, config)


def generate(model, prompt_ids, max_new_tokens, top_logprobs=0, eos_id=None):
    cache = model.new_cache()
    logits, routing = model.forward(prompt_ids, cache)
    result = {"tokens": [], "logprobs": [], "top_logprobs": [], "routing": list(routing),
              "moe_layers": model.moe_layers}
    for step in range(max_new_tokens):
        lp = log_softmax(logits[-1])
        tok = int(np.argmax(lp))
        result["tokens"].append(tok)
        result["logprobs"].append(float(lp[tok]))
        if top_logprobs > 0:
            best = np.argsort(-lp, kind="stable")[:top_logprobs]
            result["top_logprobs"].append([[int(i), float(lp[i])] for i in best])
        if step + 1 == max_new_tokens or (eos_id is not None and tok == eos_id):
            break
        logits, r = model.forward([tok], cache)
        result["routing"].extend(r)
    return result


def score(model, ids):
    """Teacher-forced next-token negative log-likelihoods of `ids` (one
    prefill of the whole sequence): nll[i] = -log p(ids[i + 1] | ids[:i + 1])."""
    logits, _ = model.forward(ids, model.new_cache())
    nll = [-float(log_softmax(logits[i])[ids[i + 1]]) for i in range(len(ids) - 1)]
    return {"nll": nll, "mean_nll": float(np.mean(nll))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=0)
    ap.add_argument("--score", action="store_true",
                    help="print the teacher-forced NLL of --prompt-ids instead of generating")
    ap.add_argument("--top-logprobs", type=int, default=0)
    ap.add_argument("--dump-routing", action="store_true")
    ap.add_argument("--eos-id", type=int, default=None)
    args = ap.parse_args(argv)
    try:
        prompt = [int(s) for s in args.prompt_ids.split(",") if s.strip()]
    except ValueError:
        ap.error("--prompt-ids must be comma-separated integers")
    if not prompt:
        ap.error("--prompt-ids is empty")
    try:
        model = load_model(args.model)
    except (OSError, ValueError, KeyError, NotImplementedError) as e:
        sys.stderr.write("moe_reference: cannot load %s: %s\n" % (args.model, e))
        return 2
    if args.score:
        if len(prompt) < 2:
            ap.error("--score needs at least 2 ids")
        json.dump(score(model, prompt), sys.stdout)
        sys.stdout.write("\n")
        return 0
    if args.max_new_tokens < 1:
        ap.error("--max-new-tokens must be at least 1 (or give --score)")
    result = generate(model, prompt, args.max_new_tokens, args.top_logprobs, args.eos_id)
    if not args.dump_routing:
        del result["routing"], result["moe_layers"]
    if args.top_logprobs <= 0:
        del result["top_logprobs"]
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
