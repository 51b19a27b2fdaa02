#!/usr/bin/python3
"""Independent float64 reference forward pass for four MoE families.

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
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")

_DTYPES = {"F16": "<f2", "F32": "<f4", "F64": "<f8"}


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

    def is_sparse(self, i):
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

    def _layer_weights(self, i):
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

    def _rope(self, positions):
        d = self.cfg.head_dim
        inv_freq = 1.0 / (self.cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
        freqs = positions.astype(np.float64)[:, None] * inv_freq[None, :]
        emb = np.concatenate([freqs, freqs], axis=-1)
        return np.cos(emb), np.sin(emb)

    def _attention(self, lw, x, cache, cos, sin, pos0):
        c = self.cfg
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--max-new-tokens", type=int, required=True)
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
        model = Model(args.model)
    except (OSError, ValueError, KeyError, NotImplementedError) as e:
        sys.stderr.write("moe_reference: cannot load %s: %s\n" % (args.model, e))
        return 2
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
