#!/usr/bin/env bash
# The first request after start against the next ones (issue 29 item 4):
# a fresh moe-cached + moe-worker (CPU) per round, REQS one-token
# completions of different long prompts (the same text behind a different
# first word, so the prefix cache does not apply), timed by the worker's
# own ttft_ms (its request log). Rounds alternate `--warmup-tokens 0` and
# the default warm-up, so drift of a shared machine hits both alike.
# Prints per round the first request's ms, the others', and first / median
# of the others; then the median ratio per side.
# usage: tests/bench/first_request_bench.sh [BUILD_DIR]
#   env: ROUNDS (3 per side), REQS (4), MODEL (deploy/models/kjv-moe),
#        REPEAT (18: copies of the prompt's sentence, ~250 tokens),
#        DAEMON_FLAGS (more moe-cached flags, e.g. "--miss-mode auto"),
#        KEEP (a file to append the worker's request log lines to: stall_ms etc.)
set -euo pipefail
build=${1:-build}
bin=$build/bin
rounds=${ROUNDS:-3}
reqs=${REQS:-4}
model=${MODEL:-deploy/models/kjv-moe}
repeat=${REPEAT:-18}
name=$(basename "$model")
py=/usr/bin/python3
work=$(mktemp -d /tmp/moe-first.XXXXXX)
pids=""
# shellcheck source=tests/bench/bench_lib.sh
. "$(dirname "$0")/bench_lib.sh"
trap bench_cleanup EXIT

words=(Behold Verily Now Then Lo Thus And But)
sentence="And God said, Let there be light: and there was light."

# round TAG WARMUP_TOKENS: appends "TAG first rest..." to $work/rows.
round() {
  local tag=$1 warm=$2 d="$work/$1.$RANDOM"
  mkdir -p "$d"
  $bin/moe-cached --model "$name=$model" --listen "unix:$d/c.sock" --metrics-addr "" \
    --policy lru ${DAEMON_FLAGS:-} 2>"$d/c.log" &
  local cpid=$!
  pids="$cpid"
  wait_for_socket "$d/c.sock" $cpid || { cat "$d/c.log"; exit 1; }
  $bin/moe-worker --model "$model" --listen "unix:$d/w.sock" --cache "unix:$d/c.sock" \
    --cache-model "$name" --backend cpu --metrics-addr "" --http-listen 127.0.0.1:0 \
    --port-file "$d/ports.json" --warmup-tokens "$warm" 2>"$d/w.log" &
  local wpid=$!
  pids="$wpid $cpid"
  for _ in $(seq 600); do [ -s "$d/ports.json" ] && break; sleep 0.1; done
  local port
  port=$($py -c "import json,sys; print(json.load(open(sys.argv[1]))['http_port'])" "$d/ports.json")
  for i in $(seq 0 $((reqs - 1))); do
    $py -c "import json,sys; print(json.dumps({'model': sys.argv[1], 'max_tokens': 1, \
'temperature': 0, 'prompt': sys.argv[2] + ' ' + ' '.join([sys.argv[3]] * int(sys.argv[4]))}))" \
      "$name" "${words[$((i % ${#words[@]}))]}" "$sentence" "$repeat" >"$d/body.json"
    curl -s -o /dev/null -H 'Content-Type: application/json' --data-binary "@$d/body.json" \
      "http://127.0.0.1:$port/v1/completions"
  done
  for _ in $(seq 50); do
    [ "$(grep -c ' finished:' "$d/w.log" || true)" -ge "$reqs" ] && break
    sleep 0.1
  done
  echo "$tag $(sed -n 's/.* finished:.* ttft_ms=\([0-9.]*\).*/\1/p' "$d/w.log" | tr '\n' ' ')" \
    >>"$work/rows"
  [ -n "${KEEP:-}" ] && grep " finished:" "$d/w.log" >>"$KEEP"
  kill -TERM $wpid $cpid
  wait $wpid $cpid 2>/dev/null || true
  pids=""
}

: >"$work/rows"
echo "model $model; $reqs one-token completions of ~$((repeat * 14))-token prompts per round;" \
  "$rounds rounds per side, alternating; $(nproc) CPUs"
for _ in $(seq "$rounds"); do
  round cold 0
  round warm 256
done
$py - "$work/rows" <<'PY'
import statistics, sys
ratios = {}
print("%-5s %9s  %-28s %s" % ("side", "first ms", "next ms", "first / median(next)"))
for line in open(sys.argv[1]):
    tag, *ms = line.split()
    ms = [float(x) for x in ms]
    r = ms[0] / statistics.median(ms[1:])
    ratios.setdefault(tag, []).append(r)
    print("%-5s %9.1f  %-28s %.2f" % (tag, ms[0], " ".join("%.1f" % x for x in ms[1:]), r))
for tag, rs in ratios.items():
    print("%s: first / next median %.2f [%.2f-%.2f]" % (tag, statistics.median(rs), min(rs), max(rs)))
PY
