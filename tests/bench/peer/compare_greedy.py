#!/usr/bin/python3
"""Greedy tokens of `moectl run` against llama.cpp's on the same GGUF file
(tests/bench/peer/gguf_agreement.sh): per prompt, the tokens up to the
first difference, and how close the two engines' log-probs are.

llama.cpp's side is given: its tokens (`llama_driver gen`, one line per
prompt) and its logits at every step (`gen --logits`, n_vocab f32 each).
Ours is run here: `moectl run --prompt-ids ... --json --top-logprobs K`
per prompt. At each step both engines saw the same prefix (the tokens so
far are equal), so their log-probs of our top-K tokens are compared; at
the first difference the gap between the two tokens is reported in both
engines' log-probs (a near tie when both are small).

usage: compare_greedy.py --moectl BIN --model GGUF --prompts FILE
                         --theirs TOKENS --logits FILE [--n-gen 16]
                         [--threads 2] [--top 20] [--label NAME]
Prints one JSON object on stdout.
"""
import argparse
import json
import subprocess
import sys

import numpy as np


def log_softmax(v):
    v = v.astype(np.float64)
    v = v - v.max()
    return v - np.log(np.exp(v).sum())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moectl", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--theirs", required=True)
    ap.add_argument("--logits", required=True)
    ap.add_argument("--n-gen", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    prompts = [l.strip() for l in open(a.prompts) if l.strip()]
    theirs = [[int(t) for t in l.split(",")] for l in open(a.theirs) if l.strip()]
    if len(theirs) != len(prompts) or any(len(t) != a.n_gen for t in theirs):
        sys.exit("compare_greedy: llama.cpp's tokens do not match the prompts / --n-gen")
    raw = np.fromfile(a.logits, dtype=np.float32)
    steps = len(prompts) * a.n_gen
    if raw.size == 0 or raw.size % steps:
        sys.exit(f"compare_greedy: {a.logits} holds {raw.size} floats, not a multiple of {steps}")
    logits = raw.reshape(len(prompts), a.n_gen, raw.size // steps)
    equal, deltas, divergences, whole = 0, [], [], 0
    for p, (ids, th) in enumerate(zip(prompts, theirs)):
        run = subprocess.run(
            [a.moectl, "run", "--model", a.model, "--prompt-ids", ids,
             "--max-new-tokens", str(a.n_gen), "--ignore-eos", "--json",
             "--top-logprobs", str(a.top), "--cpu-threads", str(a.threads)],
            capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"compare_greedy: moectl run failed:\n{run.stderr}")
        steps_ours = [json.loads(l) for l in run.stdout.splitlines()
                      if l.startswith('{"token_id"')]
        if len(steps_ours) != a.n_gen:
            sys.exit(f"compare_greedy: moectl gave {len(steps_ours)} tokens, not {a.n_gen}")
        for s, step in enumerate(steps_ours):
            lp = log_softmax(logits[p, s])
            alts = {alt["token_id"]: alt["logprob"] for alt in step["top_logprobs"]}
            deltas.append(max(abs(v - lp[t]) for t, v in alts.items()))
            ours = step["token_id"]
            if ours != th[s]:
                divergences.append({
                    "prompt": p, "step": s, "ours": ours, "theirs": th[s],
                    # > 0: each engine prefers its own token by this much
                    "gap_ours": round(alts[ours] - alts[th[s]], 5) if th[s] in alts else None,
                    "gap_theirs": round(float(lp[th[s]] - lp[ours]), 5)})
                break
            equal += 1
        else:
            whole += 1
    print(json.dumps({
        "label": a.label, "tokens_equal": equal, "tokens": steps,
        "prompts_equal": whole, "prompts": len(prompts),
        "dlogprob_median": round(float(np.median(deltas)), 6),
        "dlogprob_max": round(float(np.max(deltas)), 6),
        "divergences": divergences}))


if __name__ == "__main__":
    main()
