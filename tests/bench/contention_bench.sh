#!/usr/bin/env bash
# Fair under contention (issue 32): how much slower a served request gets
# beside one busy loop per core, against the in-process engine under the
# same load. The trained model is served on the CPU backend two ways: by
# moe-worker alone (setup "alone": every expert in the worker, as `moectl
# serve` starts it on a machine without a GPU) and by moe-cached +
# moe-worker (setup "daemon": every expert resident in moe-cached, so the
# time is compute and hand-offs, not copies); each request is a 32-token
# greedy HTTP completion timed by curl (time_total). Per worker
# configuration (setup x --max-batch 1 and 16) and per round: REQS requests
# idle, REQS beside the busy loops, REQS idle again; rounds alternate, so
# drift of a shared machine hits every phase alike. The fair reference is `moectl run` of the
# same prompt and length under the same phases (its own generation time:
# TTFT + (n-1) x TPOT, not the model load).
# Prints, per configuration, median [min-max] ms of each phase, the
# slowdown (busy median / idle median, both idle phases pooled), and the
# served slowdown over the engine's. /proc/loadavg is printed at each phase.
# usage: tests/bench/contention_bench.sh [BUILD_DIR]
#   env: ROUNDS (2), REQS (6), NEW_TOKENS (32), BATCHES ("1 16"),
#        SETUPS ("alone daemon"),
#        MODEL (deploy/models/kjv-moe), HOGS (busy loops, default nproc),
#        PROMPT ("In the beginning God created"), KEEP_WORK=1,
#        SPIN (exported as MOE_SPIN to every process: "legacy" restores the
#        fixed spin of before issue 32, for the "before" column)
set -euo pipefail
build=${1:-build}
bin=$build/bin
rounds=${ROUNDS:-2}
reqs=${REQS:-6}
new_tokens=${NEW_TOKENS:-32}
batches=${BATCHES:-1 16}
setups=${SETUPS:-alone daemon}
model=${MODEL:-deploy/models/kjv-moe}
hogs_n=${HOGS:-$(nproc)}
prompt=${PROMPT:-In the beginning God created}
py=/usr/bin/python3
if [ -n "${SPIN:-}" ]; then export MOE_SPIN=$SPIN; fi

work=$(mktemp -d /tmp/moe-contention.XXXXXX)
pids=""
hogs=""
stop_hogs() {
  for p in $hogs; do kill "$p" 2>/dev/null || true; done
  for p in $hogs; do wait "$p" 2>/dev/null || true; done
  hogs=""
}
start_hogs() {
  for _ in $(seq "$hogs_n"); do
    bash -c 'while :; do :; done' &
    hogs="$hogs $!"
  done
  sleep 0.5  # let the scheduler spread them
}
cleanup() {
  stop_hogs
  for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
# shellcheck source=tests/bench/bench_lib.sh
. "$(dirname "$0")/bench_lib.sh"

name=$(basename "$model")
experts=$($py -c "import json; c=json.load(open('$model/config.json')); \
print(c['num_hidden_layers'] * c['num_local_experts'])")
body=$($py -c "import json,sys; print(json.dumps({'model': sys.argv[1], 'prompt': sys.argv[2], \
'max_tokens': int(sys.argv[3]), 'temperature': 0}))" "$name" "$prompt" "$new_tokens")

# served_once PORT TAG: one completion; appends "TAG ms tokens" to $work/times.
served_once() {
  local t
  t=$(curl -s -o "$work/resp.json" -w '%{time_total}' -H 'Content-Type: application/json' \
    -d "$body" "http://127.0.0.1:$1/v1/completions")
  $py - "$2" "$t" "$work/resp.json" >>"$work/times" <<'PY'
import json, sys
tag, t, path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
n = json.load(open(path)).get("usage", {}).get("completion_tokens", -1)
print(tag, "%.3f" % (t * 1e3), n)
PY
}

# engine_once TAG: one `moectl run`; appends "TAG ms tokens" (generation only).
engine_once() {
  $bin/moectl run --model "$model" --device cpu --prompt "$prompt" \
    --max-new-tokens "$new_tokens" --ignore-eos --json 2>/dev/null | tail -1 |
    $py -c 'import json,sys
u = json.load(sys.stdin)["usage"]; n = u["generated_tokens"]
ms = (u["time_to_first_token_seconds"] + (n - 1) * u["time_per_output_token_seconds"]) * 1e3
print(sys.argv[1], "%.3f" % ms, n)' "$1" >>"$work/times"
}

# phases CONFIG COMMAND...: ROUNDS x (idle, busy, idle again), REQS calls each.
phases() {
  local cfg=$1; shift
  for r in $(seq "$rounds"); do
    for phase in idle busy idle2; do
      if [ "$phase" = busy ]; then start_hogs; fi
      echo "  $cfg round $r $phase: loadavg $(cut -d' ' -f1-4 /proc/loadavg)"
      for _ in $(seq "$reqs"); do "$@" "$cfg.$phase"; done
      if [ "$phase" = busy ]; then stop_hogs; fi
    done
  done
}

: >"$work/times"
echo "model $model ($experts experts, all resident); $new_tokens tokens greedy; $hogs_n busy loops;" \
  "$rounds rounds x $reqs requests per phase; MOE_SPIN=${MOE_SPIN:-(unset)}; $(nproc) CPUs"
cpid=""
case " $setups " in
  *" daemon "*)
    $bin/moe-cached --model "$name=$model" --listen "unix:$work/c.sock" --metrics-addr "" \
      --cache-experts "$experts" --policy lru --prefetch off 2>"$work/cached.log" &
    cpid=$!
    pids="$cpid"
    wait_for_socket "$work/c.sock" $cpid || { cat "$work/cached.log"; exit 1; }
    ;;
