"""float64 reference forward pass of gpt_oss (imported by moe_reference.py).

Read from Hugging Face transformers (huggingface/transformers on GitHub):
models/gpt_oss/modeling_gpt_oss.py (commit 00d4b3d2),
models/gpt_oss/configuration_gpt_oss.py (commit 02b8f42b),
modeling_rope_utils.py (_compute_yarn_parameters), masking_utils.py
(sliding_window_overlay) and integrations/mxfp4.py
(convert_moe_packed_tensors):

* Config defaults: num_local_experts 128, num_experts_per_tok 4,
  intermediate_size 2880, head_dim 64, num_key_value_heads 8,
  sliding_window 128, rms_norm_eps 1e-5, rope_theta 150000,
  attention_bias True, tie_word_embeddings False, layer_types
  "sliding_attention" if (i + 1) % 2 else "full_attention"; without
  rope_scaling / rope_parameters: yarn {factor 32, beta_fast 32,
  beta_slow 1, truncate False, original_max_position_embeddings 4096}.
  swiglu_limit 7.0 (the MXFP4 experts read config.swiglu_limit; the eager
  GptOssExperts of 00d4b3d2 hard-codes 7.0, which equals every published
  config; we read the field), alpha 1.702.
* Rope: YaRN inverse frequencies of _compute_yarn_parameters (dim =
  head_dim): pos_freqs = theta^(arange(0, d, 2)/d); low/high =
  find_correction_range(beta_fast, beta_slow) with corr(r) =
  d ln(L / (2 pi r)) / (2 ln theta), floored/ceiled only when truncate,
  clamped to [0, d - 1]; ramp = clamp((i - low) / (high - low), 0, 1) over
  d/2; inv_freq = interp * ramp + extrap * (1 - ramp) (interp = extrap /
  factor); cos/sin times attention_factor = 0.1 ln(factor) + 1.
  Applied half-split: _apply_rotary_emb chunks x into halves (x1, x2) and
  returns cat(x1 cos - x2 sin, x2 cos + x1 sin) with cos/sin of d/2.
* Attention: q/k/v/o with biases; scores q k^T * head_dim^-0.5 (repeat_kv
  for GQA), causal mask plus, on sliding layers, sliding_window_overlay
  (kv_idx > q_idx - window: exactly `window` keys); the per-head sink
  logit (self_attn.sinks, not scaled) joins each row's softmax and its
  column is dropped afterwards (eager_attention_forward).
* Router: logits = x W^T + b; top-k of the logits (descending; ties to the
  lower index here); softmax over those k.
* Experts: gate_up = x @ gate_up_proj[e] + gate_up_proj_bias[e] (gate_up_proj
  [E, H, 2I]); gate = gate_up[..., ::2], up = gate_up[..., 1::2];
  gate = min(gate, limit), up = clamp(up, -limit, limit);
  glu = gate * sigmoid(alpha * gate); out = ((up + 1) * glu) @ down_proj[e]
  + down_proj_bias[e]; the block output sums routing weight * out.
* MXFP4: X_blocks [..., G, 16] uint8 and X_scales [..., G]: low nibble is
  element 2j, high nibble 2j + 1, FP4 E2M1 table [0, .5, 1, 1.5, 2, 3, 4, 6,
  -0, -.5, ..., -6], times 2^(scale - 127) (ldexp); the [..., rows, G*32]
  result is transposed on its last two axes into X [E, cols, rows].
* Decoder layer as the other families; final model.norm, lm_head.
"""

import math

import numpy as np

FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float64)


def dequantize_mxfp4(blocks, scales):
    """convert_moe_packed_tensors in float64: [E, rows, G, 16] + [E, rows, G]
    -> [E, G*32, rows]."""
    b = blocks.astype(np.uint8)
    s = scales.astype(np.int64) - 127
    if b.shape[:-1] != s.shape:
        raise ValueError("MXFP4 blocks %s do not match scales %s" % (b.shape, s.shape))
    out = np.empty(b.shape[:-1] + (b.shape[-1] * 2,), dtype=np.float64)
    out[..., 0::2] = FP4[b & 0x0F]
    out[..., 1::2] = FP4[b >> 4]
    out = np.ldexp(out, s[..., None])
    e, rows, g, _ = b.shape
    return out.reshape(e, rows, g * 32).transpose(0, 2, 1)


