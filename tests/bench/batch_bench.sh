#!/usr/bin/env bash
# Continuous batching (issue 14 item 6): total decode tokens/s, p50/p99 TPOT
# and TTFT, and expert bytes moved per generated token, at 1, 4 and 16
# concurrent streams, for today's one-at-a-time runner (--max-batch 1) and
# the batched runner (--max-batch 16; BATCH=0: moe-worker's default, auto),
# side by side in one run, through the
# real moe-cached (emulated link, a cache smaller than the model) and
# moe-worker (CPU backend). The two runners alternate per stream count so
# that drift of this shared CPU hits both alike.
# Each wave is STREAMS concurrent requests from one `moectl generate
# --prompts-file --concurrency STREAMS` process (CLIENT=processes: one
# `moectl generate` process per stream, as before 2026-12-04, whose start-up
# competes with the worker for the CPU); WAVES waves back to back;
# tokens/s = generated tokens of all streams / wall time of the wave (the
# client's, first request sent to last finished); TTFT and TPOT are the worker's own per-request figures (TTFT counts
# queueing from the worker's Submit). The decode gain line is decode as the
# clients see it (STREAMS x one's p50 TPOT / batch's p50 TPOT: a batch's
# TPOT also holds the prompt chunks of streams that joined after it
# started); the decode step gain line is decode alone by means, the figure
# to set beside engine_bench --batch-only's in-process gain, which counts no
# prompt (the one-at-a-time mean TPOT against the worker's mean batched step
# in which every sequence decoded, moe_worker_decode_step_seconds, times
# its mean batch). Greedy requests: the texts of each
# request under both runners are compared (a line per stream count).
# usage: tests/bench/batch_bench.sh [BUILD_DIR]  (env: LINK_GBPS (1), CAP
#        (experts cached, default half), NEW_TOKENS (32), WAVES (2),
#        STREAMS ("1 4 16"), BATCH (16), CHUNK (prefill chunk, 16),
#        LAYERS (4), POLICY (lfu), PREFETCH (off), HINTS (off), KEEP_WORK=1,
#        KV_MB (the batched worker's --kv-budget-mb, default 0: none),
#        KV_BLOCK (its --kv-block-tokens, default 64), LEASE_PART (both
#        workers' --lease-part, default 0: whole layers), CLIENT (one: one
#        moectl process per wave; processes: one per stream),
#        MODEL (a mixtral-layout model directory instead of the made one, e.g.
#        the trained deploy/models/kjv-moe: learned routing; LAYERS is then
#        read from it), CLIENT_NICE (run the clients under `nice -n N`: on a
#        small machine the client takes the services' CPU time, which a
#        remote client would not; default: not niced))
set -euo pipefail
build=${1:-build}
bin=$build/bin
link=${LINK_GBPS:-1}
new_tokens=${NEW_TOKENS:-32}
waves=${WAVES:-2}
streams_list=${STREAMS:-1 4 16}
batch=${BATCH:-16}
chunk=${CHUNK:-16}
layers=${LAYERS:-4}
policy=${POLICY:-lfu}
prefetch=${PREFETCH:-off}
hints=${HINTS:-off}  # moe-worker --pregate-hints (both runners)
kv_mb=${KV_MB:-0}
kv_block=${KV_BLOCK:-64}
lease_part=${LEASE_PART:-0}
client=${CLIENT:-one}
client_nice=()
[ -n "${CLIENT_NICE:-}" ] && client_nice=(nice -n "$CLIENT_NICE")
py=/usr/bin/python3