esac
for mb in $batches; do
  for setup in $setups; do
    case $setup in
      alone) experts_from=(--cache none) ;;
      daemon) experts_from=(--cache "unix:$work/c.sock" --cache-model "$name") ;;
      *) echo "unknown setup '$setup' (alone, daemon)" >&2; exit 2 ;;
    esac
    rm -f "$work/ports.json" "$work/w.sock"
    $bin/moe-worker --model "$model" --listen "unix:$work/w.sock" "${experts_from[@]}" \
      --backend cpu --metrics-addr "" --max-batch "$mb" \
      --http-listen 127.0.0.1:0 --port-file "$work/ports.json" 2>"$work/worker-$setup-$mb.log" &
    wpid=$!
    pids="$wpid $cpid"
    for _ in $(seq 300); do [ -s "$work/ports.json" ] && break; sleep 0.1; done
    port=$($py -c "import json; print(json.load(open('$work/ports.json'))['http_port'])")
    for _ in 1 2 3; do served_once "$port" warmup; done
    phases "$setup-mb$mb" served_once "$port"
    kill -TERM $wpid; wait $wpid || true
    pids="$cpid"
  done
done
engine_once warmup
phases engine engine_once

$py - "$work/times" "$new_tokens" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
want = int(sys.argv[2])
short = [r for r in rows if r[0] != "warmup" and int(r[2]) != want]
if short:
    print("note: %d requests gave fewer than %d tokens" % (len(short), want))
by = {}
for tag, ms, _ in rows:
    if tag != "warmup":
        by.setdefault(tag, []).append(float(ms))
def fmt(v):
    return "%7.1f [%.1f-%.1f]" % (statistics.median(v), min(v), max(v))
cfgs = sorted({t.rsplit(".", 1)[0] for t in by}, key=lambda c: (c == "engine", c))
print("%-12s %22s %22s %22s %9s" % ("config", "idle ms", "busy ms", "idle again ms", "slowdown"))
slow = {}
for c in cfgs:
    idle = by[c + ".idle"] + by[c + ".idle2"]
    slow[c] = statistics.median(by[c + ".busy"]) / statistics.median(idle)
    print("%-12s %22s %22s %22s %8.2fx" % (c, fmt(by[c + ".idle"]), fmt(by[c + ".busy"]),
                                          fmt(by[c + ".idle2"]), slow[c]))
for c in cfgs:
    if c != "engine":
        print("%s: served slowdown / engine slowdown = %.2f" % (c, slow[c] / slow["engine"]))
PY