def dequantize_checkpoint(weights):
    """Replaces every X_blocks / X_scales pair by the dequantized X."""
    for name in [k for k in weights if k.endswith("_blocks")]:
        base = name[:-len("_blocks")]
        if base + "_scales" not in weights:
            raise ValueError("%s has no %s_scales" % (name, base))
        weights[base] = dequantize_mxfp4(weights.pop(name), weights.pop(base + "_scales"))
    return weights


def softmax(x):
    z = x - np.max(x, axis=-1, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=-1, keepdims=True)


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


class GptOssConfig:
    def __init__(self, d):
        def get(key, default):
            v = d.get(key)
            return default if v is None else v

        self.family = "gpt_oss"
        self.hidden = d["hidden_size"]
        self.layers = get("num_hidden_layers", 36)
        self.heads = get("num_attention_heads", 64)
        self.kv_heads = get("num_key_value_heads", 8)
        self.head_dim = get("head_dim", 64)
        self.vocab = get("vocab_size", 201088)
        self.inter = get("intermediate_size", 2880)
        self.num_experts = get("num_local_experts", 128)
        self.top_k = get("num_experts_per_tok", 4)
        self.eps = get("rms_norm_eps", 1e-5)
        self.tie = bool(get("tie_word_embeddings", False))
        self.window = d.get("sliding_window", 128)
        types = d.get("layer_types") or [
            "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(self.layers)]
        self.sliding = [t == "sliding_attention" for t in types]
        if not get("attention_bias", True):
            raise NotImplementedError("attention_bias false")
        self.limit = float(get("swiglu_limit", 7.0))
        self.alpha = float(get("swiglu_alpha", 1.702))
        rope = d.get("rope_scaling") or d.get("rope_parameters")
        if rope is None:
            rope = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                    "truncate": False, "original_max_position_embeddings": 4096}
        self.rope_theta = float(get("rope_theta", rope.get("rope_theta", 150000.0)))
        rtype = rope.get("rope_type", rope.get("type", "default"))
        if rtype not in ("yarn", "default"):
            raise NotImplementedError("rope type %r" % rtype)
        self.yarn = rope if rtype == "yarn" else None
        self.max_pos = get("max_position_embeddings", 131072)

    def is_sparse(self, i):
        return True


