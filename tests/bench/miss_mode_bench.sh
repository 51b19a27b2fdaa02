#!/usr/bin/env bash
# Where a miss is served, end to end: real moe-cached (emulated link,
# LINK_GBPS, default 1 GB/s) + moe-worker (CPU backend) on a mixtral whose
# experts are 3 MiB, a quarter of the experts cached; the same prompts with
# --miss-mode fetch, host and auto, interleaved REPS times. Prints measured
# decode TPOT and prefill TTFT per mode, the ratio to fetch side by side, the
# simulator's prediction for the trace recorded in the auto run (same link,
# host figure measured by the daemon, compute per layer calibrated with every
# expert cached), and whether the tokens were identical across modes.
# usage: tests/bench/miss_mode_bench.sh [BUILD_DIR]
#   env: LINK_GBPS (1), REPS (2), NEW_TOKENS (24), LONG_PROMPT_WORDS (256),
#        MODEL (a mixtral-layout model directory to use instead, e.g. the
#        trained deploy/models/kjv-moe: real routing)
set -euo pipefail
build=${1:-build}
bin=$build/bin
link=${LINK_GBPS:-1}
reps=${REPS:-2}
new_tokens=${NEW_TOKENS:-24}
long_words=${LONG_PROMPT_WORDS:-256}
py=/usr/bin/python3
work=$(mktemp -d /tmp/moe-miss.XXXXXX)
pids=""
# shellcheck source=tests/bench/bench_lib.sh
. "$(dirname "$0")/bench_lib.sh"
trap bench_cleanup EXIT

model=${MODEL:-$work/model}
if [ -z "${MODEL:-}" ]; then
  $bin/moectl make-model --arch mixtral --layers 4 --hidden 512 --heads 4 \
    --kv-heads 4 --experts 8 --top-k 2 --intermediate 1024 --vocab 512 --seed 7 \
    --out "$model" >/dev/null
fi
layers=$($py -c "import json; print(json.load(open('$model/config.json'))['num_hidden_layers'])")
experts=$($py -c "import json; print(json.load(open('$model/config.json'))['num_local_experts'])")
expert_bytes=$($bin/moectl inspect "$model" | sed -n 's/^bytes per expert: \([0-9]*\).*/\1/p')
expert_mb=$($py -c "print($expert_bytes/1e6)")
cap=$(( layers * experts / 4 ))

prompts=("The expert cache keeps" "Mixture of experts models route each token"
         "A workstation GPU has little memory" "Running a miss where it lies")
long_prompt=$($py -c "print(' '.join(['expert'] * $long_words))")

# run MODE CAP TAG: one daemon + worker; appends "tpot_s ttft_s tokens" lines
# to TAG.decode (short prompts) and TAG.prefill (the long prompt).
run() {
  local mode=$1 capacity=$2 tag=$3
  rm -f "$work/c.sock" "$work/w.sock"
  $bin/moe-cached --model "m=$model" --listen "unix:$work/c.sock" --metrics-addr "" \
    --cache-experts "$capacity" --policy lru-layer --prefetch off --link-gbps "$link" \
    --miss-mode "$mode" 2>"$work/$tag.cached.log" &
  local cpid=$!
  pids="$cpid"
  wait_for_socket "$work/c.sock" $cpid || { cat "$work/$tag.cached.log"; exit 1; }
  $bin/moe-worker --model "$model" --listen "unix:$work/w.sock" --cache "unix:$work/c.sock" \
    --cache-model m --backend cpu --metrics-addr "" --record-trace "$work/$tag.trace" \
    2>"$work/$tag.worker.log" &
  local wpid=$!
  pids="$wpid $cpid"
  wait_for_socket "$work/w.sock" $wpid || { cat "$work/$tag.worker.log"; exit 1; }
  local parse='import json,sys
lines=[json.loads(l) for l in sys.stdin.read().strip().splitlines()]
u=lines[-1]["usage"]; ids=[str(j["token_id"]) for j in lines[:-1] if "token_id" in j]
print(u["time_per_output_token_seconds"], u["time_to_first_token_seconds"], ",".join(ids))'
  for p in "${prompts[@]}"; do
    $bin/moectl generate --target "unix:$work/w.sock" --prompt "$p" \
      --max-new-tokens "$new_tokens" --ignore-eos --json 2>/dev/null | $py -c "$parse" \
      >>"$work/$tag.decode"
  done
  $bin/moectl generate --target "unix:$work/w.sock" --prompt "$long_prompt" \
    --max-new-tokens 2 --ignore-eos --json 2>/dev/null | $py -c "$parse" >>"$work/$tag.prefill"
  grep -o 'host reads [0-9.]* GB/s' "$work/$tag.cached.log" | head -1 >"$work/$tag.host" || true
  kill -TERM $wpid; wait $wpid || true
  kill -TERM $cpid; wait $cpid || true
  pids=""
}

