#!/usr/bin/python3
"""Routing statistics of moe-trace/1 files, one row per trace, side by side.

  tests/bench/trace_stats.py NAME=FILE [NAME=FILE ...] [--json]

Per trace (tokens of every request in order, prefill and decode alike):
  entropy    mean over MoE layers of the entropy of that layer's expert
             popularity (token counts), divided by log2(E): 1 = uniform,
             0 = one expert takes every token;
  top share  mean over layers of the most popular expert's share of the
             layer's routed slots (uniform: 1/E);
  shared     mean fraction of a token's top-k experts at a layer that the
             previous token of the same request also chose there
             (uniform random routing: about k/E);
  reuse p50 / p90
             reuse distance of (layer, expert): tokens since the same expert
             was last chosen at the same layer, within a request (first uses
             are not counted);
  hit@k/E    the fraction of (token, layer) choices that a per-layer LRU of
             k x 2 slots would serve (a quick locality figure).
"""
import argparse
import json
import math
import sys
from collections import OrderedDict


def read_trace(path):
    with open(path) as f:
        head = json.loads(f.readline())
        if head.get("format") != "moe-trace/1":
            raise SystemExit(f"{path}: not a moe-trace/1 file")
        reqs = [json.loads(line)["experts"] for line in f if line.strip()]
    return head, reqs


def stats(head, reqs):
    L, E, k = head["num_layers"], head["num_experts"], head["top_k"]
    counts = [[0] * E for _ in range(L)]
    shared_sum, shared_n = 0.0, 0
    dists = []
    lru_hits, lru_n = 0, 0
    slots = 2 * k
    for req in reqs:
        last = [dict() for _ in range(L)]
        lru = [OrderedDict() for _ in range(L)]
        prev = None
        for t, tok in enumerate(req):
            for layer, experts in enumerate(tok):
                for e in experts:
                    counts[layer][e] += 1
                    if e in last[layer]:
                        dists.append(t - last[layer][e])
                    last[layer][e] = t
                    c = lru[layer]
                    lru_n += 1
                    if e in c:
                        lru_hits += 1
                        c.move_to_end(e)
                    else:
                        c[e] = True
                        if len(c) > slots:
                            c.popitem(last=False)
                if prev is not None:
                    shared_sum += len(set(experts) & set(prev[layer])) / max(1, len(experts))
                    shared_n += 1
            prev = tok
    ent, top = [], []
    for row in counts:
        total = sum(row)
        if total == 0:
            continue
        p = [c / total for c in row if c > 0]
        ent.append(-sum(x * math.log2(x) for x in p) / math.log2(E))
        top.append(max(row) / total)
    dists.sort()

    def pct(q):
        return dists[min(len(dists) - 1, int(q * len(dists)))] if dists else float("nan")

    return {
        "layers": L, "experts": E, "top_k": k, "requests": len(reqs),
        "tokens": sum(len(r) for r in reqs),
        "entropy": sum(ent) / len(ent), "top_share": sum(top) / len(top),
        "shared": shared_sum / shared_n if shared_n else float("nan"),
        "random_shared": k / E,
        "reuse_p50": pct(0.5), "reuse_p90": pct(0.9),
        "lru2k_hit": lru_hits / lru_n if lru_n else float("nan"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+", help="NAME=FILE")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for spec in a.traces:
        name, _, path = spec.partition("=")
        if not path:
            ap.error(f"{spec}: expected NAME=FILE")
        head, reqs = read_trace(path)
        rows.append((name, stats(head, reqs)))
    if a.json:
        for name, s in rows:
            print(json.dumps({"trace": name, **s}))
        return
    print(f"{'trace':<18} {'shape':<12} {'tokens':>7} {'entropy':>8} {'top share':>9} "
          f"{'shared':>7} {'(random)':>8} {'reuse p50':>9} {'p90':>5} {'lru 2k hit':>10}")
    for name, s in rows:
        shape = f"{s['layers']}x{s['experts']} k{s['top_k']}"
        print(f"{name:<18} {shape:<12} {s['tokens']:>7} {s['entropy']:>8.3f} "
              f"{s['top_share']:>9.3f} {s['shared']:>7.3f} {s['random_shared']:>8.3f} "
              f"{s['reuse_p50']:>9} {s['reuse_p90']:>5} {s['lru2k_hit']:>10.3f}")


if __name__ == "__main__":
    sys.exit(main())
