#!/usr/bin/env bash
# The prefix cache (issue 27): time to first token of a long prompt the
# first time and when it comes again, with the cache on (the default,
# --prefix-cache-mb 1024) and off (0), on the trained model served by
# moe-cached + moe-worker (CPU backend, every expert resident). Each round
# sends a prompt no earlier round sent (a distinct first verse, so the first
# request cannot hit) and then the same prompt again; rounds alternate the
# two workers. TTFT is curl's time_total of a 1-token completion (the prompt
# is all the work). Also checks that a 16-token greedy completion of the
# repeated prompt is the same text with and without the cache.
# Prints median [min-max] ms per (worker, first|repeat), the repeat/first
# ratio, and the cached_tokens the repeats reported.
# usage: tests/bench/prefix_bench.sh [BUILD_DIR]
#   env: ROUNDS (5), TOKENS (about 400: prompt length), MODEL (deploy/models/kjv-moe)
set -euo pipefail
build=${1:-build}
bin=$build/bin
rounds=${ROUNDS:-5}
want_tokens=${TOKENS:-400}
model=${MODEL:-deploy/models/kjv-moe}
py=/usr/bin/python3
work=$(mktemp -d /tmp/moe-prefix.XXXXXX)
pids=""
# shellcheck source=tests/bench/bench_lib.sh
. "$(dirname "$0")/bench_lib.sh"
trap bench_cleanup EXIT

name=$(basename "$model")
experts=$($py -c "import json; c=json.load(open('$model/config.json')); \
print(c['num_hidden_layers'] * c['num_local_experts'])")
$bin/moe-cached --model "$name=$model" --listen "unix:$work/c.sock" --metrics-addr "" \
  --cache-experts "$experts" --policy lru --prefetch off 2>"$work/cached.log" &
cpid=$!
pids="$cpid"
wait_for_socket "$work/c.sock" $cpid || { cat "$work/cached.log"; exit 1; }

declare -A port
for mb in 1024 0; do
  $bin/moe-worker --model "$model" --listen "unix:$work/w$mb.sock" --cache "unix:$work/c.sock" \
    --cache-model "$name" --backend cpu --metrics-addr "" --prefix-cache-mb "$mb" \
    --http-listen 127.0.0.1:0 --port-file "$work/ports$mb.json" 2>"$work/worker$mb.log" &
  pids="$! $pids"
  for _ in $(seq 300); do [ -s "$work/ports$mb.json" ] && break; sleep 0.1; done
  port[$mb]=$($py -c "import json; print(json.load(open('$work/ports$mb.json'))['http_port'])")
done

# prompt ROUND: about $want_tokens tokens of held-out text, led by a verse
# of its own so that no two rounds share a first block.
prompt() {
  $py - "$model" "$1" "$want_tokens" <<'PY'
import sys
model, r, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lines = [l.strip() for l in open(model + "/heldout.txt") if l.strip()]
lead = lines[(r * 37) % len(lines)]
body = " ".join(lines[:200])
words = body.split()
# about 1.3 tokens per word for this tokenizer; the server reports the count
print(lead + " " + " ".join(words[: int(want / 1.3)]))
PY
}

# ask PORT PROMPT_FILE MAX_TOKENS: prints "ms cached_tokens prompt_tokens text"
ask() {
  $py - "$2" "$name" "$3" >"$work/body.json" <<'PY'
import json, sys
print(json.dumps({"model": sys.argv[2], "prompt": open(sys.argv[1]).read().strip(),
                  "max_tokens": int(sys.argv[3]), "temperature": 0}))
PY
  local t
  t=$(curl -s -o "$work/resp.json" -w '%{time_total}' -H 'Content-Type: application/json' \
    --data-binary @"$work/body.json" "http://127.0.0.1:$1/v1/completions")
  $py - "$t" "$work/resp.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))
u = r["usage"]
print("%.3f" % (float(sys.argv[1]) * 1e3), u["prompt_tokens_details"]["cached_tokens"],
      u["prompt_tokens"], json.dumps(r["choices"][0]["text"]))
PY
}

: >"$work/times"
echo "model $model; prompt about $want_tokens tokens; $rounds rounds; $(nproc) CPUs"
prompt 999 >"$work/warm.txt"
for mb in 1024 0; do ask "${port[$mb]}" "$work/warm.txt" 1 >/dev/null; done
for r in $(seq "$rounds"); do
  prompt "$r" >"$work/p$r.txt"
  order="1024 0"
  if [ $((r % 2)) = 0 ]; then order="0 1024"; fi
  for mb in $order; do
    # Round r's prompt is new to both workers: each sees it first, then again.
    read -r ms cached n _ < <(ask "${port[$mb]}" "$work/p$r.txt" 1)
    echo "mb$mb first $ms $cached $n" >>"$work/times"
    read -r ms cached n _ < <(ask "${port[$mb]}" "$work/p$r.txt" 1)
    echo "mb$mb repeat $ms $cached $n" >>"$work/times"
  done
done
text_on=$(ask "${port[1024]}" "$work/p1.txt" 16 | cut -d' ' -f4-)
text_off=$(ask "${port[0]}" "$work/p1.txt" 16 | cut -d' ' -f4-)

$py - "$work/times" "$text_on" "$text_off" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
by = {}
cached = {}
for cfg, kind, ms, c, n in rows:
    by.setdefault((cfg, kind), []).append(float(ms))
    cached.setdefault((cfg, kind), []).append((int(c), int(n)))
def med(v):
    return statistics.median(v)
print("%-24s %24s %24s %8s" % ("worker", "first ms", "repeat ms", "repeat/first"))
for cfg, label in (("mb1024", "--prefix-cache-mb 1024"), ("mb0", "--prefix-cache-mb 0")):
    f, r = by[(cfg, "first")], by[(cfg, "repeat")]
    print("%-24s %10.1f [%.1f-%.1f] %10.1f [%.1f-%.1f] %8.2f" % (
        label, med(f), min(f), max(f), med(r), min(r), max(r), med(r) / med(f)))
c = cached[("mb1024", "repeat")]
print("repeats with the cache: cached_tokens / prompt_tokens = %s" %
      ", ".join("%d/%d" % x for x in c))
print("first requests with the cache: cached_tokens = %s" %
      ", ".join(str(x[0]) for x in cached[("mb1024", "first")]))
print("16 greedy tokens of the repeated prompt, cache on and off: %s" %
      ("same text" if sys.argv[2] == sys.argv[3] else "DIFFERENT: %s vs %s" % (sys.argv[2], sys.argv[3])))
PY
