#!/usr/bin/env bash
# Expert formats end to end at the same cache bytes (issue 12): real
# moe-cached (emulated link, LINK_GBPS, default 1 GB/s; lru-layer, prefetch
# off) + moe-worker (CPU backend) on a mixtral whose bf16 experts are 3 MiB,
# with --expert-format bf16, q8 and q4 and the SAME --cache-bytes for all
# three (default: the bytes of a quarter of the bf16 experts), so q8 and q4
# hold more experts in the same memory. Each run is a fresh daemon + worker,
# one warm-up request, then the same prompts; formats are interleaved REPS
# times so drift of a shared CPU hits all alike. Per format and rep it also
# runs with every expert cached (the prompts once unmeasured, then measured):
# the compute-only TPOT, and the tokens every other run of the format must
# reproduce (tokens differ across formats, not within one).
# Prints per miss mode (MODES, default "fetch host auto"): format, bytes per
# expert, experts held, hit rate, host runs, bytes copied and stall per
# generated token (the daemon's counters, prefill included), decode TPOT
# (the worker's), TPOT vs bf16, the all-cached TPOT, and the first tokens of
# the first prompt per format. Exits non-zero if a run failed or tokens of a
# format changed with the cache.
# usage: tests/bench/format_bench.sh [BUILD_DIR]
#   env: LINK_GBPS (1), REPS (2), NEW_TOKENS (24), MODES ("fetch host auto"),
#        CACHE_BYTES (a quarter of the bf16 experts), KEEP_WORK=1,
#        MODEL (a mixtral-layout model directory instead of the made one)
set -euo pipefail
build=${1:-build}
bin=$build/bin
link=${LINK_GBPS:-1}
reps=${REPS:-2}
new_tokens=${NEW_TOKENS:-24}
modes=${MODES:-fetch host auto}
formats="bf16 q8 q4"
py=/usr/bin/python3
work=$(mktemp -d /tmp/moe-format.XXXXXX)
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
  $bin/moectl make-model --arch mixtral --layers 4 --hidden 512 --heads 4 \
    --kv-heads 4 --experts 8 --top-k 2 --intermediate 1024 --vocab 512 --seed 7 \
    --out "$model" >/dev/null
fi
layers=$($py -c "import json; print(json.load(open('$model/config.json'))['num_hidden_layers'])")
per_layer=$($py -c "import json; print(json.load(open('$model/config.json'))['num_local_experts'])")
experts=$(( layers * per_layer ))
bf16_bytes=$($bin/moectl inspect "$model" | sed -n 's/^bytes per expert: \([0-9]*\).*/\1/p')
cache_bytes=${CACHE_BYTES:-$(( bf16_bytes * experts / 4 ))}
all_bytes=$(( bf16_bytes * experts ))  # holds every expert in any format

prompts=("The expert cache keeps" "Mixture of experts models route each token"
         "A workstation GPU has little memory" "Running a miss where it lies")
failed=0

