#!/usr/bin/env bash
# "Will it be this fast?" (issue 28): moectl plan's predicted decode
# tokens/s beside what moectl serve, started with the same flags, measures
# over its HTTP API (below: two completions per round, so that neither
# the prompt nor the client counts). Prints the prediction, the measured
# median [min-max], the worker's own figure and their ratio.
# usage: tests/bench/plan_serve_bench.sh [BUILD_DIR]
#   env: ROUNDS (6), TOKENS (64), MODEL (deploy/models/kjv-moe),
#        FLAGS (plan/serve flags, default "--gpu-mem 0 --link-gbps 1")
set -euo pipefail
build=${1:-build}
bin=$build/bin
rounds=${ROUNDS:-6}
tokens=${TOKENS:-64}
model=${MODEL:-deploy/models/kjv-moe}
flags=${FLAGS:---gpu-mem 0 --link-gbps 1}
py=/usr/bin/python3
work=$(mktemp -d /tmp/moe-planserve.XXXXXX)
spid=""
cleanup() {
  [ -n "$spid" ] && kill -TERM "$spid" 2>/dev/null && wait "$spid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# shellcheck disable=SC2086  # FLAGS is a list of flags
$bin/moectl plan --model "$model" $flags --json >"$work/plan.json" 2>"$work/plan.err"
predicted=$($py -c "import json; print(json.load(open('$work/plan.json'))['predicted_decode_tokens_per_s'])")
port=$($py -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
# shellcheck disable=SC2086
$bin/moectl serve --model "$model" $flags --port "$port" >"$work/serve.out" 2>"$work/serve.err" &
spid=$!
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1 && break
  kill -0 "$spid" 2>/dev/null || { cat "$work/serve.err"; exit 1; }
  sleep 0.1
done

# One round: a TOKENS-token and a 1-token greedy completion of the same
# prompt, in alternating order; decode rate = (TOKENS - 1) / the difference
# of their wall times (curl's time_total: the prompt, the HTTP exchange and
# the client cancel out). Also the worker's own tpot_ms of the long request
# (its log line), for reference.
ask() {  # ask PROMPT_INDEX MAX_TOKENS -> seconds
  $py - "$model/heldout.txt" "$1" "$2" "$(basename "$model")" >"$work/body.json" <<'PY'
import json, sys
lines = [l.strip() for l in open(sys.argv[1]) if l.strip()]
print(json.dumps({"model": sys.argv[4], "prompt": lines[int(sys.argv[2])],
                  "max_tokens": int(sys.argv[3]), "temperature": 0, "ignore_eos": True}))
PY
  curl -s -o /dev/null -w '%{time_total}' -H 'Content-Type: application/json' \
    --data-binary @"$work/body.json" "http://127.0.0.1:$port/v1/completions"
}
ask 0 "$tokens" >/dev/null  # warm-up: first touch of every expert
rates=""
for r in $(seq "$rounds"); do
  if [ $((r % 2)) = 1 ]; then long=$(ask "$r" "$tokens"); short=$(ask "$r" 1)
  else short=$(ask "$r" 1); long=$(ask "$r" "$tokens"); fi
  rate=$($py -c "print(($tokens - 1) / max(1e-9, $long - $short))")
  echo "round $r: ${tokens} tokens ${long}s, 1 token ${short}s: decode $(printf '%.0f' "$rate") tokens/s"
  rates="$rates $rate"
done
tpots=$(grep -o 'generated_tokens='"$tokens"' [^ ]* tpot_ms=[0-9.]*' "$work/serve.err" | sed 's/.*tpot_ms=//' | tr '\n' ' ')
$py - "$predicted" "$tpots" $rates <<'PY'
import statistics, sys
predicted = float(sys.argv[1])
worker = [1e3 / float(t) for t in sys.argv[2].split()[1:]]  # the warm-up's is left out
rates = [float(x) for x in sys.argv[3:]]
med = statistics.median(rates)
print(f"predicted (moectl plan): {predicted:.0f} tokens/s")
print(f"measured (moectl serve, HTTP): median {med:.0f} [{min(rates):.0f}-{max(rates):.0f}] tokens/s")
if worker:
    print(f"worker's own tpot: median {statistics.median(worker):.0f} "
          f"[{min(worker):.0f}-{max(worker):.0f}] tokens/s")
print(f"predicted / measured: {predicted / med:.2f}")
PY
echo "plan: $(grep -E '^(start|  moe-)' -A0 "$work/serve.err" | tr '\n' ' ' | head -c 400)"
