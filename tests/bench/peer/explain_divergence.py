#!/usr/bin/python3
"""Why two engines' greedy tokens part: the float64 reference's view.

tests/bench/peer_bench.sh calls it when ours and llama.cpp pick different
tokens at a step where our log-probs show no near-tie. On a random model,
the usual cause is a router near-tie earlier in the sequence: two experts'
router logits within ~1e-3, so llama.cpp's activation rounding (bf16 in BF16
products, 8 bits in Q8_0 ones) picks the other expert at that position, and
the changed hidden state / KV entry moves later logits by far more than a
near-tie.

This teacher-forces the common prefix (prompt + the tokens both engines
agreed on) through tests/reference/moe_reference.py (float64, numpy) and:
  1. reports the reference's greedy token at the divergent step (for bf16
     experts it should be ours: our engine keeps f32 activations);
  2. lists the router decisions of the prefix whose 2nd-chosen and best
     unchosen router logits are within --router-gap (default 0.02), closest
     first, and for each of the --max-flips closest ones runs the prefix
     again with that one decision flipped (the unchosen expert replaces the
     2nd chosen one, its logit raised just above). If a single flip makes the
     reference's argmax llama.cpp's token, the divergence is explained.

usage: explain_divergence.py --model DIR --prompt-ids IDS --common IDS
                             --ours ID --theirs ID [--router-gap G] [--max-flips N]
Prints one JSON object: reference_token, candidates [[layer, position, gap]],
explained_by ([layer, position, gap] or null), flips_tried.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "reference"))
import moe_reference as mr  # noqa: E402


class Probe:
    """Replaces Model._moe (mixtral branch): records router gaps and can flip
    one decision (layer, position)."""

    def __init__(self):
        self.flip = None
        self.gaps = []  # per MoE call (layer order): gap per position
        self.layer = 0

    def moe(self, model, lw, x):
        c = model.cfg
        logits = x @ lw["router"].T  # [T, E]
        order = np.argsort(-logits, axis=-1, kind="stable")
        rows = np.arange(x.shape[0])
        k = c.top_k
        self.gaps.append(logits[rows, order[:, k - 1]] - logits[rows, order[:, k]])
        if self.flip is not None and self.flip[0] == self.layer:
            p = self.flip[1]
            logits = logits.copy()
            logits[p, order[p, k]] = logits[p, order[p, k - 1]] + 1e-9
        self.layer += 1
        probs = mr.softmax(logits)
        out = np.zeros_like(x)
        chosen = []
        for t in range(x.shape[0]):
            sel = np.argsort(-probs[t], kind="stable")[:k]
            w = probs[t, sel]
            if c.norm_topk:
                w = w / np.sum(w)
            for e, wgt in zip(sel, w):
                out[t] += wgt * mr.swiglu(x[t], *lw["experts"][e])
            chosen.append([int(e) for e in sel])
        return out, chosen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--common", default="")
    ap.add_argument("--ours", type=int, required=True)
    ap.add_argument("--theirs", type=int, required=True)
    ap.add_argument("--router-gap", type=float, default=0.02)
    ap.add_argument("--max-flips", type=int, default=6)
    a = ap.parse_args()
    ids = [int(x) for x in a.prompt_ids.split(",") if x] + [int(x) for x in a.common.split(",") if x]
    model = mr.load_model(a.model)
    if model.cfg.family != "mixtral":
        sys.exit("explain_divergence: only mixtral models")
    probe = Probe()
    mr.Model._moe = lambda self, lw, x: probe.moe(self, lw, x)

    def run(flip):
        probe.flip, probe.gaps, probe.layer = flip, [], 0
        logits, _ = model.forward(ids, model.new_cache())
        return mr.log_softmax(logits[-1]), np.stack(probe.gaps)

    lp, gaps = run(None)
    ref = int(np.argmax(lp))
    cands = sorted((float(gaps[l, p]), l, p) for l in range(gaps.shape[0])
                   for p in range(gaps.shape[1]) if gaps[l, p] < a.router_gap)
    result = {"reference_token": ref,
              "reference_gap_ours_theirs": float(lp[a.ours] - lp[a.theirs]),
              "candidates": [[l, p, round(g, 6)] for g, l, p in cands],
              "explained_by": None, "flips_tried": 0}
    for g, l, p in cands[:a.max_flips]:
        result["flips_tried"] += 1
        flp, _ = run((l, p))
        if int(np.argmax(flp)) == a.theirs:
            result["explained_by"] = [l, p, round(g, 6)]
            break
    print(json.dumps(result))


if __name__ == "__main__":
    main()
