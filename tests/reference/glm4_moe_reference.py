"""float64 reference forward pass of glm4_moe (GLM-4.5, GLM-4.5-Air),
imported by moe_reference.py.

Read from Hugging Face transformers (huggingface/transformers on GitHub):
models/glm4_moe/modeling_glm4_moe.py (commit a0699c97) and
models/glm4_moe/configuration_glm4_moe.py (commit c7ec229a):

* Config defaults: vocab_size 151552, hidden_size 4096, intermediate_size
  10944, num_hidden_layers 46, num_attention_heads 96, num_key_value_heads 8,
  partial_rotary_factor 0.5, rms_norm_eps 1e-5, rope_theta 10000,
  tie_word_embeddings False, attention_bias False, moe_intermediate_size
  1408, num_experts_per_tok 8, n_shared_experts 1, n_routed_experts 128,
  routed_scaling_factor 1.0, n_group 1, topk_group 1, first_k_dense_replace
  1, norm_topk_prob True, use_qk_norm False. head_dim: config.head_dim if
  present, else hidden_size // num_attention_heads (Glm4MoeAttention's
  getattr). Only the default rope; num_nextn_predict_layers' extra layers
  (model.layers.N..) are never run.
* Decoder layer i: x += o_proj(attn(input_layernorm(x))); x +=
  mlp(post_attention_layernorm(x)); mlp is Glm4MoeMLP (gate/up/down, silu,
  width intermediate_size) for i < first_k_dense_replace, else Glm4MoeMoE.
* Attention: q/k/v projections with bias when attention_bias (o_proj never
  has one); view to [.., heads, head_dim]; with use_qk_norm, q_norm/k_norm
  (RMSNorm over head_dim, eps rms_norm_eps) on every head; rope on the
  first rotary_dim = int(head_dim * partial_rotary_factor) values of each
  head, rotate_half style within them (q_rot * cos + rotate_half(q_rot) *
  sin, the rest passed through), inv_freq = 1 / theta^(arange(0, rd, 2) /
  rd), emb = cat(freqs, freqs); causal softmax(q k^T * head_dim^-0.5) over
  repeat_kv'd keys/values.
* Router (Glm4MoeTopkRouter): logits = x W^T in float; scores =
  sigmoid(logits); choice = scores + e_score_correction_bias; group scores
  = sum of the 2 largest choices in each of n_group groups; keep the
  topk_group best groups (others' choices set to 0.0); top-k of the
  choices (ties to the lower index here); weights = the chosen experts'
  scores (without the bias), divided by their sum + 1e-20 when
  norm_topk_prob, then times routed_scaling_factor.
* MoE output: sum of weight * expert(x) plus shared_experts(x), a
  Glm4MoeMLP of width moe_intermediate_size * n_shared_experts.
* Final model.norm, lm_head.
"""

import numpy as np


def _rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _mlp(x, gate, up, down):
    return (_silu(x @ gate.T) * (x @ up.T)) @ down.T