# run FORMAT MODE BYTES TAG [WARM_PASSES]: fresh daemon + worker, one warm-up
# request (and WARM_PASSES unmeasured passes over the prompts), then the
# prompts. Appends "tpot_s ttft_s generated tokens" per prompt to
# TAG.decode and the daemon's counters over the prompts (one JSON line) to
# TAG.stats; writes TAG.slots ("slots bytes_per_slot", from the daemon's log).
run() {
  local format=$1 mode=$2 bytes=$3 tag=$4 warm_passes=${5:-0}
  rm -f "$work/c.sock" "$work/w.sock"
  $bin/moe-cached --model "m=$model" --listen "unix:$work/c.sock" --metrics-addr "" \
    --cache-bytes "$bytes" --expert-format "$format" --policy lru-layer --prefetch off \
    --link-gbps "$link" --miss-mode "$mode" 2>"$work/$tag.cached.log" &
  local cpid=$!
  pids="$cpid"
  wait_for_socket "$work/c.sock" $cpid || { echo "moe-cached failed ($tag):" >&2; cat "$work/$tag.cached.log" >&2; exit 1; }
  $bin/moe-worker --model "$model" --listen "unix:$work/w.sock" --cache "unix:$work/c.sock" \
    --cache-model m --backend cpu --metrics-addr "" 2>"$work/$tag.worker.log" &
  local wpid=$!
  pids="$wpid $cpid"
  wait_for_socket "$work/w.sock" $wpid || { echo "moe-worker failed ($tag):" >&2; cat "$work/$tag.worker.log" >&2; exit 1; }
  sed -n 's/.* \([0-9]*\) slots of \([0-9]*\) bytes.*/\1 \2/p' "$work/$tag.cached.log" | head -1 \
    >"$work/$tag.slots"
  if ! $bin/moectl generate --target "unix:$work/w.sock" --prompt "warm up the cache" \
      --max-new-tokens 8 --ignore-eos --json >"$work/$tag.warm.out" 2>&1; then
    echo "warm-up failed ($tag):" >&2; cat "$work/$tag.warm.out" >&2; failed=1
  fi
  local p
  for _ in $(seq 1 "$warm_passes"); do  # the prompts once unmeasured: a warm cache
    for p in "${prompts[@]}"; do
      $bin/moectl generate --target "unix:$work/w.sock" --prompt "$p" \
        --max-new-tokens "$new_tokens" --ignore-eos --json >>"$work/$tag.warm.out" 2>&1 || failed=1
    done
  done
  $bin/moectl stats --cache "unix:$work/c.sock" --json >"$work/$tag.before"
  local parse='import json,sys
lines=[json.loads(l) for l in sys.stdin.read().strip().splitlines()]
u=lines[-1]["usage"]; ids=[str(j["token_id"]) for j in lines[:-1] if "token_id" in j]
print(u["time_per_output_token_seconds"], u["time_to_first_token_seconds"], u["generated_tokens"], ",".join(ids))'
  local i=0
  for p in "${prompts[@]}"; do
    i=$(( i + 1 ))
    if $bin/moectl generate --target "unix:$work/w.sock" --prompt "$p" \
        --max-new-tokens "$new_tokens" --ignore-eos --json >"$work/$tag.$i.out" 2>&1 &&
       $py -c "$parse" <"$work/$tag.$i.out" >>"$work/$tag.decode" 2>"$work/$tag.$i.err"; then
      :
    else
      echo "generate failed ($tag, prompt $i):" >&2; cat "$work/$tag.$i.out" "$work/$tag.$i.err" >&2
      failed=1
    fi
  done
  $bin/moectl stats --cache "unix:$work/c.sock" --json >"$work/$tag.after"
  $py - "$work/$tag" <<'EOF' >>"$work/$tag.stats"
import json, sys
b = json.load(open(sys.argv[1] + ".before"))["cache"][0]
a = json.load(open(sys.argv[1] + ".after"))["cache"][0]
d = {k: a[k] - b[k] for k in ("hits", "misses", "host_runs", "bytes_copied", "stall_seconds")}
d["capacity_experts"] = a["capacity_experts"]
print(json.dumps(d))
EOF
  kill -TERM $wpid; wait $wpid || { echo "moe-worker exited non-zero ($tag)" >&2; failed=1; }
  kill -TERM $cpid; wait $cpid || { echo "moe-cached exited non-zero ($tag)" >&2; failed=1; }
  pids=""
}

echo "model: ${MODEL:-made mixtral (hidden 512, expert width 1024)}: $layers MoE layers x $per_layer experts (top-2);" \
     "bf16 expert $bf16_bytes bytes; --cache-bytes $cache_bytes for every format" \
     "($(( cache_bytes / bf16_bytes )) bf16 experts of $experts); lru-layer, prefetch off; link $link GB/s;" \
     "${#prompts[@]} prompts x $new_tokens new tokens after a warm-up, $reps reps interleaved"
for r in $(seq 1 "$reps"); do
  for f in $formats; do
    for m in $modes; do run "$f" "$m" "$cache_bytes" "$m-$f"; done
    run "$f" fetch "$all_bytes" "all-$f" 1
  done
done