work=$(mktemp -d /tmp/moe-batch.XXXXXX)
pids=""
cleanup() {
  for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
# shellcheck source=tests/bench/bench_lib.sh
. "$(dirname "$0")/bench_lib.sh"

model=${MODEL:-$work/model}
if [ -z "${MODEL:-}" ]; then
  $bin/moectl make-model --arch mixtral --layers "$layers" --hidden 256 --heads 4 \
    --kv-heads 4 --experts 8 --top-k 2 --intermediate 512 --vocab 512 --seed 7 \
    --out "$model" >/dev/null
fi
layers=$($py -c "import json; print(json.load(open('$model/config.json'))['num_hidden_layers'])")
per_layer=$($py -c "import json; print(json.load(open('$model/config.json'))['num_local_experts'])")
experts=$(( layers * per_layer ))
cap=${CAP:-$(( experts / 2 ))}
expert_bytes=$($bin/moectl inspect "$model" | sed -n 's/^bytes per expert: \([0-9]*\).*/\1/p')

words=(expert cache link batch token layer route slot prefetch stall decode arena)
prompt_for() {  # a different prompt per stream and wave
  local s=$1 w=$2 out="" i
  for i in 0 1 2 3 4 5; do out+="${words[$(( (s * 7 + w * 3 + i * 5) % ${#words[@]} ))]} "; done
  echo "$out"
}

# decode_steps FILE: the worker's batched decode-step totals ("steps
# seconds sequences": steps in which every sequence decoded, no prompt
# chunk beside them) into FILE.
decode_steps() {
  $bin/moectl stats --worker "unix:$work/w.sock" --json | $py -c \
    'import json,sys; w=json.load(sys.stdin)["worker"]; print(w["decode_steps"], w["decode_step_seconds"], w["decode_step_sequences"])' >"$1"
}

# measure MAX_BATCH STREAMS TAG: fresh daemon + worker, one warm-up request,
# then WAVES waves of STREAMS concurrent requests. Writes $work/TAG.usage
# (one JSON usage per request), $work/TAG.wall (seconds per wave) and
# $work/TAG.bytes (bytes copied during the waves).
measure() {
  local mb=$1 streams=$2 tag=$3
  rm -f "$work/c.sock" "$work/w.sock"
  $bin/moe-cached --model "m=$model" --listen "unix:$work/c.sock" --metrics-addr "" \
    --cache-experts "$cap" --policy "$policy" --prefetch "$prefetch" --link-gbps "$link" \
    --state-dir "$work/state-$tag" 2>"$work/$tag.cached.log" &
  local cpid=$!
  pids="$cpid"
  wait_for_socket "$work/c.sock" $cpid || { cat "$work/$tag.cached.log"; exit 1; }
  $bin/moe-worker --model "$model" --listen "unix:$work/w.sock" --cache "unix:$work/c.sock" \
    --cache-model m --backend cpu --metrics-addr "" --max-queue 64 --max-batch "$mb" \
    --prefill-chunk "$chunk" --pregate-hints "$hints" --kv-budget-mb "$kv_mb" \
    --kv-block-tokens "$kv_block" --lease-part "$lease_part" 2>"$work/$tag.worker.log" &
  local wpid=$!
  pids="$wpid $cpid"
  wait_for_socket "$work/w.sock" $wpid || { cat "$work/$tag.worker.log"; exit 1; }
  $bin/moectl generate --target "unix:$work/w.sock" --prompt "warm up" \
    --max-new-tokens 4 --ignore-eos --json >/dev/null 2>&1
  local before
  before=$($bin/moectl stats --cache "unix:$work/c.sock" --json | $py -c \
    'import json,sys; print(json.load(sys.stdin)["cache"][0]["bytes_copied"])')
  decode_steps "$work/$tag.dsteps.before"
  : >"$work/$tag.usage"
  : >"$work/$tag.wall"
  for w in $(seq 1 "$waves"); do
    local t0 t1 cl=""
    if [ "$client" = one ]; then
      : >"$work/$tag.$w.prompts"
      for s in $(seq 1 "$streams"); do prompt_for "$s" "$w" >>"$work/$tag.$w.prompts"; done
      "${client_nice[@]}" $bin/moectl generate --target "unix:$work/w.sock" --prompts-file "$work/$tag.$w.prompts" \
        --concurrency "$streams" --max-new-tokens "$new_tokens" --ignore-eos \
        >"$work/$tag.$w.all" 2>&1 || { cat "$work/$tag.$w.all"; exit 1; }
      # One file per stream, as the per-process client writes them.
      $py - "$work/$tag.$w" "$streams" <<'EOF2'
import json, sys
base, n = sys.argv[1], int(sys.argv[2])
lines = [json.loads(l) for l in open(base + ".all") if l.strip()]
for s in range(1, n + 1):
    open("%s.%d.out" % (base, s), "w").write(json.dumps(lines[s - 1]) + "\n")
open(base + ".wallone", "w").write("%f\n" % lines[-1]["wall_seconds"])
EOF2
      cat "$work/$tag.$w.wallone" >>"$work/$tag.wall"
    else
      t0=$(date +%s.%N)
      for s in $(seq 1 "$streams"); do
        "${client_nice[@]}" $bin/moectl generate --target "unix:$work/w.sock" --prompt "$(prompt_for "$s" "$w")" \
          --max-new-tokens "$new_tokens" --ignore-eos --json >"$work/$tag.$w.$s.out" 2>&1 &
        cl="$cl $!"
      done
      for p in $cl; do wait "$p" || { cat "$work/$tag.$w".*.out; exit 1; }; done
      t1=$(date +%s.%N)
      echo "$t0 $t1" | $py -c 'import sys; a,b=map(float,sys.stdin.read().split()); print(b-a)' \
        >>"$work/$tag.wall"
    fi
    for s in $(seq 1 "$streams"); do
      tail -1 "$work/$tag.$w.$s.out" | $py -c \
        'import json,sys; print(json.dumps(json.load(sys.stdin)["usage"]))' >>"$work/$tag.usage"
    done
  done
  $bin/moectl stats --cache "unix:$work/c.sock" --json | $py -c \
    "import json,sys; print(json.load(sys.stdin)['cache'][0]['bytes_copied'] - $before)" >"$work/$tag.bytes"
  $bin/moectl stats --worker "unix:$work/w.sock" --json | $py -c \
    "import json,sys; print(int(json.load(sys.stdin)['worker']['kv_preemptions']))" >"$work/$tag.preempt"
  decode_steps "$work/$tag.dsteps.after"
  kill -TERM $wpid; wait $wpid || true
  kill -TERM $cpid; wait $cpid || true
  pids=""
}

# summary TAG STREAMS: "tok/s p50_tpot p99_tpot p50_ttft p99_ttft bytes/token"
summary() {
  $py - "$work/$1" <<'EOF'
import json, sys
base = sys.argv[1]
us = [json.loads(l) for l in open(base + ".usage")]
walls = [float(l) for l in open(base + ".wall")]
gen = sum(int(u.get("generated_tokens", 0)) for u in us)
def pct(v, p):
    v = sorted(v); return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]
tpot = [float(u.get("time_per_output_token_seconds", 0)) * 1e3 for u in us]
ttft = [float(u.get("time_to_first_token_seconds", 0)) * 1e3 for u in us]
b = float(open(base + ".bytes").read())
print("%.1f %.3f %.3f %.1f %.1f %.0f" % (gen / sum(walls), pct(tpot, 50), pct(tpot, 99),
      pct(ttft, 50), pct(ttft, 99), b / gen))
EOF
}

