#!/usr/bin/python3
"""Self-test of moe_reference.py (run with /usr/bin/python3; exits non-zero on
failure). Writes random tiny models of each family by hand (config.json and
safetensors) and checks properties that can fail."""

import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import moe_reference as ref  # noqa: E402


# ---------------------------------------------------------------- writing

def to_bf16_bits(a):
    """float64 -> bfloat16 bit patterns, rounding to nearest even."""
    u32 = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u32 + 0x7FFF + ((u32 >> 16) & 1)) >> 16).astype("<u2")


def round_bf16(a):
    return (to_bf16_bits(a).astype("<u4") << 16).view("<f4").astype(np.float64)


def write_safetensors(path, tensors, dtype="BF16"):
    """tensors: {name: float64 array}; dtype: one for all, or {name: dtype}."""
    header, chunks, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        a = np.asarray(tensors[name], dtype=np.float64)
        dt = dtype if isinstance(dtype, str) else dtype[name]
        raw = (to_bf16_bits(a) if dt == "BF16"
               else a.astype({"F16": "<f2", "F32": "<f4", "F64": "<f8"}[dt])).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    hbytes = json.dumps(header).encode()
    hbytes += b" " * (-len(hbytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)) + hbytes + b"".join(chunks))


def write_model(d, config, tensors, shards=1):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        return
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        fname = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        part = {n: tensors[n] for n in names[s::shards]}
        write_safetensors(os.path.join(d, fname), part)
        weight_map.update({n: fname for n in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


# ------------------------------------------------------------ tiny models

BASE = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 4, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False}

CONFIGS = {
    "mixtral": dict(BASE, model_type="mixtral", num_key_value_heads=2, intermediate_size=24,
                    num_local_experts=4, num_experts_per_tok=2, rope_theta=1e6),
    "qwen2_moe": dict(BASE, model_type="qwen2_moe", num_hidden_layers=3, num_key_value_heads=1,
                      intermediate_size=20, moe_intermediate_size=8,
                      shared_expert_intermediate_size=12, num_experts=6,
                      num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=1,
                      mlp_only_layers=[1], rope_theta=10000.0),
    "qwen3_moe": dict(BASE, model_type="qwen3_moe", num_key_value_heads=2, head_dim=8,
                      intermediate_size=20, moe_intermediate_size=8, num_experts=8,
                      num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=2,
                      rope_theta=1e6),
    "olmoe": dict(BASE, model_type="olmoe", num_key_value_heads=4, intermediate_size=12,
                  num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, clip_qkv=2.0,
                  tie_word_embeddings=True, rms_norm_eps=1e-5),
}


def make_tensors(config, seed):
    rng = np.random.default_rng(seed)
    c = ref.Config(config)
    t = {}

    def mat(name, rows, cols, scale=0.35):
        t[name] = round_bf16(rng.normal(0.0, scale, size=(rows, cols)))

    def vec(name, n, center=1.0, scale=0.1):
        t[name] = round_bf16(center + scale * rng.normal(size=n))

    h, hd = c.hidden, c.head_dim
    mat("model.embed_tokens.weight", c.vocab, h, 1.0)
    if not c.tie:
        mat("lm_head.weight", c.vocab, h)
    vec("model.norm.weight", h)
    for i in range(c.layers):
        p = "model.layers.%d." % i
        vec(p + "input_layernorm.weight", h)
        vec(p + "post_attention_layernorm.weight", h)
        mat(p + "self_attn.q_proj.weight", c.heads * hd, h)
        mat(p + "self_attn.k_proj.weight", c.kv_heads * hd, h)
        mat(p + "self_attn.v_proj.weight", c.kv_heads * hd, h)
        mat(p + "self_attn.o_proj.weight", h, c.heads * hd)
        if c.qkv_bias:
            vec(p + "self_attn.q_proj.bias", c.heads * hd, 0.0, 0.3)
            vec(p + "self_attn.k_proj.bias", c.kv_heads * hd, 0.0, 0.3)
            vec(p + "self_attn.v_proj.bias", c.kv_heads * hd, 0.0, 0.3)
        if c.family == "qwen3_moe":
            vec(p + "self_attn.q_norm.weight", hd)
            vec(p + "self_attn.k_norm.weight", hd)
        if c.family == "olmoe":
            vec(p + "self_attn.q_norm.weight", c.heads * hd)
            vec(p + "self_attn.k_norm.weight", c.kv_heads * hd)
        if not c.is_sparse(i):
            inter = config["intermediate_size"]
            mat(p + "mlp.gate_proj.weight", inter, h)
            mat(p + "mlp.up_proj.weight", inter, h)
            mat(p + "mlp.down_proj.weight", h, inter)
            continue
        if c.family == "mixtral":
            inter = config["intermediate_size"]
            mp = p + "block_sparse_moe."
            mat(mp + "gate.weight", c.num_experts, h, 1.0)
            for e in range(c.num_experts):
                mat(mp + "experts.%d.w1.weight" % e, inter, h)
                mat(mp + "experts.%d.w3.weight" % e, inter, h)
                mat(mp + "experts.%d.w2.weight" % e, h, inter)
            continue
        inter = config.get("moe_intermediate_size", config["intermediate_size"])
        if c.family == "olmoe":
            inter = config["intermediate_size"]
        mp = p + "mlp."
        mat(mp + "gate.weight", c.num_experts, h, 1.0)
        for e in range(c.num_experts):
            mat(mp + "experts.%d.gate_proj.weight" % e, inter, h)
            mat(mp + "experts.%d.up_proj.weight" % e, inter, h)
            mat(mp + "experts.%d.down_proj.weight" % e, h, inter)
        if c.family == "qwen2_moe":
            s = config["shared_expert_intermediate_size"]
            mat(mp + "shared_expert.gate_proj.weight", s, h)
            mat(mp + "shared_expert.up_proj.weight", s, h)
            mat(mp + "shared_expert.down_proj.weight", h, s)
            mat(mp + "shared_expert_gate.weight", 1, h)
    return t


DEEPSEEK = {
    "deepseek_v2": dict(BASE, model_type="deepseek_v2", num_hidden_layers=3,
                        num_key_value_heads=4, intermediate_size=24, moe_intermediate_size=8,
                        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2,
                        first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=12,
                        qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
                        topk_method="group_limited_greedy", n_group=4, topk_group=2,
                        routed_scaling_factor=2.0, norm_topk_prob=False),
    "deepseek_v3": dict(BASE, model_type="deepseek_v3", num_hidden_layers=3,
                        num_key_value_heads=4, intermediate_size=24, moe_intermediate_size=8,
                        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                        first_k_dense_replace=1, q_lora_rank=10, kv_lora_rank=12,
                        qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
                        n_group=4, topk_group=2, routed_scaling_factor=2.5,
                        norm_topk_prob=True,
                        rope_scaling={"type": "yarn", "factor": 4.0,
                                      "original_max_position_embeddings": 32,
                                      "mscale": 1.0, "mscale_all_dim": 0.8}),
}


def make_deepseek_tensors(config, seed):
    rng = np.random.default_rng(seed)
    c = ref.Config(config)
    t = {}

    def mat(name, rows, cols, scale=0.35):
        t[name] = round_bf16(rng.normal(0.0, scale, size=(rows, cols)))

    def vec(name, n, center=1.0, scale=0.1):
        t[name] = round_bf16(center + scale * rng.normal(size=n))

    h = c.hidden
    mat("model.embed_tokens.weight", c.vocab, h, 1.0)
    mat("lm_head.weight", c.vocab, h)
    vec("model.norm.weight", h)
    for i in range(c.layers):
        p = "model.layers.%d." % i
        a = p + "self_attn."
        vec(p + "input_layernorm.weight", h)
        vec(p + "post_attention_layernorm.weight", h)
        if c.q_lora is None:
            mat(a + "q_proj.weight", c.heads * c.qk_dim, h)
        else:
            mat(a + "q_a_proj.weight", c.q_lora, h)
            vec(a + "q_a_layernorm.weight", c.q_lora)
            mat(a + "q_b_proj.weight", c.heads * c.qk_dim, c.q_lora)
        mat(a + "kv_a_proj_with_mqa.weight", c.kv_lora + c.rope_dim, h)
        vec(a + "kv_a_layernorm.weight", c.kv_lora)
        mat(a + "kv_b_proj.weight", c.heads * (c.nope + c.v_dim), c.kv_lora)
        mat(a + "o_proj.weight", h, c.heads * c.v_dim)
        if not c.is_sparse(i):
            for n, shape in (("gate", (24, h)), ("up", (24, h)), ("down", (h, 24))):
                mat(p + "mlp.%s_proj.weight" % n, *shape)
            continue
        mp = p + "mlp."
        mat(mp + "gate.weight", c.num_experts, h, 1.0)
        if c.topk_method == "noaux_tc":
            vec(mp + "gate.e_score_correction_bias", c.num_experts, 0.0, 0.2)
        for e in range(c.num_experts):
            mat(mp + "experts.%d.gate_proj.weight" % e, c.moe_inter, h)
            mat(mp + "experts.%d.up_proj.weight" % e, c.moe_inter, h)
            mat(mp + "experts.%d.down_proj.weight" % e, h, c.moe_inter)
        s = c.moe_inter * c.n_shared
        mat(mp + "shared_experts.gate_proj.weight", s, h)
        mat(mp + "shared_experts.up_proj.weight", s, h)
        mat(mp + "shared_experts.down_proj.weight", h, s)
    return t


# ------------------------------------------------------------------ tests

FAILURES = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        FAILURES.append(what)


def test_safetensors_roundtrip(tmp):
    rng = np.random.default_rng(1)
    tensors = {"a.bf16": round_bf16(rng.normal(size=(3, 5))),
               "b.f16": rng.normal(size=(7,)).astype(np.float16).astype(np.float64),
               "c.f32": rng.normal(size=(2, 2, 2)).astype(np.float32).astype(np.float64),
               "d.f64": rng.normal(size=(4,))}
    dtypes = {"a.bf16": "BF16", "b.f16": "F16", "c.f32": "F32", "d.f64": "F64"}
    path = os.path.join(tmp, "rt.safetensors")
    write_safetensors(path, tensors, dtypes)
    back = ref.read_safetensors(path)
    check(sorted(back) == sorted(tensors), "safetensors: names round-trip")
    check(all(back[n].shape == tensors[n].shape and np.array_equal(back[n], tensors[n])
              for n in tensors), "safetensors: BF16/F16/F32/F64 values round-trip exactly")
    # bf16 of 1.0 is 0x3F80; of -2.5 is 0xC020.
    check(list(to_bf16_bits(np.array([1.0, -2.5]))) == [0x3F80, 0xC020], "bf16 bit patterns")
    with open(path, "rb") as f:
        blob = f.read()
    with open(path, "wb") as f:
        f.write(blob[:-3])
    try:
        ref.read_safetensors(path)
        check(False, "safetensors: truncated file is rejected")
    except ValueError:
        check(True, "safetensors: truncated file is rejected")
    one = os.path.join(tmp, "one")
    three = os.path.join(tmp, "three")
    cfg = CONFIGS["mixtral"]
    t = make_tensors(cfg, 5)
    write_model(one, cfg, t)
    write_model(three, cfg, t, shards=3)
    a, b = ref.load_weights(one), ref.load_weights(three)
    check(sorted(a) == sorted(b) and all(np.array_equal(a[n], b[n]) for n in a),
          "safetensors: sharded checkpoint (index.json) loads the same tensors")


def test_fp8_block_scales(tmp):
    # E4M3 codes, decoded by hand: 0x38 = 1.0, 0x39 = 1.125, 0xb8 = -1.0,
    # 0x7e = 448 (largest), 0x08 = 2^-6 (smallest normal), 0x01 = 2^-9.
    table = ref._E4M3
    check([table[b] for b in (0x38, 0x39, 0xb8, 0x7e, 0x08, 0x01)] ==
          [1.0, 1.125, -1.0, 448.0, 2.0 ** -6, 2.0 ** -9] and np.isnan(table[0x7f]),
          "fp8: e4m3 code table")
    # A [3, 5] weight in 2 x 2 blocks: scales [2, 3], partial blocks at the edges.
    codes = np.array([[0x38, 0x39, 0xb8, 0x7e, 0x08],
                      [0x01, 0x38, 0x38, 0x38, 0x38],
                      [0x38, 0xb8, 0x39, 0x38, 0x01]], dtype=np.uint8)
    scales = np.array([[0.5, 2.0, 4.0], [8.0, 16.0, 32.0]], dtype="<f4")
    header = {"w.weight": {"dtype": "F8_E4M3", "shape": [3, 5], "data_offsets": [0, 15]},
              "w.weight_scale_inv": {"dtype": "F32", "shape": [2, 3],
                                     "data_offsets": [15, 39]}}
    text = json.dumps(header).encode()
    d = os.path.join(tmp, "fp8")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + codes.tobytes() + scales.tobytes())
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                           "weight_block_size": [2, 2]}}, f)
    w = ref.load_weights(d)
    want = np.array([[table[c] * scales[r // 2, k // 2] for k, c in enumerate(row)]
                     for r, row in enumerate(codes)])
    check(sorted(w) == ["w.weight"] and np.array_equal(w["w.weight"], want),
          "fp8: weights times their block's scale_inv, scales dropped")


def logits_incremental_and_full(model, prompt, steps):
    cache = model.new_cache()
    logits, _ = model.forward(prompt, cache)
    seq, rows = list(prompt), [logits[-1]]
    for _ in range(steps):
        tok = int(np.argmax(rows[-1]))
        seq.append(tok)
        logits, _ = model.forward([tok], cache)
        rows.append(logits[-1])
    full, _ = model.forward(seq, model.new_cache())
    return np.array(rows), full[len(prompt) - 1:]


def test_incremental_matches_recompute(tmp):
    for fam, cfg in CONFIGS.items():
        d = os.path.join(tmp, fam)
        write_model(d, cfg, make_tensors(cfg, 11))
        model = ref.Model(d)
        inc, full = logits_incremental_and_full(model, [3, 17, 5, 60, 9], 6)
        err = float(np.max(np.abs(inc - full)))
        spread = float(np.max(np.abs(full)))
        check(err < 1e-10 and spread > 0.1,
              "%s: incremental decode logits == full recompute (max diff %.1e)" % (fam, err))


def test_topk_renormalisation_switch(tmp):
    cfg = dict(CONFIGS["qwen3_moe"])
    weights = make_tensors(cfg, 21)
    prompt = [1, 2, 3, 4]
    on = ref.Model(None, dict(cfg, norm_topk_prob=True), weights)
    off = ref.Model(None, dict(cfg, norm_topk_prob=False), weights)
    diff = float(np.max(np.abs(on.forward(prompt, on.new_cache())[0] -
                                off.forward(prompt, off.new_cache())[0])))
    check(diff > 1e-4, "norm_topk_prob changes the logits (max diff %.3g)" % diff)
    # With k = all experts the top-k already sums to one: the switch is a no-op.
    all_k = dict(cfg, num_experts_per_tok=cfg["num_experts"])
    a = ref.Model(None, dict(all_k, norm_topk_prob=True), weights)
    b = ref.Model(None, dict(all_k, norm_topk_prob=False), weights)
    same = float(np.max(np.abs(a.forward(prompt, a.new_cache())[0] -
                                b.forward(prompt, b.new_cache())[0])))
    check(same < 1e-12, "norm_topk_prob is a no-op when k == num_experts (%.1e)" % same)
    # Mixtral renormalises whatever the config says.
    m = dict(CONFIGS["mixtral"])
    mw = make_tensors(m, 22)
    x = ref.Model(None, dict(m, norm_topk_prob=False), mw)
    y = ref.Model(None, dict(m, norm_topk_prob=True), mw)
    check(np.array_equal(x.forward(prompt, x.new_cache())[0], y.forward(prompt, y.new_cache())[0]),
          "mixtral always renormalises the top-k weights")


def test_dense_layers(tmp):
    cfg = CONFIGS["qwen2_moe"]
    weights = make_tensors(cfg, 31)
    model = ref.Model(None, cfg, weights)
    check(model.moe_layers == [0, 2], "qwen2_moe: mlp_only_layers=[1] leaves MoE layers [0, 2]")
    logits, routing = model.forward([5, 6, 7], model.new_cache())
    check(all(len(r) == 2 and all(len(e) == 3 for e in r) for r in routing),
          "qwen2_moe: routing has top-3 experts for the two MoE layers only")
    bumped = dict(weights)
    bumped["model.layers.1.mlp.gate_proj.weight"] = weights["model.layers.1.mlp.gate_proj.weight"] * 1.5
    other = ref.Model(None, cfg, bumped)
    diff = float(np.max(np.abs(other.forward([5, 6, 7], other.new_cache())[0] - logits)))
    check(diff > 1e-4, "qwen2_moe: layer 1 runs the dense MLP (changing it moves logits %.3g)" % diff)
    try:
        ref.Model(None, dict(cfg, mlp_only_layers=[]), weights)
        check(False, "qwen2_moe: without mlp_only_layers, layer 1 wants expert weights")
    except KeyError:
        check(True, "qwen2_moe: without mlp_only_layers, layer 1 wants expert weights")
    q3 = ref.Model(None, CONFIGS["qwen3_moe"], make_tensors(CONFIGS["qwen3_moe"], 32))
    check(q3.moe_layers == [1], "qwen3_moe: decoder_sparse_step=2 makes only layer 1 sparse")
    # The shared expert matters: silence its gate weight and the logits move.
    quiet = dict(weights)
    quiet["model.layers.0.mlp.shared_expert_gate.weight"] = np.full((1, 16), -50.0)
    q = ref.Model(None, cfg, quiet)
    diff = float(np.max(np.abs(q.forward([5, 6, 7], q.new_cache())[0] - logits)))
    check(diff > 1e-4, "qwen2_moe: shared expert output is added (gate off moves logits %.3g)" % diff)


def hand_mixtral(w, ids, top_k, eps, theta, heads, kv_heads):
    """Mixtral, 1 layer, hidden 4, 2 experts, written out with scalar loops."""
    hd = 4 // heads
    half = hd // 2

    def matvec(m, v):
        return [sum(m[r][c] * v[c] for c in range(len(v))) for r in range(len(m))]

    def rms(v, g):
        ms = sum(x * x for x in v) / len(v)
        return [v[i] / math.sqrt(ms + eps) * g[i] for i in range(len(v))]

    def silu(x):
        return x / (1.0 + math.exp(-x))

    def rope(a, pos):  # pairs (i, i + hd/2) rotate by pos * theta^(-2i/hd)
        out = list(a)
        for i in range(half):
            f = pos * theta ** (-(2.0 * i) / hd)
            out[i] = a[i] * math.cos(f) - a[i + half] * math.sin(f)
            out[i + half] = a[i + half] * math.cos(f) + a[i] * math.sin(f)
        return out

    L = "model.layers.0."
    ks, vs, logits = [], [], []
    for pos, tok in enumerate(ids):
        x = list(w["model.embed_tokens.weight"][tok])
        h = rms(x, w[L + "input_layernorm.weight"])
        q = matvec(w[L + "self_attn.q_proj.weight"], h)
        k = matvec(w[L + "self_attn.k_proj.weight"], h)
        v = matvec(w[L + "self_attn.v_proj.weight"], h)
        q = sum((rope(q[n * hd:(n + 1) * hd], pos) for n in range(heads)), [])
        k = sum((rope(k[n * hd:(n + 1) * hd], pos) for n in range(kv_heads)), [])
        ks.append(k)
        vs.append(v)
        attn = []
        for head in range(heads):
            g = head // (heads // kv_heads)  # the kv head this query head reads
            qh = q[head * hd:(head + 1) * hd]
            sc = [sum(qh[d] * kk[g * hd + d] for d in range(hd)) / math.sqrt(hd) for kk in ks]
            m = max(sc)
            ex = [math.exp(z - m) for z in sc]
            tot = sum(ex)
            attn += [sum(ex[j] / tot * vs[j][g * hd + d] for j in range(len(ks)))
                     for d in range(hd)]
        o = matvec(w[L + "self_attn.o_proj.weight"], attn)
        x = [x[i] + o[i] for i in range(4)]
        h = rms(x, w[L + "post_attention_layernorm.weight"])
        r = matvec(w[L + "block_sparse_moe.gate.weight"], h)
        m = max(r)
        p = [math.exp(z - m) for z in r]
        p = [z / sum(p) for z in p]
        order = sorted(range(2), key=lambda e: (-p[e], e))[:top_k]
        total = sum(p[e] for e in order)
        y = [0.0] * 4
        for e in order:
            E = L + "block_sparse_moe.experts.%d." % e
            g1 = matvec(w[E + "w1.weight"], h)
            u = matvec(w[E + "w3.weight"], h)
            a = [silu(g1[i]) * u[i] for i in range(len(g1))]
            d = matvec(w[E + "w2.weight"], a)
            y = [y[i] + p[e] / total * d[i] for i in range(4)]
        x = [x[i] + y[i] for i in range(4)]
        x = rms(x, w["model.norm.weight"])
        logits.append(matvec(w["lm_head.weight"], x))
    return np.array(logits)


def test_hand_computed_mixtral(tmp):
    # (heads, kv heads): GQA with head_dim 2, and one head of dim 4 (two
    # rotary frequencies, so the rotate_half pairing is checked).
    for top_k, heads, kv_heads in ((1, 2, 1), (2, 2, 1), (2, 1, 1)):
        cfg = {"model_type": "mixtral", "vocab_size": 6, "hidden_size": 4,
               "num_hidden_layers": 1, "num_attention_heads": heads,
               "num_key_value_heads": kv_heads, "intermediate_size": 3,
               "num_local_experts": 2, "num_experts_per_tok": top_k,
               "rope_theta": 100.0}  # rms_norm_eps left to its default, 1e-5
        tensors = make_tensors(cfg, 41 + top_k + 10 * heads)
        d = os.path.join(tmp, "hand%d%d" % (top_k, heads))
        write_model(d, cfg, tensors)
        model = ref.Model(d)
        ids = [3, 1, 4, 1, 5]
        got, _ = model.forward(ids, model.new_cache())
        want = hand_mixtral(tensors, ids, top_k, 1e-5, 100.0, heads, kv_heads)
        err = float(np.max(np.abs(got - want)))
        check(err < 1e-12, "mixtral 1-layer hand computation, top-%d, %d head(s) "
              "(max diff %.1e)" % (top_k, heads, err))


def test_cli(tmp):
    d = os.path.join(tmp, "qwen2_moe")
    out = subprocess.run([sys.executable, os.path.join(HERE, "moe_reference.py"), "--model", d,
                          "--prompt-ids", "1,2,3", "--max-new-tokens", "5",
                          "--top-logprobs", "3", "--dump-routing"],
                         capture_output=True, text=True, check=False)
    check(out.returncode == 0, "cli: exits 0 (%s)" % out.stderr.strip()[-200:])
    if out.returncode != 0:
        return
    r = json.loads(out.stdout)
    check(len(r["tokens"]) == 5 and len(r["logprobs"]) == 5 and len(r["top_logprobs"]) == 5,
          "cli: 5 tokens, logprobs, top_logprobs")
    check(all(t[0][0] == tok and abs(t[0][1] - lp) < 1e-12 and len(t) == 3
              and t[0][1] >= t[1][1] >= t[2][1]
              for t, tok, lp in zip(r["top_logprobs"], r["tokens"], r["logprobs"])),
          "cli: greedy token is the best top_logprob")
    check(all(lp <= 0 for lp in r["logprobs"]), "cli: log-probs are <= 0")
    check(len(r["routing"]) == 3 + 4 and r["moe_layers"] == [0, 2]
          and all(len(x) == 2 for x in r["routing"]),
          "cli: routing for 7 fed positions x 2 MoE layers")
    model = ref.Model(d)
    seq = [1, 2, 3] + r["tokens"][:-1]
    full, _ = model.forward(seq, model.new_cache())
    lps = [ref.log_softmax(full[2 + i])[t] for i, t in enumerate(r["tokens"])]
    check(np.allclose(lps, r["logprobs"], atol=1e-10, rtol=0),
          "cli: log-probs equal a full recompute's log-softmax")


def test_deepseek(tmp):
    prompt = [3, 17, 5, 60, 9]
    for fam, cfg in DEEPSEEK.items():
        weights = make_deepseek_tensors(cfg, 61)
        d = os.path.join(tmp, fam)
        write_model(d, cfg, weights)
        model = ref.Model(d)
        check(model.moe_layers == [1, 2], "%s: layer 0 is dense (first_k_dense_replace)" % fam)
        inc, full = logits_incremental_and_full(model, prompt, 6)
        err = float(np.max(np.abs(inc - full)))
        check(err < 1e-10 and float(np.max(np.abs(full))) > 0.1,
              "%s: incremental decode logits == full recompute (max diff %.1e)" % (fam, err))
        # The absorbed form the engine uses equals the published attention:
        # scores (q_nope W_UK) . c_kv + q_pe . k_pe, output W_UV sum p c_kv.
        lw = model._layer_weights(1)
        c = model.cfg
        x = ref.rms_norm(model.embed[prompt], lw["in_norm"], c.eps)
        cos, sin = model._rope(np.arange(len(prompt)))
        published = model._mla_attention(lw, x, {"k": None, "v": None}, cos, sin, 0)
        q = x @ lw["q"].T if "q" in lw else (
            ref.rms_norm(x @ lw["q_a"].T, lw["q_a_norm"], c.eps) @ lw["q_b"].T)
        q = q.reshape(len(prompt), c.heads, c.qk_dim)
        kv = x @ lw["kv_a"].T
        ckv = ref.rms_norm(kv[:, :c.kv_lora], lw["kv_a_norm"], c.eps)
        wkv = lw["kv_b"].reshape(c.heads, c.nope + c.v_dim, c.kv_lora)

        def interleaved(z):  # pairs (2i, 2i+1) rotated in place
            f = cos[:, :c.rope_dim // 2]
            g = sin[:, :c.rope_dim // 2]
            if z.ndim == 3:
                f, g = f[:, None, :], g[:, None, :]
            out = z.copy()
            out[..., 0::2] = z[..., 0::2] * f - z[..., 1::2] * g
            out[..., 1::2] = z[..., 1::2] * f + z[..., 0::2] * g
            return out

        q_pe = interleaved(q[..., c.nope:])
        k_pe = interleaved(kv[:, c.kv_lora:])
        out = np.empty((len(prompt), c.heads, c.v_dim))
        mask = np.triu(np.ones((len(prompt), len(prompt)), dtype=bool), 1)
        for h in range(c.heads):
            q_lat = q[:, h, :c.nope] @ wkv[h, :c.nope, :]
            scores = (q_lat @ ckv.T + q_pe[:, h, :] @ k_pe.T) * model._softmax_scale()
            p = ref.softmax(np.where(mask, -np.inf, scores))
            out[:, h, :] = (p @ ckv) @ wkv[h, c.nope:, :].T
        absorbed = out.reshape(len(prompt), -1) @ lw["o"].T
        diff = float(np.max(np.abs(absorbed - published)))
        check(diff < 1e-10, "%s: absorbed MLA with in-place interleaved rope == published "
              "(max diff %.1e)" % (fam, diff))
    # Routing by hand. v2 group_limited_greedy: groups by their best score.
    cfg = DEEPSEEK["deepseek_v2"]
    m = ref.Model(None, cfg, make_deepseek_tensors(cfg, 62))
    lw = {"router": np.eye(8)}
    logits = np.log(np.array([[0.05, 0.2, 0.02, 0.03, 0.3, 0.1, 0.25, 0.05]]))
    ids, w = m._deepseek_route(lw, logits)  # x @ I = logits
    check(list(ids[0]) == [4, 6] and np.allclose(w[0], [0.6, 0.5]),
          "v2 group_limited_greedy picks groups 2, 3 and scales by 2 (%s %s)" % (ids[0], w[0]))
    # v3 noaux_tc: the bias chooses, the weights are the unbiased sigmoid
    # scores, renormalised then scaled; dropped groups count as 0.
    cfg = DEEPSEEK["deepseek_v3"]
    m = ref.Model(None, cfg, make_deepseek_tensors(cfg, 63))
    logits = np.array([[0.0, 0.0, 0.0, 0.0, 2.0, 1.0, 0.0, 0.0]])
    bias = np.full(8, -5.0)
    ids, w = m._deepseek_route({"router": np.eye(8), "score_bias": bias}, logits)
    # Groups of 2: {4, 5} best, then a tie won by {0, 1}; {2, 3} and {6, 7}
    # are dropped and their 0 beats every kept (negative) choice.
    check(list(ids[0]) == [2, 3] and np.allclose(w[0], [1.25, 1.25]),
          "v3 noaux_tc: masked groups count as 0 (%s %s)" % (ids[0], w[0]))
    ids, w = m._deepseek_route({"router": np.eye(8), "score_bias": np.zeros(8)}, logits)
    s4, s5 = 1 / (1 + math.exp(-2)), 1 / (1 + math.exp(-1))
    check(list(ids[0]) == [4, 5] and np.allclose(w[0], [2.5 * s4 / (s4 + s5), 2.5 * s5 / (s4 + s5)]),
          "v3 noaux_tc weights: unbiased scores, renormalised, times 2.5")


GPT_OSS = {"model_type": "gpt_oss", "vocab_size": 64, "hidden_size": 32,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "intermediate_size": 16, "num_local_experts": 4,
           "num_experts_per_tok": 2, "sliding_window": 3,
           "layer_types": ["sliding_attention", "full_attention"], "swiglu_limit": 1.0,
           "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                            "beta_slow": 1.0, "original_max_position_embeddings": 64,
                            "truncate": False}}


def make_gpt_oss_tensors(c, seed):
    rng = np.random.default_rng(seed)
    h, e, i, hd = c["hidden_size"], c["num_local_experts"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    t = {"model.embed_tokens.weight": rng.normal(size=(c["vocab_size"], h)),
         "model.norm.weight": 1 + 0.05 * rng.normal(size=h),
         "lm_head.weight": rng.normal(size=(c["vocab_size"], h)) / math.sqrt(h)}
    for layer in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        shapes = {"input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
                  "self_attn.q_proj.weight": (q, h), "self_attn.q_proj.bias": (q,),
                  "self_attn.k_proj.weight": (kv, h), "self_attn.k_proj.bias": (kv,),
                  "self_attn.v_proj.weight": (kv, h), "self_attn.v_proj.bias": (kv,),
                  "self_attn.o_proj.weight": (h, q), "self_attn.o_proj.bias": (h,),
                  "self_attn.sinks": (c["num_attention_heads"],),
                  "mlp.router.weight": (e, h), "mlp.router.bias": (e,),
                  "mlp.experts.gate_up_proj": (e, h, 2 * i),
                  "mlp.experts.gate_up_proj_bias": (e, 2 * i),
                  "mlp.experts.down_proj": (e, i, h), "mlp.experts.down_proj_bias": (e, h)}
        for name, shape in shapes.items():
            scale = 1.0 if name.endswith(("sinks", "norm.weight")) else 1 / math.sqrt(shape[-1])
            v = rng.normal(size=shape) * scale
            t[p + name] = 1 + 0.05 * v if "norm" in name else v
    return t


def test_gpt_oss(tmp):
    import gpt_oss_reference as go
    d = os.path.join(tmp, "gpt_oss")
    write_model(d, GPT_OSS, make_gpt_oss_tensors(GPT_OSS, 71))
    model = ref.load_model(d)
    inc, full = logits_incremental_and_full(model, [3, 17, 5, 60, 9, 1, 2], 5)
    err = float(np.max(np.abs(inc - full)))
    check(err < 1e-10, "gpt_oss: incremental decode == full recompute (%.1e)" % err)
    # One sliding layer: position p sees only tokens p-2..p (window 3), so
    # changing token 0 moves the logits at positions 1 and 2 but not 3+;
    # with a full layer, every later position moves.
    one = dict(GPT_OSS, num_hidden_layers=1)
    tens = {k: v for k, v in make_gpt_oss_tensors(GPT_OSS, 72).items()
            if not k.startswith("model.layers.1.")}
    for kind, moved_at_3 in (("sliding_attention", False), ("full_attention", True)):
        cfg = dict(one, layer_types=[kind])
        m = go.GptOssModel(go.GptOssConfig(cfg), dict(tens))
        a, _ = m.forward([5, 6, 7, 8, 9], m.new_cache())
        b, _ = m.forward([40, 6, 7, 8, 9], m.new_cache())
        diff = np.max(np.abs(a - b), axis=-1)
        check(diff[2] > 1e-6 and (diff[3] > 1e-6) == moved_at_3 and (diff[4] > 1e-6) == moved_at_3,
              "gpt_oss %s: window of exactly 3 keys (diffs %s)" % (kind, np.round(diff, 6)))
    # A sink of -1e9 takes no share: plain softmax attention; a large one
    # takes almost all of it, leaving the o_proj bias.
    lw = m._layer(0)
    x = np.random.default_rng(5).normal(size=(4, GPT_OSS["hidden_size"]))
    cos, sin = m.rope(np.arange(4))
    outs = []
    for sink in (-1e9, 60.0):
        lw2 = dict(lw, sinks=np.full_like(lw["sinks"], sink))
        outs.append(m.attention(lw2, x, {"k": None, "v": None}, cos, sin, 0, False))
    q = go.GptOssModel._rotate((x @ lw["q"].T + lw["q_b"]).reshape(4, 4, 8), cos, sin)
    k = go.GptOssModel._rotate((x @ lw["k"].T + lw["k_b"]).reshape(4, 2, 8), cos, sin)
    v = (x @ lw["v"].T + lw["v_b"]).reshape(4, 2, 8)
    plain = np.empty((4, 4, 8))
    for hh in range(4):
        sc = q[:, hh] @ k[:, hh // 2].T / math.sqrt(8) + np.triu(np.full((4, 4), -np.inf), 1)
        plain[:, hh] = ref.softmax(sc) @ v[:, hh // 2]
    plain = plain.reshape(4, 32) @ lw["o"].T + lw["o_b"]
    check(np.max(np.abs(outs[0] - plain)) < 1e-12 and np.max(np.abs(outs[1] - lw["o_b"])) < 1e-6,
          "gpt_oss: sinks join the softmax and are dropped")
    # MXFP4: byte 0x21 holds codes 1 (0.5, element 0) and 2 (1.0, element 1);
    # scale 128 doubles them; the result is transposed to [E, cols, rows].
    blocks = np.zeros((1, 2, 1, 16), dtype=np.uint8)
    blocks[0, 0, 0, 0], blocks[0, 1, 0, 15] = 0x21, 0xF9
    scales = np.array([[[128], [126]]], dtype=np.uint8)
    w = go.dequantize_mxfp4(blocks, scales)
    check(w.shape == (1, 32, 2) and w[0, 0, 0] == 1.0 and w[0, 1, 0] == 2.0
          and w[0, 30, 1] == -0.25 and w[0, 31, 1] == -3.0 and np.count_nonzero(w) == 4,
          "gpt_oss: MXFP4 nibble order, E8M0 scale and transpose")
    # Router: softmax over the top-k logits (bias included); clamped SwiGLU
    # reads gate from the even columns of gate_up.
    lw = dict(m._layer(0), router=np.eye(4, GPT_OSS["hidden_size"]),
              router_b=np.array([0.0, 1.0, 0.5, -3.0]))
    xr = np.zeros((1, GPT_OSS["hidden_size"]))
    xr[0, 3] = 10.0  # expert 3's logit 7, then 1 (expert 1)
    _, chosen = m.moe(lw, xr)
    check(chosen == [[3, 1]], "gpt_oss: top-k of the biased logits (%s)" % chosen)
    e_out = m.expert(lw, 0, xr[0])
    gu = xr[0] @ lw["gate_up_proj"][0] + lw["gate_up_proj_bias"][0]
    g, u = np.minimum(gu[0::2], 1.0), np.clip(gu[1::2], -1.0, 1.0)
    want = ((u + 1) * g / (1 + np.exp(-1.702 * g))) @ lw["down_proj"][0] + lw["down_proj_bias"][0]
    check(np.max(np.abs(e_out - want)) < 1e-12, "gpt_oss: interleaved clamped SwiGLU expert")


def test_speed(tmp):
    cfg = {"model_type": "qwen2_moe", "vocab_size": 2048, "hidden_size": 128,
           "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
           "intermediate_size": 256, "moe_intermediate_size": 128,
           "shared_expert_intermediate_size": 256, "num_experts": 16, "num_experts_per_tok": 4}
    d = os.path.join(tmp, "speed")
    write_model(d, cfg, make_tensors(cfg, 51))
    size = os.path.getsize(os.path.join(d, "model.safetensors"))
    start = time.time()
    model = ref.Model(d)
    r = ref.generate(model, list(range(1, 9)), 16)
    took = time.time() - start
    check(len(r["tokens"]) == 16 and took < 15.0,
          "speed: load + 16 tokens of a %.1f MB model in %.2f s" % (size / 1e6, took))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for test in (test_safetensors_roundtrip, test_fp8_block_scales,
                     test_incremental_matches_recompute,
                     test_topk_renormalisation_switch, test_dense_layers,
                     test_hand_computed_mixtral, test_cli, test_deepseek, test_gpt_oss,
                     test_speed):
            try:
                test(tmp)
            except Exception as e:  # a crash is a failure, with its reason
                check(False, "%s raised %s: %s" % (test.__name__, type(e).__name__, e))
    print("%d failure(s)" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