$py - "$work" "$reps" "${#prompts[@]}" "$modes" <<'EOF' || failed=1
import json, statistics, sys
work, reps, nprompts, modes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
formats = ("bf16", "q8", "q4")
ok = True
def rows(tag):
    try:
        return [l.split() for l in open(f"{work}/{tag}.decode")]
    except FileNotFoundError:
        return []
def stats(tag):  # summed over the reps
    runs = [json.loads(l) for l in open(f"{work}/{tag}.stats")]
    s = {k: sum(x[k] for x in runs) for k in runs[0]}
    s["capacity_experts"] = runs[-1]["capacity_experts"]
    return s
def slots(tag):
    s = open(f"{work}/{tag}.slots").read().split()
    return (int(s[0]), int(s[1])) if len(s) == 2 else (0, 0)
ref = {}
all_tpot = {}
for f in formats:
    r = rows(f"all-{f}")
    ref[f] = [x[3] for x in r[:nprompts]]
    all_tpot[f] = statistics.mean(float(x[0]) for x in r) * 1e3 if r else float("nan")
    sa = stats(f"all-{f}")
    if sa["misses"] != 0:
        print(f"  note: all-{f}: {sa['misses']} misses in the warm pass (all cached should give 0)")
for m in modes:
    print(f"\nmiss mode {m}:")
    print(f"{'format':6s} {'B/expert':>9s} {'held':>5s} {'hit rate':>8s} {'host runs':>9s} "
          f"{'B copied/tok':>12s} {'stall ms/tok':>12s} {'TPOT ms':>8s} {'vs bf16':>7s} {'all-cached TPOT ms':>18s}  tokens same")
    tpot = {}
    for f in formats:
        tag = f"{m}-{f}"
        r = rows(tag)
        st = stats(tag)
        held, bpe = slots(tag)
        if held != st["capacity_experts"]:
            print(f"  ! {tag}: log says {held} slots, GetStats {st['capacity_experts']}"); ok = False
        if len(r) != reps * nprompts:
            print(f"  ! {tag}: {len(r)} of {reps * nprompts} generations succeeded"); ok = False
        if not r:
            continue
        toks = [x[3] for x in r]
        same = all(toks[i] == ref[f][i % nprompts] for i in range(len(toks))) and len(ref[f]) == nprompts
        ok = ok and same
        gen = sum(int(x[2]) for x in r)
        look = st["hits"] + st["misses"]
        tpot[f] = statistics.mean(float(x[0]) for x in r) * 1e3
        print(f"{f:6s} {bpe:9d} {held:5d} {st['hits'] / look if look else 0:8.3f} {st['host_runs']:9d} "
              f"{st['bytes_copied'] / gen:12.0f} {st['stall_seconds'] * 1e3 / gen:12.3f} {tpot[f]:8.3f} {tpot[f] / tpot['bf16']:7.3f} "
              f"{all_tpot[f]:18.3f}  {same}")
    if "bf16" in tpot:
        held = {f: slots(f"{m}-{f}")[0] for f in formats}
        print("ratios: experts held q8/bf16 %.2f, q4/bf16 %.2f; TPOT q8/bf16 %.3f, q4/bf16 %.3f"
              % (held["q8"] / held["bf16"], held["q4"] / held["bf16"],
                 tpot.get("q8", float("nan")) / tpot["bf16"], tpot.get("q4", float("nan")) / tpot["bf16"]))
print("\nall-cached TPOT ms (every expert cached, second pass: compute only): " +
      ", ".join(f"{f} {all_tpot[f]:.3f}" for f in formats))
print("tokens of prompt 1 (first 12 ids; differ across formats, must not depend on the cache):")
for f in formats:
    print(f"  {f:5s} {','.join(ref[f][0].split(',')[:12]) if ref[f] else '-'}")
print("hit rate, host runs, bytes copied, stall: the daemon's counters over the measured prompts (prefill"
      " included, warm-up excluded), all reps; TPOT: the worker's decode time per output token, mean")
sys.exit(0 if ok else 1)
EOF
if [ "$failed" != 0 ]; then echo "FAILED: see messages above" >&2; exit 1; fi