echo "model: ${MODEL:-made mixtral (hidden 256, expert width 512)}: $layers MoE layers x $per_layer experts (top-2);" \
     "expert $expert_bytes bytes; cache $cap of $experts experts ($policy, prefetch $prefetch, pregate hints $hints);" \
     "link $link GB/s; $new_tokens new tokens x $waves waves per stream; client: $client;" \
     "batched: --max-batch $batch --prefill-chunk $chunk --kv-budget-mb $kv_mb --kv-block-tokens $kv_block"
printf '%-7s %-9s %9s %9s %9s %9s %9s %12s\n' streams runner "tok/s" p50_tpot p99_tpot \
  p50_ttft p99_ttft bytes/token
for streams in $streams_list; do
  measure 1 "$streams" "one-$streams"
  measure "$batch" "$streams" "batch-$streams"
  set -- $(summary "one-$streams")
  one_tps=$1 one_tpot=$2 one_bpt=$6
  printf '%-7s %-9s %9s %9s %9s %9s %9s %12s\n' "$streams" one "$1" "$2" "$3" "$4" "$5" "$6"
  set -- $(summary "batch-$streams")
  printf '%-7s %-9s %9s %9s %9s %9s %9s %12s\n' "$streams" batch "$1" "$2" "$3" "$4" "$5" "$6"
  $py -c "print('%-7s ratio batch/one: throughput %.2fx, bytes per token %.2fx; batched KV preemptions %s' % ('$streams', $1 / $one_tps, $6 / max($one_bpt, 1), '$(cat "$work/batch-$streams.preempt")'))"
  # Decode alone, as engine_bench --batch-only counts it (no prompt, no
  # queueing, no client): tokens per second of a step from the worker's
  # p50 TPOTs, every stream in each batched step.
  $py -c "print('%-7s decode gain (p50 TPOT: one %.3f ms a token, batch %.3f ms a step of %d): %.2fx' % ('$streams', $one_tpot, $2, $streams, $streams * $one_tpot / $2))"
  # Decode alone by means, as engine_bench's tokens/s is a mean: the one-at-
  # a-time runner's mean TPOT (each request's, weighted by its tokens)
  # against the worker's mean batched decode step (moe_worker_decode_step_
  # seconds: steps in which every sequence decoded; the p50 TPOT above also
  # counts the prompt chunks of streams that join a running batch).
  $py - "$work" "$streams" <<'EOF2'
import json, sys
work, streams = sys.argv[1], sys.argv[2]
us = [json.loads(l) for l in open("%s/one-%s.usage" % (work, streams))]
w = [max(0, int(u.get("generated_tokens", 0)) - 1) for u in us]
one = sum(float(u.get("time_per_output_token_seconds", 0)) * n for u, n in zip(us, w)) / max(1, sum(w))
a = [float(x) for x in open("%s/batch-%s.dsteps.after" % (work, streams)).read().split()]
b = [float(x) for x in open("%s/batch-%s.dsteps.before" % (work, streams)).read().split()]
steps, secs, seqs = (a[i] - b[i] for i in range(3))
if steps <= 0:
    print("%-7s decode step gain: no batched decode steps" % streams)
else:
    step, batch = secs / steps, seqs / steps
    print("%-7s decode step gain (means: one %.3f ms a token, batch %.3f ms a decode step of %.1f, %d steps): %.2fx"
          % (streams, one * 1e3, step * 1e3, batch, steps, batch * one / step))
EOF2
  # Greedy: every request's text must be the same whichever runner ran it.
  same=0 all=0
  for w in $(seq 1 "$waves"); do
    for s in $(seq 1 "$streams"); do
      all=$((all + 1))
      a=$(tail -1 "$work/one-$streams.$w.$s.out" | $py -c 'import json,sys; print(json.load(sys.stdin)["text"])')
      b=$(tail -1 "$work/batch-$streams.$w.$s.out" | $py -c 'import json,sys; print(json.load(sys.stdin)["text"])')
      [ "$a" = "$b" ] && same=$((same + 1))
    done
  done
  echo "$streams       texts identical (one vs batch): $same of $all"
done
