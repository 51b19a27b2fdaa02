#!/usr/bin/python3
"""Pre-gating predictions from the float64 numpy reference.

For greedy generation of --max-new-tokens tokens after --prompt-ids, prints
one JSON object: "tokens" (greedy), and "hints": for every decode iteration
(1 = the first token fed back) and every layer l with a MoE layer at
l + --distance, the top_k experts of that layer's router applied to layer
l's output (normed by that layer's post-attention norm), for the last token,
with "margin": the gap between the k-th and the (k+1)-th router logit (a
float32 engine may order near ties differently).

Independent of the C++ engine: it reuses only tests/reference/moe_reference.py.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import moe_reference as ref  # noqa: E402


def forward_with_outputs(model, ids, cache):
    """Like Model.forward, also returning each layer's output (last token)."""
    c = model.cfg
    ids = np.asarray(ids, dtype=np.int64)
    pos0 = 0 if cache[0]["k"] is None else cache[0]["k"].shape[0]
    cos, sin = model._rope(pos0 + np.arange(len(ids)))
    x = model.embed[ids]
    outputs = []
    for i in range(c.layers):
        lw = model._layer_weights(i)
        x = x + model._attention(lw, ref.rms_norm(x, lw["in_norm"], c.eps), cache[i], cos, sin,
                                 pos0)
        h = ref.rms_norm(x, lw["post_norm"], c.eps)
        if "dense" in lw:
            x = x + ref.swiglu(h, *lw["dense"])
        else:
            x = x + model._moe(lw, h)[0]
        outputs.append(x[-1].copy())
    x = ref.rms_norm(x, model._get("model.norm.weight"), c.eps)
    return x @ model.lm_head.T, outputs


def predict(model, output, target):
    c = model.cfg
    lw = model._layer_weights(target)
    logits = ref.rms_norm(output, lw["post_norm"], c.eps) @ lw["router"].T
    order = np.argsort(-logits, kind="stable")
    k = c.top_k
    margin = float(logits[order[k - 1]] - logits[order[k]]) if k < len(order) else 1e9
    return [int(e) for e in order[:k]], margin


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--max-new-tokens", type=int, required=True)
    ap.add_argument("--distance", type=int, required=True)
    args = ap.parse_args(argv)
    prompt = [int(s) for s in args.prompt_ids.split(",") if s.strip()]
    model = ref.Model(args.model)
    c = model.cfg
    cache = model.new_cache()
    logits, _ = forward_with_outputs(model, prompt, cache)
    tokens, hints = [], []
    for step in range(args.max_new_tokens):
        tok = int(np.argmax(ref.log_softmax(logits[-1])))
        tokens.append(tok)
        if step + 1 == args.max_new_tokens:
            break
        logits, outputs = forward_with_outputs(model, [tok], cache)
        for layer in range(c.layers):
            target = layer + args.distance
            if target >= c.layers or not c.is_sparse(target):
                continue
            experts, margin = predict(model, outputs[layer], target)
            hints.append({"iteration": step + 1, "moe_layer": model.moe_layers.index(target),
                          "experts": experts, "margin": margin})
    json.dump({"tokens": tokens, "hints": hints}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
