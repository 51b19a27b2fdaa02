#!/usr/bin/env bash
# Greedy tokens of `moectl run` against llama.cpp's on the same GGUF files
# (issue 30): the trained model (deploy/models/kjv-moe) zero-padded to
# 256-wide rows (tests/bench/peer/pad_mixtral.py; the function is
# unchanged), written as an F32 GGUF (safetensors_to_gguf.py) and quantized
# by llama.cpp's own llama_model_quantize (llama_driver quantize): Q8_0 and
# Q4_0 experts, and llama.cpp's Q4_K_M, Q5_K_M and Q6_K mixtures. Prompts:
# --prompts slices of the held-out text (bpe_ids.py), at evenly spread
# offsets (the first at 0), 8, 16, 24 and 32 tokens long in turn; --n-gen
# greedy tokens each, both engines at --threads, llama.cpp's KV cache in f32
# as ours and its flash attention off (--fa off: its CPU flash attention
# rounds K and V to f16 whatever the cache type, ours keeps f32; --fa auto
# is llama.cpp's default). Per file: tokens equal up to each prompt's first difference,
# prompts equal throughout, the largest |log-prob difference| of our top-20
# tokens at each compared step (median, max), and every first difference
# with the gap between the two tokens in both engines' log-probs
# (compare_greedy.py). A tool for people, never run in CI.
#
# usage: tests/bench/peer/gguf_agreement.sh [--types f32,q8_0,q4_0,q4_k_m,q5_k_m,q6_k]
#          [--prompts 16] [--n-gen 16] [--threads 2] [--fa off|on|auto]
#          [--build DIR] [--peer-dir DIR]
# env: PEER_DIR (scratch folder, shared with peer_bench.sh), PY (python3 with numpy)
set -euo pipefail

die() { echo "gguf_agreement: $*" >&2; exit 1; }
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

root=$(cd "$(dirname "$0")/../../.." && pwd)
build=$root/build
peer=${PEER_DIR:-/tmp/moe-peer}
types=f32,q8_0,q4_0,q4_k_m,q5_k_m,q6_k
n_prompts=16
n_gen=16
threads=2
fa=off
while [ $# -gt 0 ]; do
  case $1 in
    --types) types=${2:?--types needs a list}; shift ;;
    --prompts) n_prompts=${2:?--prompts needs a number}; shift ;;
    --n-gen) n_gen=${2:?--n-gen needs a number}; shift ;;
    --threads) threads=${2:?--threads needs a number}; shift ;;
    --fa) fa=${2:?--fa needs off, on or auto}; shift ;;
    --build) build=${2:?--build needs a directory}; shift ;;
    --peer-dir) peer=${2:?--peer-dir needs a directory}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--help lists them)" ;;
  esac
  shift
done
types=${types//,/ }
for t in $types; do
  case $t in f32|q8_0|q4_0|q4_1|q4_k_m|q5_k_m|q6_k) ;;
    *) die "unknown type '$t' (f32, q8_0, q4_0, q4_1, q4_k_m, q5_k_m, q6_k)" ;; esac
done
[[ $n_prompts =~ ^[1-9][0-9]*$ ]] || die "bad --prompts '$n_prompts'"
[[ $n_gen =~ ^[0-9]+$ ]] && [ "$n_gen" -ge 2 ] || die "--n-gen must be >= 2"
[[ $threads =~ ^[1-9][0-9]*$ ]] || die "bad --threads '$threads'"
case $fa in off|on|auto) ;; *) die "bad --fa '$fa' (off, on, auto)" ;; esac

py=${PY:-/usr/bin/python3}
moectl=$build/bin/moectl
model=$root/deploy/models/kjv-moe
[ -x "$moectl" ] || die "no $moectl: build it first (cmake --build build --target moectl)"
[ -x "$py" ] || die "no python at $py (set PY)"
"$py" -c 'import numpy' 2>/dev/null || die "$py cannot import numpy (Debian: apt-get install python3-numpy)"
# shellcheck source=peer_lib.sh
. "$root/tests/bench/peer/peer_lib.sh"
peer_check_tools
mkdir -p "$peer"
peer=$(cd "$peer" && pwd)
work=$(mktemp -d "$peer/agree.XXXXXX")
trap 'rm -rf "$work"' EXIT
peer_setup