class GptOssModel:
    def __init__(self, cfg, weights):
        self.cfg = cfg
        self.w = dequantize_checkpoint(weights)
        self.embed = self._get("model.embed_tokens.weight")
        self.lm_head = self.embed if cfg.tie else self._get("lm_head.weight")
        self.moe_layers = list(range(cfg.layers))
        for i in range(cfg.layers):
            self._layer(i)

    def _get(self, name):
        if name not in self.w:
            raise KeyError("tensor %s is missing from the checkpoint" % name)
        return self.w[name]

    def _layer(self, i):
        p, g = "model.layers.%d." % i, self._get
        lw = {"in_norm": g(p + "input_layernorm.weight"),
              "post_norm": g(p + "post_attention_layernorm.weight"),
              "sinks": g(p + "self_attn.sinks"),
              "router": g(p + "mlp.router.weight"), "router_b": g(p + "mlp.router.bias")}
        for n in ("q", "k", "v", "o"):
            lw[n] = g(p + "self_attn.%s_proj.weight" % n)
            lw[n + "_b"] = g(p + "self_attn.%s_proj.bias" % n)
        x = p + "mlp.experts."
        for n in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"):
            lw[n] = g(x + n)
        return lw

    def new_cache(self):
        return [{"k": None, "v": None} for _ in range(self.cfg.layers)]

    def rope(self, positions):
        c = self.cfg
        d, base = c.head_dim, c.rope_theta
        pos_freqs = base ** (np.arange(0, d, 2, dtype=np.float64) / d)
        inv_freq = 1.0 / pos_freqs
        scale = 1.0
        if c.yarn is not None:
            y = c.yarn
            factor = float(y.get("factor", 1.0))
            length = float(y.get("original_max_position_embeddings") or c.max_pos)

            def corr(rot):
                return d * math.log(length / (rot * 2 * math.pi)) / (2 * math.log(base))

            low, high = corr(float(y.get("beta_fast", 32))), corr(float(y.get("beta_slow", 1)))
            if y.get("truncate", True):
                low, high = math.floor(low), math.ceil(high)
            low, high = max(low, 0), min(high, d - 1)
            if low == high:
                high += 0.001
            ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
            extra_factor = 1.0 - ramp
            inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extra_factor) + inv_freq * extra_factor
            scale = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
        freqs = positions.astype(np.float64)[:, None] * inv_freq[None, :]
        return np.cos(freqs) * scale, np.sin(freqs) * scale

    @staticmethod
    def _rotate(x, cos, sin):  # x [T, heads, d], cos/sin [T, d/2]
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)

    def attention(self, lw, x, cache, cos, sin, pos0, sliding):
        c = self.cfg
        t = x.shape[0]
        q = (x @ lw["q"].T + lw["q_b"]).reshape(t, c.heads, c.head_dim)
        k = (x @ lw["k"].T + lw["k_b"]).reshape(t, c.kv_heads, c.head_dim)
        v = (x @ lw["v"].T + lw["v_b"]).reshape(t, c.kv_heads, c.head_dim)
        q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        cache["k"] = k if cache["k"] is None else np.concatenate([cache["k"], k], axis=0)
        cache["v"] = v if cache["v"] is None else np.concatenate([cache["v"], v], axis=0)
        keys, vals = cache["k"], cache["v"]
        qpos = pos0 + np.arange(t)[:, None]
        kpos = np.arange(keys.shape[0])[None, :]
        allowed = kpos <= qpos
        if sliding and c.window:
            allowed &= kpos > qpos - c.window
        rep = c.heads // c.kv_heads
        out = np.empty((t, c.heads, c.head_dim))
        for h in range(c.heads):
            scores = (q[:, h, :] @ keys[:, h // rep, :].T) * c.head_dim ** -0.5
            scores = np.where(allowed, scores, -np.inf)
            combined = np.concatenate([scores, np.full((t, 1), lw["sinks"][h])], axis=-1)
            probs = softmax(combined)[:, :-1]
            out[:, h, :] = probs @ vals[:, h // rep, :]
        return out.reshape(t, c.heads * c.head_dim) @ lw["o"].T + lw["o_b"]

    def expert(self, lw, e, x):
        c = self.cfg
        gate_up = x @ lw["gate_up_proj"][e] + lw["gate_up_proj_bias"][e]
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        gate = np.minimum(gate, c.limit)
        up = np.clip(up, -c.limit, c.limit)
        glu = gate * sigmoid(gate * c.alpha)
        return ((up + 1) * glu) @ lw["down_proj"][e] + lw["down_proj_bias"][e]

    def moe(self, lw, x):
        c = self.cfg
        logits = x @ lw["router"].T + lw["router_b"]
        out = np.zeros_like(x)
        chosen = []
        for t in range(x.shape[0]):
            order = np.argsort(-logits[t], kind="stable")[:c.top_k]
            weights = softmax(logits[t, order])
            for e, wgt in zip(order, weights):
                out[t] += wgt * self.expert(lw, e, x[t])
            chosen.append([int(e) for e in order])
        return out, chosen

    def forward(self, ids, cache):
        c = self.cfg
        ids = np.asarray(ids, dtype=np.int64)
        if ids.min() < 0 or ids.max() >= self.embed.shape[0]:
            raise ValueError("token id out of range")
        pos0 = 0 if cache[0]["k"] is None else cache[0]["k"].shape[0]
        cos, sin = self.rope(pos0 + np.arange(len(ids)))
        x = self.embed[ids]
        routing = [[] for _ in ids]
        for i in range(c.layers):
            lw = self._layer(i)
            x = x + self.attention(lw, rms_norm(x, lw["in_norm"], c.eps), cache[i], cos, sin,
                                   pos0, c.sliding[i])
            y, chosen = self.moe(lw, rms_norm(x, lw["post_norm"], c.eps))
            x = x + y
            for t, experts in enumerate(chosen):
                routing[t].append(experts)
        x = rms_norm(x, self._get("model.norm.weight"), c.eps)
        return x @ self.lm_head.T, routing
