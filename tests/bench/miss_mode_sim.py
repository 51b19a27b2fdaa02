#!/usr/bin/env python3
"""Where a miss is served, in the simulator: the table of issue 11.

For every benchmark trace and capacity (10/25/50% of all experts), at host
read bandwidth 60 and 200 GB/s, prints side by side in one run:
  - the best fetch-only policy's decode TPOT (every online policy, prefetch on),
  - the best `--miss-mode auto` policy's decode TPOT and its ratio to that,
  - the oracle static popularity placement (Fiddler's placement knowing the
    whole trace's counts, misses on the host or per miss: the better one),
    and auto's ratio to it,
all on the warm pass (`--passes 2`: the second replay of the trace, the
learned state of the first kept, as a restarted daemon with its state file).

Usage: tests/bench/miss_mode_sim.py BUILD_DIR [--traces DIR] [--extra NAME=FILE:MB:MS ...]
         [--only PREFIX] [--hosts 60,200] [--fracs 0.1,0.25,0.5] [--perfect]
--perfect adds the perfect predictor (policy `oracle`: Belady's eviction, and
copies behind and prefetches of exactly the experts used next) under auto,
prefetch on or off, the better one.
The traces are generated into DIR (default: a temporary directory) with
`moectl synth-trace`; the recorded traces in RECORDED (the trained model's
routing) are read from the repository; --extra adds another recorded trace
with its expert size (MB) and compute per layer (ms).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

FETCH_POLICIES = ["lru", "lfu", "lru-layer", "minvisit", "expertflow", "moe-infinity"]
AUTO_POLICIES = FETCH_POLICIES + ["static-popular", "static-layers"]
ORACLE = "static-popular-oracle"
# Belady's eviction plus copies behind and prefetches of exactly the experts
# used next: what a perfect predictor would reach (--perfect).
PERFECT = "oracle"

# name: (synth-trace arguments, expert MB, layer ms). Mixtral-like 32x8
# traces use 336 MB experts and 1 ms per layer; the many-expert ones 17 MB
# and 0.3 ms (the two link models).
TRACES = {
    "A (32x8 top-2)": (["--requests", "30", "--seed", "1"], 336, 1.0),
    "B (24x60 top-4)": (["--layers", "24", "--experts", "60", "--top-k", "4", "--groups", "24",
                         "--stickiness", "0.1", "--requests", "20", "--seed", "2"], 17, 0.3),
    "C (16x64 top-4)": (["--layers", "16", "--experts", "64", "--top-k", "4", "--groups", "10",
                         "--repeat", "0.3", "--in-set", "0.7", "--set-noise", "0.4",
                         "--layer-affinity", "0.6", "--requests", "24", "--seed", "3"], 17, 0.3),
    "mixtral-uniform": (["--regime", "mixtral-uniform"], 336, 1.0),
    "wide-256": (["--regime", "wide-256"], 17, 0.3),
}
# Recorded traces kept in the repository: name -> (path from the repository
# root, expert MB, layer ms). The trained model's routing on held-out text
# (deploy/models/kjv-moe, docs/benchmarks.md "Routing of the trained model"),
# replayed with the many-expert link model.
RECORDED = {
    "kjv-moe (6x16 top-2, trained)": ("tests/bench/traces/kjv-moe.jsonl", 17, 0.3),
}


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def simulate(moectl, trace, policies, frac, mode, mb, ms, host_gbps, prefetch="on"):
    cmd = [moectl, "simulate", "--trace", trace, "--policy", ",".join(policies),
           "--capacity-frac", str(frac), "--prefetch", prefetch, "--passes", "2",
           "--expert-mb", str(mb), "--layer-ms", str(ms), "--link-gbps", "25",
           "--miss-mode", mode, "--host-gbps", str(host_gbps), "--json"]
    rows = run(cmd)
    return {r["policy"]: r["tpot_ms"] for r in rows if r["policy"] in policies}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--traces", default="")
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--only", default="", help="run only the traces whose name starts so")
    ap.add_argument("--hosts", default="60,200", help="host GB/s values, comma separated")
    ap.add_argument("--fracs", default="0.1,0.25,0.5", help="capacity fractions")
    ap.add_argument("--perfect", action="store_true",
                    help="add the perfect predictor (policy oracle, --miss-mode auto)")
    a = ap.parse_args()
    moectl = os.path.join(a.build, "bin", "moectl")
    tdir = a.traces or tempfile.mkdtemp(prefix="miss-mode-sim.")
    os.makedirs(tdir, exist_ok=True)
    traces = []
    for name, (args, mb, ms) in TRACES.items():
        if not name.startswith(a.only):
            continue
        path = os.path.join(tdir, name.split()[0] + ".jsonl")
        if not os.path.exists(path):
            run([moectl, "synth-trace", "--out", path] + args)
        traces.append((name, path, mb, ms))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for name, (rel, mb, ms) in RECORDED.items():
        traces.append((name, os.path.join(root, rel), mb, ms))
    for spec in a.extra:
        name, rest = spec.split("=", 1)
        path, mb, ms = rest.rsplit(":", 2)
        traces.append((name, path, float(mb), float(ms)))

    traces = [t for t in traces if t[0].startswith(a.only)]
    worst_fetch, worst_oracle = 0.0, 0.0
    hosts = [float(h) for h in a.hosts.split(",")]
    fracs = [float(f) for f in a.fracs.split(",")]
    for host in hosts:
        print(f"\nlink 25 GB/s, host {host:g} GB/s, warm pass (--passes 2), decode TPOT ms")
        print("| trace | capacity | best fetch-only | best auto | auto / fetch | "
              "oracle static popularity | auto / oracle |" +
              (" perfect predictor | perfect / fetch |" if a.perfect else ""))
        print("|---|---|---|---|---|---|---|" + ("---|---|" if a.perfect else ""))
        for name, path, mb, ms in traces:
            head = json.loads(open(path).readline())
            for frac in fracs:
                if int(frac * head["num_layers"] * head["num_experts"]) < head["num_experts"]:
                    print(f"| {name} | {int(frac * 100)}% | below one layer's experts: "
                          "not a valid cache | | | | |")
                    continue
                fetch = simulate(moectl, path, FETCH_POLICIES, frac, "fetch", mb, ms, host)
                auto = simulate(moectl, path, AUTO_POLICIES, frac, "auto", mb, ms, host)
                oracle = min(simulate(moectl, path, [ORACLE], frac, m, mb, ms, host)[ORACLE]
                             for m in ("host", "auto"))
                bf = min(fetch, key=fetch.get)
                ba = min(auto, key=auto.get)
                r_fetch = auto[ba] / fetch[bf]
                r_oracle = auto[ba] / oracle
                worst_fetch = max(worst_fetch, r_fetch)
                worst_oracle = max(worst_oracle, r_oracle)
                extra = ""
                if a.perfect:
                    perfect = min(simulate(moectl, path, [PERFECT], frac, "auto", mb, ms,
                                           host, pf)[PERFECT] for pf in ("on", "off"))
                    extra = f" {perfect:.2f} | {perfect / fetch[bf]:.3f} |"
                print(f"| {name} | {int(frac * 100)}% | {fetch[bf]:.2f} ({bf}) | "
                      f"{auto[ba]:.2f} ({ba}) | {r_fetch:.3f} | {oracle:.2f} | {r_oracle:.3f} |"
                      + extra)
        sys.stdout.flush()
    print(f"\nworst auto / best fetch-only: {worst_fetch:.3f} (target <= 0.45); "
          f"worst auto / oracle placement: {worst_oracle:.3f} (target <= 1.0)")


if __name__ == "__main__":
    main()