class Glm4MoeConfig:
    def __init__(self, d):
        def get(key, default):
            v = d.get(key)
            return default if v is None else v

        self.family = "glm4_moe"
        self.hidden = get("hidden_size", 4096)
        self.layers = get("num_hidden_layers", 46)
        self.heads = get("num_attention_heads", 96)
        self.kv_heads = get("num_key_value_heads", 8)
        self.head_dim = get("head_dim", self.hidden // self.heads)
        self.rotary_dim = int(self.head_dim * float(get("partial_rotary_factor", 0.5)))
        self.eps = float(get("rms_norm_eps", 1e-5))
        self.rope_theta = float(get("rope_theta", 10000.0))
        self.tie = bool(get("tie_word_embeddings", False))
        self.bias = bool(get("attention_bias", False))
        self.qk_norm = bool(get("use_qk_norm", False))
        self.num_experts = get("n_routed_experts", 128)
        self.top_k = get("num_experts_per_tok", 8)
        self.n_shared = get("n_shared_experts", 1)
        self.scale = float(get("routed_scaling_factor", 1.0))
        self.n_group = get("n_group", 1)
        self.topk_group = get("topk_group", 1)
        self.first_dense = get("first_k_dense_replace", 1)
        self.norm_topk = bool(get("norm_topk_prob", True))
        rope = d.get("rope_scaling")
        if rope is not None and rope.get("rope_type", rope.get("type", "default")) != "default":
            raise NotImplementedError("rope scaling %r" % rope)

    def is_sparse(self, i):
        return i >= self.first_dense


class Glm4MoeModel:
    def __init__(self, cfg, weights):
        self.cfg = cfg
        self.w = weights
        self.embed = self._get("model.embed_tokens.weight")
        self.lm_head = self.embed if cfg.tie else self._get("lm_head.weight")
        self.moe_layers = [i for i in range(cfg.layers) if cfg.is_sparse(i)]
        self.layer_weights = [self._layer(i) for i in range(cfg.layers)]

    def _get(self, name):
        if name not in self.w:
            raise KeyError("tensor %s is missing from the checkpoint" % name)
        return self.w[name]

    def _layer(self, i):
        c, p, g = self.cfg, "model.layers.%d." % i, self._get
        lw = {"in_norm": g(p + "input_layernorm.weight"),
              "post_norm": g(p + "post_attention_layernorm.weight")}
        for n in ("q", "k", "v", "o"):
            lw[n] = g(p + "self_attn.%s_proj.weight" % n)
        if c.bias:
            for n in ("q", "k", "v"):
                lw[n + "_b"] = g(p + "self_attn.%s_proj.bias" % n)
        if c.qk_norm:
            lw["q_norm"] = g(p + "self_attn.q_norm.weight")
            lw["k_norm"] = g(p + "self_attn.k_norm.weight")
        m = p + "mlp."
        proj = lambda q: tuple(g(q + n + ".weight") for n in ("gate_proj", "up_proj", "down_proj"))
        if not c.is_sparse(i):
            lw["dense"] = proj(m)
            return lw
        lw["router"] = g(m + "gate.weight")
        lw["score_bias"] = g(m + "gate.e_score_correction_bias")
        lw["experts"] = [proj(m + "experts.%d." % e) for e in range(c.num_experts)]
        lw["shared"] = proj(m + "shared_experts.")
        return lw

    def new_cache(self):
        return [{"k": None, "v": None} for _ in range(self.cfg.layers)]

    def _rope(self, x, positions):
        """x [T, heads, head_dim]: rotate_half rope on the first rotary_dim."""
        rd = self.cfg.rotary_dim
        inv_freq = 1.0 / (self.cfg.rope_theta ** (np.arange(0, rd, 2, dtype=np.float64) / rd))
        freqs = positions.astype(np.float64)[:, None] * inv_freq[None, :]
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
        rot, rest = x[..., :rd], x[..., rd:]
        half = rd // 2
        rotated = np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
        return np.concatenate([rot * cos + rotated * sin, rest], axis=-1)

    def _attention(self, lw, x, cache, positions):
        c = self.cfg
        t, d = x.shape[0], c.head_dim
        q = x @ lw["q"].T + lw.get("q_b", 0.0)
        k = x @ lw["k"].T + lw.get("k_b", 0.0)
        v = x @ lw["v"].T + lw.get("v_b", 0.0)
        q = q.reshape(t, c.heads, d)
        k = k.reshape(t, c.kv_heads, d)
        v = v.reshape(t, c.kv_heads, d)
        if c.qk_norm:
            q = _rms_norm(q, lw["q_norm"], c.eps)
            k = _rms_norm(k, lw["k_norm"], c.eps)
        q, k = self._rope(q, positions), self._rope(k, positions)
        cache["k"] = k if cache["k"] is None else np.concatenate([cache["k"], k])
        cache["v"] = v if cache["v"] is None else np.concatenate([cache["v"], v])
        keys, vals = cache["k"], cache["v"]
        rep = c.heads // c.kv_heads
        out = np.empty((t, c.heads, d))
        for h in range(c.heads):
            s = q[:, h, :] @ keys[:, h // rep, :].T * d ** -0.5
            s = s + np.where(np.arange(keys.shape[0])[None, :] > positions[:, None], -np.inf, 0.0)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            out[:, h, :] = (s / s.sum(axis=-1, keepdims=True)) @ vals[:, h // rep, :]
        return out.reshape(t, c.heads * d) @ lw["o"].T

    def _route(self, lw, x):
        c = self.cfg
        scores = 1.0 / (1.0 + np.exp(-(x @ lw["router"].T)))
        choice = scores + lw["score_bias"]
        per = c.num_experts // c.n_group
        ids, weights = [], []
        for t in range(x.shape[0]):
            groups = choice[t].reshape(c.n_group, per)
            group_score = np.sort(groups, axis=-1)[:, -2:].sum(axis=-1)
            keep = np.argsort(-group_score, kind="stable")[:c.topk_group]
            masked = np.zeros_like(groups)
            masked[keep] = groups[keep]
            order = np.argsort(-masked.reshape(-1), kind="stable")[:c.top_k]
            w = scores[t, order]
            if c.norm_topk:
                w = w / (w.sum() + 1e-20)
            ids.append(order)
            weights.append(w * c.scale)
        return ids, weights

    def _moe(self, lw, x):
        ids, weights = self._route(lw, x)
        out = _mlp(x, *lw["shared"])
        for t in range(x.shape[0]):
            for e, w in zip(ids[t], weights[t]):
                out[t] += w * _mlp(x[t:t + 1], *lw["experts"][e])[0]
        return out, [[int(e) for e in order] for order in ids]

    def forward(self, ids, cache):
        c = self.cfg
        ids = np.asarray(ids, dtype=np.int64)
        if ids.min() < 0 or ids.max() >= self.embed.shape[0]:
            raise ValueError("token id out of range")
        pos0 = 0 if cache[0]["k"] is None else cache[0]["k"].shape[0]
        positions = pos0 + np.arange(len(ids))
        x = self.embed[ids]
        routing = [[] for _ in ids]
        for i in range(c.layers):
            lw = self.layer_weights[i]
            x = x + self._attention(lw, _rms_norm(x, lw["in_norm"], c.eps), cache[i], positions)
            h = _rms_norm(x, lw["post_norm"], c.eps)
            if "dense" in lw:
                x = x + _mlp(h, *lw["dense"])
            else:
                y, chosen = self._moe(lw, h)
                x = x + y
                for t, experts in enumerate(chosen):
                    routing[t].append(experts)
        x = _rms_norm(x, self._get("model.norm.weight"), c.eps)
        return x @ self.lm_head.T, routing
