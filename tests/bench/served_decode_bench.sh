#!/usr/bin/env bash
# Served decode against the engine alone (issue 29: "served decode within 5%
# of `moectl run`"): per expert format, moe-cached with every expert cached
# plus moe-worker (CPU backend, --cpu-threads T), and `moectl run` with the
# same threads, alternated PAIRS times; each side generates TOKENS greedy
# tokens (ignore_eos) after the same token-id prompt. Served: the worker's
# own tpot_ms (its request log); engine: moectl's time_per_output_token.
# Prints per format the pairs, the medians and served / engine (the median
# of the pair ratios beside the ratio of medians).
# usage: tests/bench/served_decode_bench.sh [BUILD_DIR]
#   env: MODEL (deploy/models/kjv-moe), FORMATS ("bf16 q8 q4"), PAIRS (5),
#        TOKENS (128), THREADS (2), PROMPT_LEN (20)
set -euo pipefail
build=${1:-build}
bin=$build/bin
model=${MODEL:-deploy/models/kjv-moe}
formats=${FORMATS:-bf16 q8 q4}
pairs=${PAIRS:-5}
tokens=${TOKENS:-128}
threads=${THREADS:-2}
prompt_len=${PROMPT_LEN:-20}
name=$(basename "$model")
py=/usr/bin/python3
work=$(mktemp -d /tmp/moe-served-decode.XXXXXX)
pids=""
# shellcheck source=tests/bench/bench_lib.sh
. "$(dirname "$0")/bench_lib.sh"
trap bench_cleanup EXIT

for b in moe-cached moe-worker moectl; do
  [ -x "$bin/$b" ] || { echo "no $bin/$b: build it first" >&2; exit 1; }
done
vocab=$($py -c "import json,sys; c=json.load(open(sys.argv[1]+'/config.json')); print(c['vocab_size'])" "$model")
ids=$($py -c "import sys; v=int(sys.argv[1]); print(','.join(str((7 + 37 * i) % (v - 10) + 5) for i in range(int(sys.argv[2]))))" "$vocab" "$prompt_len")

: >"$work/rows"
echo "model $model; $tokens greedy tokens after a $prompt_len-token prompt; $threads threads;" \
  "$pairs pairs per format, alternated; $(nproc) CPUs"
for f in $formats; do
  d="$work/$f"
  mkdir -p "$d"
  $bin/moe-cached --model "$name=$model" --listen "unix:$d/c.sock" --metrics-addr "" \
    --expert-format "$f" --cache-fraction 1 2>"$d/c.log" &
  cpid=$!
  pids="$cpid"
  wait_for_socket "$d/c.sock" $cpid || { cat "$d/c.log"; exit 1; }
  $bin/moe-worker --model "$model" --listen "unix:$d/w.sock" --cache "unix:$d/c.sock" \
    --cache-model "$name" --backend cpu --cpu-threads "$threads" --metrics-addr "" \
    --http-listen 127.0.0.1:0 --port-file "$d/ports.json" 2>"$d/w.log" &
  wpid=$!
  pids="$wpid $cpid"
  for _ in $(seq 600); do [ -s "$d/ports.json" ] && break; sleep 0.1; done
  port=$($py -c "import json,sys; print(json.load(open(sys.argv[1]))['http_port'])" "$d/ports.json")
  $py -c "import json,sys; print(json.dumps({'model': sys.argv[1], 'max_tokens': int(sys.argv[2]), \
'temperature': 0, 'ignore_eos': True, 'prompt': [int(x) for x in sys.argv[3].split(',')]}))" \
    "$name" "$tokens" "$ids" >"$d/body.json"
  served_once() {
    local before
    before=$(grep -c ' finished:' "$d/w.log" || true)
    curl -s -o /dev/null -H 'Content-Type: application/json' --data-binary "@$d/body.json" \
      "http://127.0.0.1:$port/v1/completions"
    for _ in $(seq 50); do
      [ "$(grep -c ' finished:' "$d/w.log" || true)" -gt "$before" ] && break
      sleep 0.1
    done
    grep ' finished:' "$d/w.log" | tail -1 | sed -n 's/.* tpot_ms=\([0-9.]*\).*/\1/p'
  }
  run_once() {
    "$bin/moectl" run --model "$model" --expert-format "$f" --cpu-threads "$threads" \
      --prompt-ids "$ids" --max-new-tokens "$tokens" --ignore-eos --json --warmup 1 |
      tail -1 | $py -c "import json,sys; print(1000 * json.load(sys.stdin)['usage']['time_per_output_token_seconds'])"
  }
  served_once >/dev/null  # warm-up request
  for i in $(seq "$pairs"); do
    if [ $((i % 2)) = 1 ]; then s=$(served_once); r=$(run_once); else r=$(run_once); s=$(served_once); fi
    echo "$f $s $r" >>"$work/rows"
  done
  kill -TERM $wpid $cpid
  wait $wpid $cpid 2>/dev/null || true
  pids=""
done
$py - "$work/rows" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f, s, r = line.split()
    rows.setdefault(f, []).append((float(s), float(r)))
print("| experts | served tpot ms | moectl run tpot ms | served / run (medians) | median of pair ratios [range] |")
print("|---|---|---|---|---|")
for f, ps in rows.items():
    s = statistics.median(p[0] for p in ps)
    r = statistics.median(p[1] for p in ps)
    q = [p[0] / p[1] for p in ps]
    print("| %s | %.3f | %.3f | %.3f | %.3f [%.3f-%.3f] |" % (f, s, r, s / r, statistics.median(q), min(q), max(q)))
PY
