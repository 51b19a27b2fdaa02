#!/usr/bin/env bash
# GPU end to end (run by scripts/gpu-check.sh on a machine with a GPU):
# moe-cached keeps the experts in a CUDA arena (--device cuda, pinned host
# store, CudaCopyEngine) and moe-worker maps it through CUDA IPC
# (--backend cuda). Greedy tokens for a fixed prompt must equal
# `moectl run --backend cuda` with every expert resident, at the smallest
# cache and at all experts (outputs never depend on the cache), for the
# checkpoint's bf16 experts, the same experts held as q8 and q4, and an FP8
# checkpoint (experts as q8), so the quantized expert kernels run too.
# usage: tests/bench/cuda_e2e_check.sh BUILD_DIR   (E2E_BACKEND=cpu runs the
#        same check with the host arena, to test the script without a GPU)
set -euo pipefail
be=${E2E_BACKEND:-cuda}
bin=$(cd "${1:?usage: cuda_e2e_check.sh BUILD_DIR}" && pwd)/bin
work=$(mktemp -d /tmp/moe-cuda-e2e.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# shellcheck source=tests/bench/bench_lib.sh
. "$(dirname "$0")/bench_lib.sh"

tokens() {  # moectl ... --json -> comma-separated token ids
  /usr/bin/python3 -c '
import json, sys
ids = []
for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    o = json.loads(line)
    if "token_id" in o:
        ids.append(str(o["token_id"]))
print(",".join(ids))'
}

$bin/moectl make-model --preset tiny --out "$work/model" >/dev/null
# The same shape as an FP8 block-scaled checkpoint (experts held as q8 by
# default), for the quantized expert kernels (issue 12).
$bin/moectl make-model --preset tiny --expert-format fp8 --fp8-block 32 \
  --out "$work/fp8" >/dev/null
# Tiny gpt_oss (sinks, sliding window, biased experts whose biases travel in
# the slots), bf16 and MXFP4 (held as q8): also 4 MoE layers x 8 experts.
$bin/moectl make-model --arch gpt_oss --out "$work/gptoss" >/dev/null
$bin/moectl make-model --arch gpt_oss --expert-format mxfp4 --out "$work/gptossmx" >/dev/null
prompt="The expert cache keeps"
fail=0
# model dir | --expert-format ("" = as stored) | cache capacities
for run in "model||8 32" "model|q8|8" "model|q4|8" "fp8||8 32" "gptoss||8 32" "gptossmx||8"; do
  IFS='|' read -r dir fmt caps <<<"$run"
  fmt_args=()
  [ -n "$fmt" ] && fmt_args=(--expert-format "$fmt")
  label="$dir${fmt:+ as $fmt}"
  want=$($bin/moectl run --model "$work/$dir" --backend "$be" "${fmt_args[@]}" \
           --prompt "$prompt" --max-new-tokens 16 --ignore-eos --json | tokens)
  [ -n "$want" ] || { echo "moectl run --backend $be ($label) produced no tokens" >&2; exit 1; }
  echo "reference (moectl run --backend $be, $label): $want"
  for cap in $caps; do
    tag="$dir$fmt$cap"
    $bin/moe-cached --model "tiny=$work/$dir" --listen "unix:$work/c$tag.sock" \
      --metrics-addr "" --device "$be" --cache-experts "$cap" --prefetch on "${fmt_args[@]}" \
      2>"$work/cached$tag.log" &
    cpid=$!; pids+=("$cpid")
    wait_for_socket "$work/c$tag.sock" "$cpid" || { cat "$work/cached$tag.log"; exit 1; }
    $bin/moe-worker --model "$work/$dir" --listen "unix:$work/w$tag.sock" \
      --cache "unix:$work/c$tag.sock" --cache-model tiny --backend "$be" --metrics-addr "" \
      2>"$work/worker$tag.log" &
    wpid=$!; pids+=("$wpid")
    wait_for_socket "$work/w$tag.sock" "$wpid" || { cat "$work/worker$tag.log"; exit 1; }
    got=$($bin/moectl generate --target "unix:$work/w$tag.sock" --prompt "$prompt" \
            --max-new-tokens 16 --ignore-eos --json | tokens)
    if [ "$got" = "$want" ]; then
      echo "RESULT $be arena, $label, $cap of 32 experts: tokens equal"
    else
      echo "RESULT $be arena, $label, $cap of 32 experts: tokens DIFFER: $got" >&2
      fail=1
    fi
    $bin/moectl stats --cache "unix:$work/c$tag.sock" || true
    kill -TERM "$wpid" "$cpid"
    wait "$wpid" || fail=1
    wait "$cpid" || fail=1
    pids=()
  done
done
exit $fail