# Compute per layer with no stall: every expert cached, warm pass.
run fetch $(( layers * experts )) all
run fetch $(( layers * experts )) all
layer_ms=$($py -c "
import statistics
v=[float(x.split()[0]) for x in open('$work/all.decode')][${#prompts[@]}:]
print(statistics.median(v)*1000/$layers)")

for r in $(seq 1 "$reps"); do
  for mode in fetch host auto; do run "$mode" "$cap" "$mode"; done
done
host_gbps=$(sed -n 's/host reads \([0-9.]*\) GB\/s/\1/p' "$work/auto.host" | head -1)
sim_auto=$($bin/moectl simulate --trace "$work/auto.trace" --policy lru-layer --capacity "$cap" \
  --expert-mb "$expert_mb" --link-gbps "$link" --layer-ms "$layer_ms" --miss-mode auto \
  --host-gbps "${host_gbps:-10}" --host-gflops 100 --json | $py -c '
import json,sys
for l in sys.stdin:
  j=json.loads(l)
  if j.get("policy")=="lru-layer": print(j["tpot_ms"])')
sim_fetch=$($bin/moectl simulate --trace "$work/auto.trace" --policy lru-layer --capacity "$cap" \
  --expert-mb "$expert_mb" --link-gbps "$link" --layer-ms "$layer_ms" --json | $py -c '
import json,sys
for l in sys.stdin:
  j=json.loads(l)
  if j.get("policy")=="lru-layer": print(j["tpot_ms"])')

$py - "$work" "$sim_fetch" "$sim_auto" <<'EOF'
import statistics, sys
work, sim_fetch, sim_auto = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
def rows(tag, kind):
    return [l.split() for l in open(f"{work}/{tag}.{kind}")]
tpot = {m: statistics.mean(float(r[0]) for r in rows(m, "decode")) * 1000 for m in ("fetch", "host", "auto")}
ttft = {m: statistics.mean(float(r[1]) for r in rows(m, "prefill")) * 1000 for m in ("fetch", "host", "auto")}
tokens = {m: [r[2] for r in rows(m, "decode")] + [r[2] for r in rows(m, "prefill")] for m in ("fetch", "host", "auto")}
same = tokens["fetch"] == tokens["host"] == tokens["auto"]
print("mode    decode TPOT ms  vs fetch  long-prompt TTFT ms  vs fetch")
for m in ("fetch", "host", "auto"):
    print(f"{m:6s}  {tpot[m]:14.3f}  {tpot[m]/tpot['fetch']:8.3f}  {ttft[m]:19.3f}  {ttft[m]/ttft['fetch']:8.3f}")
print(f"simulator (recorded auto trace): fetch {sim_fetch:.3f} ms, auto {sim_auto:.3f} ms, ratio {sim_auto/sim_fetch:.3f}")
print("tokens identical across modes:", same)
sys.exit(0 if same else 1)
EOF
