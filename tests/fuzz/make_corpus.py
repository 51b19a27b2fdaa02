#!/usr/bin/python3
"""Regenerates tests/fuzz/corpus/ (committed; run again after changing it).

The corpus holds malformed inputs, each with the error it must produce
(corpus/expected.txt, read by corpus_test.cc), plus a few valid seeds that
the fuzz drivers mutate. Layout:
  safetensors/*.safetensors   SafetensorsFile::Open
  config/*.json               ParseModelConfig
  model/<name>/               ModelDescription::Open (a model directory)
  trace/*.jsonl               trace::ReadTrace (fuzz_trace seeds only)
  eamc/*.eamc                 DecodeLearnedState (fuzz_eamc seeds only)
  gguf/                       GgufCheckpoint::Open (make_gguf_corpus.py)
expected.txt: one line per entry, "<path>\t<substring of the error>" or
"<path>\tOK" for valid seeds.
"""
import json
import os
import shutil
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
expected = []


def st_bytes(header, data=b"", length=None, pad=True):
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    n = len(text) if length is None else length
    return struct.pack("<Q", n) + text + data


def put(rel, blob, expect):
    path = os.path.join(ROOT, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(blob if isinstance(blob, bytes) else blob.encode())
    if expect is not None:
        expected.append((rel, expect))


def f32(n, start=0.0):
    return struct.pack("<%df" % n, *[start + 0.25 * i for i in range(n)])


def safetensors_cases():
    ok = {"__metadata__": {"format": "pt"},
          "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
          "b": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]},
          "c": {"dtype": "I64", "shape": [], "data_offsets": [24, 32]}}
    put("safetensors/valid_small.safetensors", st_bytes(ok, f32(8)), "OK")
    put("safetensors/valid_empty_header.safetensors", st_bytes({}), "OK")
    f8 = {"w": {"dtype": "F8_E4M3", "shape": [2, 4], "data_offsets": [0, 8]},
          "w_scale_inv": {"dtype": "F32", "shape": [1, 1], "data_offsets": [8, 12]},
          "i": {"dtype": "I8", "shape": [4], "data_offsets": [12, 16]},
          "u": {"dtype": "U8", "shape": [4], "data_offsets": [16, 20]}}
    put("safetensors/valid_f8_u8_i8.safetensors",
        st_bytes(f8, bytes(range(0x30, 0x38)) + f32(1, 0.5) + bytes(8)), "OK")
    t = lambda **kw: {"x": dict({"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, **kw)}
    cases = [
        ("empty", b"", "too small"),
        ("truncated_length", b"\x10\x00\x00", "too small"),
        ("header_past_eof", st_bytes(t(), f32(2), length=4096), "runs past the end"),
        ("header_too_large", st_bytes(t(), f32(2), length=1 << 40), "exceeds the limit"),
        ("not_json", st_bytes(b"{\"x\": {\"dtype\": \"F32\",", f32(2)), "not valid JSON"),
        ("not_object", st_bytes(b"[1, 2, 3]"), "not a JSON object"),
        ("unknown_dtype", st_bytes(t(dtype="F8_E9M9"), f32(2)), "unknown dtype 'F8_E9M9'"),
        ("shape_size_mismatch", st_bytes(t(shape=[3]), f32(2)), "needs 12 bytes"),
        ("offsets_out_of_range", st_bytes(t(data_offsets=[0, 64]), f32(2)), "out of range"),
        ("offsets_reversed", st_bytes(t(shape=[0], data_offsets=[8, 0]), f32(2)), "begin > end"),
        ("offsets_overlap", st_bytes({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                      "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
                                     f32(3)), "overlap"),
        ("negative_dim", st_bytes(t(shape=[-2]), f32(2)), "not a non-negative integer"),
        ("shape_overflow", st_bytes(t(shape=[1 << 40, 1 << 40]), f32(2)), "too many elements"),
        ("missing_offsets", st_bytes({"x": {"dtype": "F32", "shape": [2]}}, f32(2)),
         "data_offsets"),
        ("metadata_not_strings", st_bytes({"__metadata__": {"n": 3}}), "not a string"),
        ("truncated_data", st_bytes(t(), f32(1)), "out of range"),
        ("entry_not_object", st_bytes({"x": [1, 2]}), "entry is not a JSON object"),
        ("f8_size_mismatch", st_bytes(t(dtype="F8_E4M3", shape=[3]), f32(2)), "needs 3 bytes"),
    ]
    for name, blob, msg in cases:
        put("safetensors/bad_%s.safetensors" % name, blob, msg)


def config_cases():
    base = {
        "mixtral": {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
                    "num_experts_per_tok": 2, "intermediate_size": 96, "vocab_size": 300},
        "qwen2_moe": {"model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 4,
                      "num_attention_heads": 4, "num_key_value_heads": 4, "num_experts": 8,
                      "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                      "shared_expert_intermediate_size": 64, "intermediate_size": 128,
                      "decoder_sparse_step": 2, "mlp_only_layers": [3], "vocab_size": 300,
                      "eos_token_id": 299},
        "qwen3_moe": {"model_type": "qwen3_moe", "hidden_size": 64, "head_dim": 32,
                      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                      "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                      "norm_topk_prob": True, "vocab_size": 300, "eos_token_id": [1, 2],
                      "rope_scaling": None},
        "olmoe": {"model_type": "olmoe", "hidden_size": 64, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2,
                  "intermediate_size": 32, "vocab_size": 300, "clip_qkv": 8.0,
                  "eos_token_id": 299, "pad_token_id": 1},
    }
    base["deepseek_v2"] = {
        "model_type": "deepseek_v2", "hidden_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32, "intermediate_size": 128,
        "n_shared_experts": 2, "first_k_dense_replace": 1, "q_lora_rank": None,
        "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
        "v_head_dim": 16, "topk_method": "group_limited_greedy", "n_group": 4,
        "topk_group": 2, "vocab_size": 300, "eos_token_id": 299,
        "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 64,
                         "mscale": 0.707, "mscale_all_dim": 0.707}}
    base["deepseek_v3"] = dict(base["deepseek_v2"], model_type="deepseek_v3",
                               q_lora_rank=24, topk_method="noaux_tc",
                               scoring_func="sigmoid", routed_scaling_factor=2.5,
                               norm_topk_prob=True)
    base["gpt_oss"] = {
        "model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32,
        "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
        "vocab_size": 300, "eos_token_id": 299,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "original_max_position_embeddings": 1024, "truncate": False}}
    base["glm4_moe"] = {
        "model_type": "glm4_moe", "hidden_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "partial_rotary_factor": 0.5, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "intermediate_size": 128, "n_shared_experts": 1,
        "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1, "norm_topk_prob": True,
        "routed_scaling_factor": 2.5, "attention_bias": True, "use_qk_norm": True,
        "num_nextn_predict_layers": 1, "vocab_size": 300, "eos_token_id": [298, 299]}
    base["gpt_oss_mxfp4"] = dict(base["gpt_oss"], quantization_config={
        "quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]})
    for fam, cfg in base.items():
        put("config/valid_%s.json" % fam, json.dumps(cfg, indent=1), "OK")
    m = base["mixtral"]
    cases = [
        ("zero_hidden", dict(m, hidden_size=0), "hidden_size must be positive"),
        ("negative_layers", dict(m, num_hidden_layers=-1), "num_hidden_layers must be positive"),
        ("zero_experts", dict(m, num_local_experts=0), "num_experts must be positive"),
        ("topk_gt_experts", dict(m, num_experts_per_tok=5), "exceeds the number of experts"),
        ("kv_not_divisor", dict(m, num_key_value_heads=3), "not a multiple"),
        ("float_size", dict(m, vocab_size=300.5), "vocab_size must be an integer"),
        ("string_size", dict(m, hidden_size="64"), "hidden_size must be an integer"),
        ("unknown_model_type", dict(m, model_type="llama"), "unsupported model_type 'llama'"),
        ("no_model_type", {k: v for k, v in m.items() if k != "model_type"}, "model_type"),
        ("eos_outside_vocab", dict(m, eos_token_id=[2, 300]), "eos_token_id 300 is outside"),
        ("mlp_only_out_of_range", dict(base["qwen2_moe"], mlp_only_layers=[4]),
         "mlp_only_layers names layer 4"),
        ("zero_sparse_step", dict(base["qwen2_moe"], decoder_sparse_step=0),
         "decoder_sparse_step must be positive"),
        ("no_moe_layers", dict(base["qwen2_moe"], decoder_sparse_step=5),
         "no MoE layers"),
        ("zero_moe_intermediate", dict(base["qwen3_moe"], moe_intermediate_size=0),
         "moe_intermediate_size must be positive"),
        ("huge_hidden", dict(m, hidden_size=1 << 40), "more than the supported"),
        ("gelu", dict(m, hidden_act="gelu"), "hidden_act 'gelu'"),
        ("deepseek_odd_rope", dict(base["deepseek_v2"], qk_rope_head_dim=7),
         "qk_rope_head_dim must be even"),
        ("deepseek_zero_kv_lora", dict(base["deepseek_v2"], kv_lora_rank=0),
         "kv_lora_rank must be positive"),
        ("deepseek_groups_not_divisor", dict(base["deepseek_v2"], n_group=3),
         "not a multiple of n_group"),
        ("deepseek_topk_group_gt_groups", dict(base["deepseek_v2"], topk_group=5),
         "topk_group is 5, more than the supported 4"),
        ("deepseek_topk_beyond_groups", dict(base["deepseek_v2"], topk_group=1,
                                             num_experts_per_tok=3),
         "exceeds the 2 experts"),
        ("deepseek_unknown_topk_method", dict(base["deepseek_v2"], topk_method="best"),
         "topk_method 'best' is not supported"),
        ("deepseek_v2_noaux", dict(base["deepseek_v2"], topk_method="noaux_tc"),
         "deepseek_v2 routes with scoring_func softmax"),
        ("deepseek_v3_softmax", dict(base["deepseek_v3"], scoring_func="softmax"),
         "deepseek_v3 routes with scoring_func sigmoid"),
        ("deepseek_v3_singleton_groups", dict(base["deepseek_v3"], n_group=8,
                                              topk_group=2),
         "at least 2 experts per group"),
        ("deepseek_bad_yarn_factor",
         dict(base["deepseek_v2"], rope_scaling={"type": "yarn", "factor": "x"}),
         "rope_scaling.factor must be a number"),
        ("deepseek_dense_model", {k: v for k, v in base["deepseek_v2"].items()
                                  if k != "num_experts_per_tok"},
         "num_experts_per_tok must be positive"),
        ("deepseek_no_moe_layers", dict(base["deepseek_v2"], first_k_dense_replace=3),
         "no MoE layers"),
        ("deepseek_zero_scaling", dict(base["deepseek_v3"], routed_scaling_factor=0),
         "routed_scaling_factor must be a positive"),
        ("gpt_oss_layer_types_length", dict(base["gpt_oss"], layer_types=["full_attention"]),
         "layer_types has 1 entries for 2 layers"),
        ("gpt_oss_layer_type_value",
         dict(base["gpt_oss"], layer_types=["sliding_attention", "local"]),
         "layer_types entry \"local\""),
        ("gpt_oss_quant_fp8", dict(base["gpt_oss"], quantization_config={"quant_method": "fp8"}),
         "not supported for gpt_oss"),
        ("gpt_oss_mxfp4_partial_group", dict(base["gpt_oss_mxfp4"], intermediate_size=48),
         "multiples of 32"),
        ("gpt_oss_zero_swiglu_limit", dict(base["gpt_oss"], swiglu_limit=0),
         "swiglu_limit must be positive"),
        ("glm4_moe_zero_rotary", dict(base["glm4_moe"], partial_rotary_factor=0),
         "partial_rotary_factor must be in (0, 1]"),
        ("glm4_moe_odd_rotary", dict(base["glm4_moe"], partial_rotary_factor=0.3),
         "head_dim * partial_rotary_factor must be even"),
        ("glm4_moe_groups_not_divisor", dict(base["glm4_moe"], n_group=3),
         "not a multiple of n_group"),
        ("glm4_moe_no_moe_layers", dict(base["glm4_moe"], first_k_dense_replace=3),
         "no MoE layers"),
        # Issue 31: summed into head_dim before any range check (UB).
        ("deepseek_qk_nope_overflow", dict(base["deepseek_v3"], qk_nope_head_dim=2**63 - 1),
         "qk_nope_head_dim is 9223372036854775807, more than the supported"),
        ("deepseek_yarn_huge_original",
         dict(base["deepseek_v2"], rope_scaling=dict(base["deepseek_v2"]["rope_scaling"],
                                                     original_max_position_embeddings=1e30)),
         "rope_scaling.original_max_position_embeddings must be an integer in"),
        ("mixtral_negative_experts", dict(m, num_local_experts=-1),
         "num_experts must be positive, got -1 (config key num_local_experts)"),
    ]
    for name, cfg, msg in cases:
        put("config/bad_%s.json" % name, json.dumps(cfg, indent=1), msg)
    fp8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
           "weight_block_size": [128, 128]}
    put("config/valid_mixtral_fp8.json", json.dumps(dict(m, quantization_config=fp8), indent=1),
        "OK")
    quant_cases = [
        ("gptq", {"quant_method": "gptq", "bits": 4}, "quant_method 'gptq' is not supported"),
        ("e5m2", dict(fp8, fmt="e5m2"), "fmt 'e5m2' is not supported"),
        ("static", dict(fp8, activation_scheme="static"),
         "activation_scheme 'static' is not supported"),
        ("per_tensor", {k: v for k, v in fp8.items() if k != "weight_block_size"},
         "no weight_block_size"),
        ("block_3d", dict(fp8, weight_block_size=[128, 128, 1]), "not two positive integers"),
        ("block_zero", dict(fp8, weight_block_size=[0, 128]), "not two positive integers"),
        ("not_object", "fp8", "quantization_config is not an object"),
    ]
    for name, q, msg in quant_cases:
        put("config/bad_quant_%s.json" % name,
            json.dumps(dict(m, quantization_config=q), indent=1), msg)
    put("config/bad_not_json.json", '{"model_type": "mixtral", "hidden_size": 64,',
        "not valid JSON")
    put("config/bad_array.json", "[1, 2]", "not a JSON object")


def micro_model():
    """A 1-layer mixtral small enough to store: (config, {name: (shape, dtype)})."""
    cfg = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 8,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
           "num_local_experts": 2, "num_experts_per_tok": 1, "intermediate_size": 4,
           "vocab_size": 16, "bos_token_id": 1, "eos_token_id": 2}
    h, v, e, i, kv = 8, 16, 2, 4, 4
    shapes = {"model.embed_tokens.weight": [v, h], "lm_head.weight": [v, h],
              "model.norm.weight": [h],
              "model.layers.0.input_layernorm.weight": [h],
              "model.layers.0.post_attention_layernorm.weight": [h],
              "model.layers.0.self_attn.q_proj.weight": [h, h],
              "model.layers.0.self_attn.k_proj.weight": [kv, h],
              "model.layers.0.self_attn.v_proj.weight": [kv, h],
              "model.layers.0.self_attn.o_proj.weight": [h, h],
              "model.layers.0.block_sparse_moe.gate.weight": [e, h]}
    for j in range(e):
        p = "model.layers.0.block_sparse_moe.experts.%d." % j
        shapes[p + "w1.weight"] = [i, h]
        shapes[p + "w3.weight"] = [i, h]
        shapes[p + "w2.weight"] = [h, i]
    return cfg, {k: (s, "F32") for k, s in shapes.items()}


def micro_deepseek():
    """A 2-layer deepseek_v3 (layer 0 dense, layer 1 MoE with MLA, q_lora,
    e_score_correction_bias, one shared expert): (config, tensors)."""
    cfg = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
           "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
           "num_key_value_heads": 2, "n_routed_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 4, "intermediate_size": 6, "n_shared_experts": 1,
           "first_k_dense_replace": 1, "q_lora_rank": 4, "kv_lora_rank": 4,
           "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "v_head_dim": 2,
           "n_group": 2, "topk_group": 1, "vocab_size": 16, "bos_token_id": 1,
           "eos_token_id": 2}
    h, v = 8, 16
    shapes = {"model.embed_tokens.weight": [v, h], "lm_head.weight": [v, h],
              "model.norm.weight": [h],
              "model.layers.0.mlp.gate_proj.weight": [6, h],
              "model.layers.0.mlp.up_proj.weight": [6, h],
              "model.layers.0.mlp.down_proj.weight": [h, 6],
              "model.layers.1.mlp.gate.weight": [4, h],
              "model.layers.1.mlp.gate.e_score_correction_bias": [4],
              "model.layers.1.mlp.shared_experts.gate_proj.weight": [4, h],
              "model.layers.1.mlp.shared_experts.up_proj.weight": [4, h],
              "model.layers.1.mlp.shared_experts.down_proj.weight": [h, 4]}
    for layer in (0, 1):
        p = "model.layers.%d." % layer
        a = p + "self_attn."
        shapes.update({p + "input_layernorm.weight": [h],
                       p + "post_attention_layernorm.weight": [h],
                       a + "q_a_proj.weight": [4, h], a + "q_a_layernorm.weight": [4],
                       a + "q_b_proj.weight": [2 * 4, 4],
                       a + "kv_a_proj_with_mqa.weight": [4 + 2, h],
                       a + "kv_a_layernorm.weight": [4],
                       a + "kv_b_proj.weight": [2 * (2 + 2), 4],
                       a + "o_proj.weight": [h, 2 * 2]})
    for j in range(4):
        p = "model.layers.1.mlp.experts.%d." % j
        shapes[p + "gate_proj.weight"] = [4, h]
        shapes[p + "up_proj.weight"] = [4, h]
        shapes[p + "down_proj.weight"] = [h, 4]
    return cfg, {k: (s, "F32") for k, s in shapes.items()}


def micro_gpt_oss():
    """A 1-layer gpt_oss with MXFP4 experts (sinks, biases, router bias):
    (config, tensors); zero codes and scales are valid MXFP4."""
    cfg = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_size": 32,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
           "head_dim": 4, "num_local_experts": 2, "num_experts_per_tok": 1,
           "intermediate_size": 32, "sliding_window": 4, "vocab_size": 16, "eos_token_id": 2,
           "quantization_config": {"quant_method": "mxfp4"}}
    h, v, e, i = 32, 16, 2, 32
    a = "model.layers.0.self_attn."
    x = "model.layers.0.mlp.experts."
    shapes = {"model.embed_tokens.weight": ([v, h], "F32"), "lm_head.weight": ([v, h], "F32"),
              "model.norm.weight": ([h], "F32"),
              "model.layers.0.input_layernorm.weight": ([h], "F32"),
              "model.layers.0.post_attention_layernorm.weight": ([h], "F32"),
              a + "q_proj.weight": ([8, h], "F32"), a + "q_proj.bias": ([8], "F32"),
              a + "k_proj.weight": ([4, h], "F32"), a + "k_proj.bias": ([4], "F32"),
              a + "v_proj.weight": ([4, h], "F32"), a + "v_proj.bias": ([4], "F32"),
              a + "o_proj.weight": ([h, 8], "F32"), a + "o_proj.bias": ([h], "F32"),
              a + "sinks": ([2], "F32"),
              "model.layers.0.mlp.router.weight": ([e, h], "F32"),
              "model.layers.0.mlp.router.bias": ([e], "F32"),
              x + "gate_up_proj_blocks": ([e, 2 * i, h // 32, 16], "U8"),
              x + "gate_up_proj_scales": ([e, 2 * i, h // 32], "U8"),
              x + "gate_up_proj_bias": ([e, 2 * i], "F32"),
              x + "down_proj_blocks": ([e, h, i // 32, 16], "U8"),
              x + "down_proj_scales": ([e, h, i // 32], "U8"),
              x + "down_proj_bias": ([e, h], "F32")}
    return cfg, shapes


def gpt_oss_cases(model):
    cfg, tensors = micro_gpt_oss()
    x = "model.layers.0.mlp.experts."
    model("valid_micro_gpt_oss_mxfp4", cfg, tensors, "OK")
    model("bad_gpt_oss_missing_scales", cfg,
          {k: t for k, t in tensors.items() if k != x + "gate_up_proj_scales"},
          "lacks tensor '%sgate_up_proj_scales'" % x)
    model("bad_gpt_oss_blocks_f32", cfg,
          dict(tensors, **{x + "down_proj_blocks": ([2, 32, 1, 16], "F32")}),
          "'%sdown_proj_blocks' has dtype F32, expected U8" % x)
    model("bad_gpt_oss_blocks_shape", cfg,
          dict(tensors, **{x + "gate_up_proj_blocks": ([2, 32, 1, 16], "U8")}),
          "'%sgate_up_proj_blocks' has shape [2, 32, 1, 16], expected [2, 64, 1, 16]" % x)
    model("bad_gpt_oss_nan_scale", cfg,
          dict(tensors, **{x + "down_proj_scales": ([2, 32, 1], "U8", b"\xff" * 64)}),
          "'%sdown_proj_scales' holds the E8M0 NaN code 255" % x)
    model("bad_gpt_oss_missing_sinks", cfg,
          {k: t for k, t in tensors.items() if not k.endswith("sinks")},
          "lacks tensor 'model.layers.0.self_attn.sinks'")
    bf16 = {k: t for k, t in tensors.items() if "_blocks" not in k and "_scales" not in k}
    bf16[x + "gate_up_proj"] = ([2, 32, 64], "F32")
    bf16[x + "down_proj"] = ([2, 32, 32], "F32")
    plain = {k: val for k, val in cfg.items() if k != "quantization_config"}
    model("valid_micro_gpt_oss", plain, bf16, "OK")
    model("bad_gpt_oss_gate_up_transposed", plain,
          dict(bf16, **{x + "gate_up_proj": ([2, 64, 32], "F32")}),
          "'%sgate_up_proj' has shape [2, 64, 32], expected [2, 32, 64]" % x)


def write_model_file(path, tensors):
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name in sorted(tensors):
        shape, dtype = tensors[name][:2]
        raw = tensors[name][2] if len(tensors[name]) > 2 else None
        n = 1
        for d in shape:
            n *= d
        size = {"F32": 4, "I32": 4, "BF16": 2, "F8_E4M3": 1, "U8": 1}[dtype]
        if raw is None:
            # F8_E4M3: 0x38 is 1.0; F32 scales/weights 0, 0.25, 0.5, ...
            raw = f32(n) if dtype == "F32" else (
                b"\x38" * n if dtype == "F8_E4M3" else bytes(n * size))
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    put(os.path.relpath(path, ROOT), st_bytes(header, data), None)


def model_cases():
    cfg, tensors = micro_model()

    def model(name, cfg, tensors, msg, index=None):
        d = os.path.join(ROOT, "model", name)
        put(os.path.join("model", name, "config.json"), json.dumps(cfg, indent=1), None)
        if index is None:
            write_model_file(os.path.join(d, "model.safetensors"), tensors)
        else:
            for shard, names in index.items():
                if shard is not None:
                    write_model_file(os.path.join(d, shard), {n: tensors[n] for n in names})
        expected.append(("model/" + name, msg))

    model("valid_micro", cfg, tensors, "OK")
    missing = dict(tensors)
    del missing["model.layers.0.block_sparse_moe.experts.1.w2.weight"]
    model("bad_missing_tensor", cfg, missing,
          "lacks tensor 'model.layers.0.block_sparse_moe.experts.1.w2.weight'")
    wrong = dict(tensors, **{"lm_head.weight": ([8, 16], "F32")})
    model("bad_wrong_shape", cfg, wrong, "has shape [8, 16], expected [16, 8]")
    ints = dict(tensors, **{"model.norm.weight": ([8], "I32")})
    model("bad_int_dtype", cfg, ints, "has dtype I32")
    model("bad_config_topk", dict(cfg, num_experts_per_tok=3), tensors,
          "num_experts_per_tok (3) exceeds")
    # Sharded: the index names a shard that is not there.
    names = sorted(tensors)
    d = "model/bad_index_missing_shard"
    put(d + "/config.json", json.dumps(cfg, indent=1), None)
    write_model_file(os.path.join(ROOT, d, "model-00001-of-00002.safetensors"),
                     {n: tensors[n] for n in names[:5]})
    wm = {n: "model-00001-of-00002.safetensors" for n in names[:5]}
    wm.update({n: "model-00002-of-00002.safetensors" for n in names[5:]})
    put(d + "/model.safetensors.index.json",
        json.dumps({"metadata": {"total_size": 0}, "weight_map": wm}, indent=1), None)
    expected.append((d, "model-00002-of-00002.safetensors"))
    # Sharded: the index maps a tensor to a shard that lacks it.
    d = "model/bad_index_wrong_shard"
    put(d + "/config.json", json.dumps(cfg, indent=1), None)
    write_model_file(os.path.join(ROOT, d, "model-00001-of-00002.safetensors"),
                     {n: tensors[n] for n in names[:5]})
    write_model_file(os.path.join(ROOT, d, "model-00002-of-00002.safetensors"),
                     {n: tensors[n] for n in names[5:]})
    wm = {n: "model-00001-of-00002.safetensors" for n in names}
    put(d + "/model.safetensors.index.json", json.dumps({"weight_map": wm}, indent=1), None)
    expected.append((d, "which does not contain it"))
    # No weights at all.
    put("model/bad_no_weights/config.json", json.dumps(cfg, indent=1), None)
    expected.append(("model/bad_no_weights", "no model.safetensors"))
    fp8_cases(model, cfg, tensors)
    # DeepSeek: MLA tensors, the router's correction bias.
    cfg, tensors = micro_deepseek()
    model("valid_micro_deepseek_v3", cfg, tensors, "OK")
    no_bias = dict(tensors)
    del no_bias["model.layers.1.mlp.gate.e_score_correction_bias"]
    model("bad_deepseek_missing_score_bias", cfg, no_bias,
          "lacks tensor 'model.layers.1.mlp.gate.e_score_correction_bias'")
    kv_b = dict(tensors, **{"model.layers.1.self_attn.kv_b_proj.weight": ([8, 6], "F32")})
    model("bad_deepseek_kv_b_shape", cfg, kv_b,
          "'model.layers.1.self_attn.kv_b_proj.weight' has shape [8, 6], expected [8, 4]")
    plain_q = dict(tensors)
    for n in ("q_a_proj", "q_a_layernorm", "q_b_proj"):
        del plain_q["model.layers.0.self_attn.%s.weight" % n]
    plain_q["model.layers.0.self_attn.q_proj.weight"] = ([8, 8], "F32")
    model("bad_deepseek_q_proj_with_q_lora", cfg, plain_q,
          "lacks tensor 'model.layers.0.self_attn.q_a_proj.weight'")
    gpt_oss_cases(model)


def fp8_cases(model, cfg, tensors):
    """The micro model as an FP8 checkpoint with 4 x 4 blocks (DeepSeek-V3 /
    Qwen3 FP8 layout), valid and broken."""
    q = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
         "weight_block_size": [4, 4]}
    fcfg = dict(cfg, quantization_config=q)
    fp8 = dict(tensors)
    linear = [n for n in tensors if ("proj" in n or "experts" in n)]
    for name in linear:
        shape = tensors[name][0]
        fp8[name] = (shape, "F8_E4M3")
        fp8[name + "_scale_inv"] = ([-(-shape[0] // 4), -(-shape[1] // 4)], "F32")
    model("valid_micro_fp8", fcfg, fp8, "OK")
    w1 = "model.layers.0.block_sparse_moe.experts.1.w1.weight"
    missing = {k: v for k, v in fp8.items() if k != w1 + "_scale_inv"}
    model("bad_fp8_missing_scale", fcfg, missing, "lacks its scales '%s_scale_inv'" % w1)
    model("bad_fp8_scale_shape", fcfg, dict(fp8, **{w1 + "_scale_inv": ([2, 2], "F32")}),
          "of shape [2, 2], expected [1, 2]")
    model("bad_fp8_scale_dtype", fcfg, dict(fp8, **{w1 + "_scale_inv": ([1, 2], "I32")}),
          "of dtype I32; scales must be F32, BF16 or F16")
    nan = struct.pack("<2f", 1.0, float("nan"))
    model("bad_fp8_nan_scale", fcfg, dict(fp8, **{w1 + "_scale_inv": ([1, 2], "F32", nan)}),
          "scales must be finite and non-negative")
    model("bad_fp8_no_quant_config", cfg, fp8, "no fp8 quantization_config")
    model("bad_fp8_quant_method", dict(cfg, quantization_config=dict(q, quant_method="awq")),
          fp8, "quant_method 'awq' is not supported")
    norm = "model.layers.0.input_layernorm.weight"
    model("bad_fp8_norm", fcfg, dict(fp8, **{norm: ([8], "F8_E4M3")}),
          "only 2-D weights may be F8_E4M3")
    float_scaled = dict(tensors, **{w1 + "_scale_inv": ([1, 2], "F32")})
    model("bad_fp8_float_with_scale", fcfg, float_scaled,
          "only F8_E4M3 weights take block scales")


TRACE_HEADER = ('{"format":"moe-trace/1","model":"m","num_layers":2,'
                '"num_experts":4,"top_k":2}')


def trace_cases():
    """Seeds for fuzz_trace, and the inputs that once broke the reader."""
    put("trace/valid.jsonl", TRACE_HEADER + "\n" +
        '{"id":"a","phase":["prefill","decode"],"experts":[[[0,1],[2,3]],'
        '[[1,2],[0,3]]],"weights":[[[0.5,0.5],[0.7,0.3]],[[1,0],[0.2,0.8]]]}\n'
        '{"id":7,"phase":["decode"],"experts":[[[3,0],[1,2]]],'
        '"hints":[[[3],[1,2,0]]]}\n', None)
    put("trace/empty.jsonl", "", None)
    # A weight beyond float's range (converted with undefined behaviour), an
    # unsigned id and expert id beyond int64 (wrapped to negative numbers).
    put("trace/regress_float_range.jsonl", TRACE_HEADER + "\n" +
        '{"phase":["decode"],"experts":[[[0,1],[1,2]]],'
        '"weights":[[[1e300,0],[1,1]]]}\n', None)
    # Found by fuzz_trace (seed 1, input 109) on the reader before its float
    # range check: 1e308 became inf, which was written back as null.
    put("trace/regress_weight_1e308.jsonl", TRACE_HEADER + "\n" +
        '{"id":"a","phase":["prefill","decode"],"experts":[[[0,1],[2,3]],'
        '[[1,2],[0,3]]],"weights":[[[1e308,0.5],[0.7,0.3]],[[1,0],[0.2,0.8]]]}\n'
        '{"id":7,"phase":["decode"],"experts":[[[3,0],[1,2]]],'
        '"F32":[[[3],[1e308,2,0]]]}\n', None)
    put("trace/regress_uint64.jsonl", TRACE_HEADER + "\n" +
        '{"id":18446744073709551615,"phase":["decode"],'
        '"experts":[[[0,18446744073709551615],[1,2]]]}\n', None)


def eamc_file(layers, experts, sections):
    """An EAMC state file: header, then (tag, body) sections."""
    payload = b"".join(struct.pack("<IQ", tag, len(body)) + body
                       for tag, body in sections)
    h = 0xcbf29ce484222325
    for c in payload:
        h = ((h ^ c) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return (b"MOEEAMC\0" + struct.pack("<IIIIQQ", 1, layers, experts, 0,
                                        len(payload), h) + payload)


def eamc_cases():
    """Seeds for fuzz_eamc (2 layers x 3 experts), and a regression."""
    L, E = 2, 3
    part = struct.pack("<I", 2) + struct.pack("<If", 1, 2.0) + \
        struct.pack("<If", 4, 0.5)
    empty = struct.pack("<I", 0)
    records = struct.pack("<I", 2) + part + empty + empty + part
    reuse = struct.pack("<I", L) + struct.pack("<%dd" % (2 * L), 1, 2, 0, 3)
    lags = 1
    affinity = struct.pack("<I", lags) + struct.pack(
        "<%df" % (lags * L * E * (E + 1)),
        *[float(i % 5) for i in range(lags * L * E * (E + 1))])
    popularity = struct.pack("<I", L * E) + struct.pack(
        "<%dd" % (L * E), *[float(i) for i in range(L * E)])
    put("eamc/full.eamc", eamc_file(L, E, [(1, records), (2, reuse),
                                           (3, affinity), (4, popularity)]),
        None)
    put("eamc/records_only.eamc", eamc_file(L, E, [(1, records)]), None)
    put("eamc/empty.eamc", eamc_file(L, E, []), None)
    # 65536 layers x 2^31-1 experts with 2^15 lags: the affinity section's
    # byte count wrapped to 0 and the decoder tried to allocate 2^63 floats.
    put("eamc/regress_affinity_wrap.eamc",
        eamc_file(65536, 2147483647, [(3, struct.pack("<I", 32768))]), None)
    # Found by fuzz_eamc on the decoder before the shape was range-checked:
    # 0 experts decoded "fine" into a state the encoder then refused.
    put("eamc/regress_zero_experts.eamc", eamc_file(16794368, 0, []), None)


def main():
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    safetensors_cases()
    config_cases()
    model_cases()
    trace_cases()
    eamc_cases()
    import make_gguf_corpus  # corpus/gguf/ has its own manifest
    make_gguf_corpus.main()
    with open(os.path.join(ROOT, "expected.txt"), "w") as f:
        f.write("# path<TAB>expected error substring, or OK (see make_corpus.py)\n")
        for rel, msg in sorted(expected):
            f.write("%s\t%s\n" % (rel, msg))
    print("%d entries (%d malformed)" % (len(expected),
                                          sum(1 for _, m in expected if m != "OK")))


if __name__ == "__main__":
    main()