# --- the files: padded folder -> F32 GGUF -> llama.cpp's quantizations ---
padded=$peer/kjv-pad
if [ ! -f "$padded/model.safetensors" ] || [ "$model/model.safetensors" -nt "$padded/model.safetensors" ]; then
  log "zero-padding $model to 256-wide rows"
  rm -rf "$padded"
  "$py" "$root/tests/bench/peer/pad_mixtral.py" "$model" "$padded" >"$work/pad.log" 2>&1 ||
    { cat "$work/pad.log" >&2; die "pad_mixtral.py failed"; }
fi
gguf() { echo "$peer/kjv-pad-$1.gguf"; }
if [ ! -f "$(gguf f32)" ] || [ "$padded/model.safetensors" -nt "$(gguf f32)" ]; then
  log "writing $(gguf f32)"
  "$py" "$root/tests/bench/peer/safetensors_to_gguf.py" "$padded" "$(gguf f32)" \
    --gguf-py "$src/gguf-py" >"$work/convert.log" 2>&1 ||
    { cat "$work/convert.log" >&2; die "GGUF conversion failed"; }
fi
for t in $types; do
  [ "$t" = f32 ] && continue
  if [ ! -f "$(gguf "$t")" ] || [ "$(gguf f32)" -nt "$(gguf "$t")" ]; then
    log "llama.cpp quantizes to $t"
    "$driver" quantize "$(gguf f32)" "$(gguf "$t")" "$t" >"$work/quant.log" 2>&1 ||
      { cat "$work/quant.log" >&2; die "llama_driver quantize $t failed"; }
  fi
done

# --- the prompts: slices of the held-out text ---
"$py" "$root/tests/bench/peer/bpe_ids.py" "$model/tokenizer.json" "$model/heldout.txt" >"$work/heldout.json"
"$py" - "$work/heldout.json" "$n_prompts" >"$work/prompts.txt" <<'PY'
import json, sys
ids = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
span = len(ids) - 32
for p in range(n):
    off = p * span // n
    print(",".join(map(str, ids[off:off + 8 * (1 + p % 4)])))
PY

# --- both engines per file ---
echo "## moectl run against llama.cpp ($llama_tag), same GGUF files, trained model padded"
echo "$n_prompts prompts x $n_gen greedy tokens, $threads threads, llama.cpp KV f32, flash attention $fa"
echo
echo "| file | tokens equal | prompts equal | |dlogprob| median | max | first differences (prompt:step ours/theirs, gap ours, gap theirs) |"
echo "|---|---|---|---|---|---|"
for t in $types; do
  f=$(gguf "$t")
  "$driver" gen --model "$f" --threads "$threads" --n-gen "$n_gen" --prompts "$work/prompts.txt" \
    --kv f32 --fa "$fa" --logits "$work/$t.logits" >"$work/$t.tokens" 2>"$work/$t.gen.log" ||
    { cat "$work/$t.gen.log" >&2; die "llama_driver gen failed on $f"; }
  "$py" "$root/tests/bench/peer/compare_greedy.py" --moectl "$moectl" --model "$f" \
    --prompts "$work/prompts.txt" --theirs "$work/$t.tokens" --logits "$work/$t.logits" \
    --n-gen "$n_gen" --threads "$threads" --label "$t" >"$work/$t.json" ||
    die "compare_greedy.py failed on $f"
  "$py" - "$work/$t.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
div = "; ".join(f"{d['prompt']}:{d['step']} {d['ours']}/{d['theirs']} {d['gap_ours']} {d['gap_theirs']}"
                for d in r["divergences"]) or "-"
pct = 100.0 * r["tokens_equal"] / r["tokens"]
print(f"| {r['label']} | {r['tokens_equal']}/{r['tokens']} ({pct:.1f}%) | {r['prompts_equal']}/{r['prompts']} "
      f"| {r['dlogprob_median']:.5f} | {r['dlogprob_max']:.5f} | {div} |")
PY
done
