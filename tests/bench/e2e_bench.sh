#!/usr/bin/env bash
# End-to-end TPOT (issue 6 item 8): moe-cached with an emulated link +
# moe-worker (CPU backend, --record-trace) on a small mixtral, per policy and
# capacity; beside each measured TPOT, `moectl simulate`'s prediction for the
# trace recorded in the same run, with the same policy, capacity and link.
# The simulator's per-layer compute (--layer-ms) is calibrated from a run with
# every expert cached: warm TPOT / MoE layers, so attention, norms and lm_head
# are folded into it. A second simulated column adds a per-miss overhead
# fitted on a separate run (see below and docs/benchmarks.md, "End to end").
# Then (HINTS=on, the default; HINTS=only skips the per-policy table) one
# policy (HINT_POLICY, lru) at half the experts with prefetch on, run with
# moe-worker --pregate-hints off and on at each --pregate-distance of
# PREGATE_DISTANCES ("1 2"; HINT_REPS runs each, interleaved): hint
# recall/precision per distance from the recorded traces, measured TPOT, and
# the simulator's prediction for that trace replaying its hints or not.
# usage: tests/bench/e2e_bench.sh [BUILD_DIR]   (env: LINK_GBPS, PREFETCH,
#        NEW_TOKENS, LAYERS, POLICIES, HINTS, HINT_POLICY, HINT_REPS,
#        PREGATE_DISTANCES,
#        PF_AB, PF_POLICIES, PF_CAP, PF_REPS (prefetch off vs on),
#        KEEP_WORK=1 keeps the models, traces and logs)
set -euo pipefail
build=${1:-build}
bin=$build/bin
link=${LINK_GBPS:-1}
prefetch=${PREFETCH:-on}
new_tokens=${NEW_TOKENS:-32}
layers=${LAYERS:-4}
policies=${POLICIES:-"lru lru-layer moe-infinity"}
hints=${HINTS:-on}
hint_policy=${HINT_POLICY:-lru}
hint_reps=${HINT_REPS:-2}
pregate_distances=${PREGATE_DISTANCES:-1 2}  # moe-worker --pregate-distance values
worker_args=""  # extra moe-worker flags for run()
pf_ab=${PF_AB:-off}  # prefetch off/on comparison: off | on | only (see pf_ab_section)
pf_policies=${PF_POLICIES:-$policies}
py=/usr/bin/python3

work=$(mktemp -d /tmp/moe-e2e.XXXXXX)
pids=""
cleanup() {
  for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

model=$work/model
$bin/moectl make-model --arch mixtral --layers "$layers" --hidden 256 --heads 4 \
  --kv-heads 4 --experts 8 --top-k 2 --intermediate 512 --vocab 512 --seed 7 \
  --out "$model" >/dev/null
experts=$(( layers * 8 ))
expert_bytes=$($bin/moectl inspect "$model" | sed -n 's/^bytes per expert: \([0-9]*\).*/\1/p')
expert_mb=$($py -c "print($expert_bytes/1e6)")

# shellcheck source=tests/bench/bench_lib.sh
. "$(dirname "$0")/bench_lib.sh"

prompts=("The expert cache keeps" "Mixture of experts models route each token"
         "A workstation GPU has little memory" "Prefetching hides the link"
         "Least recently used is a baseline" "Each layer picks two experts")

# run POLICY CAPACITY TAG [PASSES [LINK_GBPS]]: starts both processes, sends the prompts
# PASSES times, writes $work/TAG.tpot (one TPOT per request, seconds) and
# the trace $work/TAG.trace.
run() {
  local policy=$1 cap=$2 tag=$3 passes=${4:-1} gbps=${5:-$link}
  rm -f "$work/c.sock" "$work/w.sock"
  $bin/moe-cached --model "m=$model" --listen "unix:$work/c.sock" --metrics-addr "" \
    --cache-experts "$cap" --policy "$policy" --prefetch "$prefetch" --link-gbps "$gbps" \
    --state-dir "$work/state-$tag" 2>"$work/$tag.cached.log" &
  local cpid=$!
  pids="$cpid"
  wait_for_socket "$work/c.sock" $cpid || { cat "$work/$tag.cached.log"; exit 1; }
  $bin/moe-worker --model "$model" --listen "unix:$work/w.sock" --cache "unix:$work/c.sock" \
    --cache-model m --backend cpu --metrics-addr "" --record-trace "$work/$tag.trace" $worker_args \
    2>"$work/$tag.worker.log" &
  local wpid=$!
  pids="$wpid $cpid"
  wait_for_socket "$work/w.sock" $wpid || { cat "$work/$tag.worker.log"; exit 1; }
  : >"$work/$tag.tpot"
  for _ in $(seq 1 "$passes"); do
    for p in "${prompts[@]}"; do
      $bin/moectl generate --target "unix:$work/w.sock" --prompt "$p" \
        --max-new-tokens "$new_tokens" --ignore-eos --json 2>/dev/null | tail -1 |
        $py -c 'import json,sys; u=json.load(sys.stdin)["usage"]; print(u["time_per_output_token_seconds"], u.get("expert_hits",0), u.get("expert_misses",0))' \
        >>"$work/$tag.tpot"
    done
  done
  $bin/moectl stats --cache "unix:$work/c.sock" --json >"$work/$tag.stats" 2>/dev/null || true
  kill -TERM $wpid; wait $wpid || true
  kill -TERM $cpid; wait $cpid || true
  pids=""
}

# Calibration: every expert cached, the prompts twice; the median warm
# (second-pass) TPOT / MoE layers is the compute per layer with no stall. It
# is re-measured right before each configuration because the CPU is shared
# and its speed drifts from minute to minute.
calibrate() {  # sets layer_ms
  run lru "$experts" all 2
  layer_ms=$($py -c "
import statistics
v=[float(x.split()[0]) for x in open('$work/all.tpot')][${#prompts[@]}:]
print(statistics.median(v)*1000/$layers)")
}

# simulate TAG POLICY CAP LINK EXPERT_MB [FLAGS]: prints "tpot_ms misses
# (decode + prefill) decode_misses_per_token"
simulate() {
  $bin/moectl simulate --trace "$work/$1.trace" --policy "$2" --capacity "$3" \
    --prefetch "$prefetch" --expert-mb "$5" --link-gbps "$4" --layer-ms "$layer_ms" \
    ${6:-} --json | $py -c '
import json,sys
for line in sys.stdin:
    j=json.loads(line)
    if j["policy"]!="belady": print(j["tpot_ms"], j["misses"]+j["prefill"]["misses"], j["misses"]/j["tokens"])'
}

# Per-miss overhead the link model leaves out. With a ~free link (1000 GB/s)
# measured and simulated TPOT agree, so it is not the memcpy or the Acquire
# round trip; it appears only when misses wait on the paced link (waking the
# copy thread and the waiting worker on an oversubscribed CPU). One
# parameter, fitted on a separate lru run at one layer + 2 on this link:
# (measured - simulated) / simulated misses per token; the table then
# shows the simulation with each miss costing that much more link time.
calibrate
run lru $(( 8 + 2 )) fit 1
fit=$($py -c "print(sum(float(x.split()[0]) for x in open('$work/fit.tpot'))/${#prompts[@]}*1000)")
set -- $(simulate fit lru $(( 8 + 2 )) "$link" "$expert_mb")
miss_ms=$($py -c "print(max(0.0, ($fit - $1) / $3))")
expert_mb_eff=$($py -c "print($expert_mb + $miss_ms * $link)")

echo "model: mixtral ${layers} MoE layers x 8 experts (top-2, hidden 256, expert width 512)"
echo "expert: $expert_bytes bytes; link $link GB/s (miss = $($py -c "print(round($expert_mb/$link,3))") ms);" \
     "prefetch $prefetch; per-miss overhead $($py -c "print(round($miss_ms,3))") ms;" \
     "${#prompts[@]} prompts x $new_tokens new tokens"
[ "$hints" = only ] && policies=""
[ "$pf_ab" = only ] && policies=""
[ -n "$policies" ] &&
printf '%-13s %4s %8s %9s %8s %6s %9s %6s %8s %8s\n' policy cap layer_ms measured sim_raw ratio sim+miss ratio run_miss sim_miss
for policy in $policies; do
  for cap in $(( 8 + 2 )) $(( experts / 2 )); do
    tag=$policy-$cap
    calibrate
    run "$policy" "$cap" "$tag"
    set -- $($py -c "
r=[x.split() for x in open('$work/$tag.tpot')]
h=sum(int(x[1]) for x in r); m=sum(int(x[2]) for x in r)
print(sum(float(x[0]) for x in r)/len(r)*1000, m)")
    measured=$1 run_miss=$2
    set -- $(simulate "$tag" "$policy" "$cap" "$link" "$expert_mb")
    raw=$1 sim_miss=$2
    set -- $(simulate "$tag" "$policy" "$cap" "$link" "$expert_mb_eff")
    printf '%-13s %4d %8.3f %9.3f %8.3f %6.3f %9.3f %6.3f %8d %8d\n' "$policy" "$cap" \
      "$layer_ms" "$measured" "$raw" "$($py -c "print($measured/$raw)")" "$1" \
      "$($py -c "print($measured/$1)")" "$run_miss" "$sim_miss"
  done
done

# Prefetch off vs on (PF_AB=on|only): per policy of PF_POLICIES (default
# POLICIES) at PF_CAP slots (default half the experts), moe-cached
# --prefetch off and on interleaved PF_REPS (2) times, alternating which runs
# first (the CPU drifts): mean
# TPOT, misses per run, and the daemon's prefetch counters summed over the
# prefetch-on runs (`moectl stats` before shutdown). Tags: pfoff-P-r, pfon-P-r.
pf_ab_section() {
  local cap=${PF_CAP:-$(( experts / 2 ))} reps=${PF_REPS:-2} saved=$prefetch policy r pf
  echo
  echo "prefetch off vs on: capacity $cap, $reps runs each (interleaved), worker args '$worker_args'"
  printf '%-13s %8s %8s %7s %8s %8s %7s %6s %7s %6s\n' policy off_ms on_ms on/off off_miss \
    on_miss issued used wasted waste
  for policy in $pf_policies; do
    for r in $(seq 1 "$reps"); do  # alternate which goes first
      for pf in $([ $(( r % 2 )) = 1 ] && echo off on || echo on off); do
        prefetch=$pf; run "$policy" "$cap" "pf$pf-$policy-$r"
      done
    done
    $py -c "
import glob, json
def tpot(k):
    r=[x.split() for f in sorted(glob.glob('$work/pf%s-$policy-*.tpot' % k)) for x in open(f)]
    return sum(float(x[0]) for x in r)/len(r)*1000, sum(int(x[2]) for x in r)/$reps
off, off_miss = tpot('off'); on, on_miss = tpot('on')
c={'prefetch_issued':0,'prefetch_used':0,'prefetch_wasted':0}
for f in glob.glob('$work/pfon-$policy-*.stats'):
    try: m=json.load(open(f))['cache'][0]
    except Exception: continue
    for k in c: c[k]+=m[k]
i,u,w=c['prefetch_issued'],c['prefetch_used'],c['prefetch_wasted']
print('%-13s %8.3f %8.3f %7.3f %8.0f %8.0f %7d %6d %7d %5.0f%%' % ('$policy', off, on, on/off,
      off_miss, on_miss, i, u, w, 100.0*w/max(1,u+w)))"
  done
  prefetch=$saved
}
[ "$pf_ab" != off ] && pf_ab_section
[ "$pf_ab" = only ] && exit 0

[ "$hints" = off ] && exit 0

# Pre-gating hints: the same policy and capacity with moe-worker
# --pregate-hints off and on at each --pregate-distance of
# PREGATE_DISTANCES, interleaved HINT_REPS times (the CPU drifts). Hints act
# only through prefetching, so prefetch is on here. Tags: hoff<rep>,
# hd<D>r<rep>.
prefetch=on
cap=$(( experts / 2 ))
calibrate
for rep in $(seq 1 "$hint_reps"); do
  worker_args=""
  run "$hint_policy" "$cap" "hoff$rep"
  for d in $pregate_distances; do
    worker_args="--pregate-hints on --pregate-distance $d"
    run "$hint_policy" "$cap" "hd${d}r$rep"
  done
done
worker_args=""
mean_tpot() {  # TAG_PREFIX: "mean TPOT ms, misses per run"
  $py -c "
import glob
r=[x.split() for f in sorted(glob.glob('$work/$1[0-9]*.tpot')) for x in open(f)]
print(sum(float(x[0]) for x in r)/len(r)*1000, sum(int(x[2]) for x in r)//$hint_reps)"
}
# The simulator's prefetch gate charges each prefetch one chunk of link time
# (C = 1 MB / link, more than a whole 0.79 MB expert here), which refuses
# every prefetch (the daemon's gate, SetGateLinkFigures, charges the same C
# with its own chunk: 64 KiB here). sim_fine is the same simulation with
# 10 kB chunks, i.e. C ~ 0.
fine="--chunk-mb 0.01"
# hint_row LABEL TAG_PREFIX TRACE_TAG HINTS: one row of the table below.
hint_row() {
  set -- "$1" $(mean_tpot "$2") "$3" "$4"
  local label=$1 ms=$2 miss=$3 tr=$4 h=$5
  set -- $(simulate "$tr" "$hint_policy" "$cap" "$link" "$expert_mb" "--hints $h")
  local sim=$1 sim_miss=$2
  set -- $(simulate "$tr" "$hint_policy" "$cap" "$link" "$expert_mb" "--hints $h $fine")
  printf '%-10s %9.3f %8d %8.3f %8d %8.3f %9d\n' "$label" "$ms" "$miss" "$sim" "$sim_miss" \
    "$1" "$2"
  echo "$ms $sim $1" >"$work/$label.row"
}
echo
echo "pre-gating hints: $hint_policy, capacity $cap, prefetch on, $hint_reps runs each" \
     "(interleaved); layer_ms $($py -c "print(round($layer_ms,3))")"
for d in $pregate_distances; do
  set -- $($bin/moectl simulate --trace "$work/hd${d}r1.trace" --policy "$hint_policy" \
    --capacity "$cap" --json | $py -c '
import json,sys
h=json.loads(sys.stdin.readline())["hints"]
print(h["recall"], h["precision"], h["hinted_pairs"])')
  # Hints never change tokens: the greedy requests route exactly as off.
  same=$($py -c "
import json
r=lambda f: [json.loads(l)['experts'] for l in list(open(f))[1:]]
print('same routing as off' if r('$work/hoff1.trace')==r('$work/hd${d}r1.trace') else 'ROUTING DIFFERS FROM OFF')")
  echo "distance $d: hint recall $($py -c "print(round($1,4))") precision" \
       "$($py -c "print(round($2,4))") over $3 token-layers (trace of hd${d}r1); $same"
done
printf '%-10s %9s %8s %8s %8s %8s %9s\n' worker measured run_miss sim_raw sim_miss sim_fine \
  fine_miss
first=$(echo $pregate_distances | cut -d' ' -f1)
hint_row off hoff "hd${first}r1" off
for d in $pregate_distances; do hint_row "D=$d" "hd${d}r" "hd${d}r1" on; done
for d in $pregate_distances; do
  $py -c "
off=[float(x) for x in open('$work/off.row').read().split()]
on=[float(x) for x in open('$work/D=$d.row').read().split()]
print('%-10s %9.3f %8s %8.3f %8s %8.3f' % ('D=$d/off', on[0]/off[0], '', on[1]/off[1], '', on[2]/off[2]))"
done
