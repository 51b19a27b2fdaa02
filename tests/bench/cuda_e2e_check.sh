#!/usr/bin/env bash
# GPU end to end (run by scripts/gpu-check.sh on a machine with a GPU):
# moe-cached keeps the experts in a CUDA arena (--device cuda, pinned host
# store, CudaCopyEngine) and moe-worker maps it through CUDA IPC
# (--backend cuda). Greedy tokens for a fixed prompt must equal
# `moectl run --backend cuda` with every expert resident, at the smallest
# cache and at all experts (outputs never depend on the cache).
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
prompt="The expert cache keeps"
want=$($bin/moectl run --model "$work/model" --backend "$be" --prompt "$prompt" \
         --max-new-tokens 16 --ignore-eos --json | tokens)
[ -n "$want" ] || { echo "moectl run --backend $be produced no tokens" >&2; exit 1; }
echo "reference (moectl run --backend $be): $want"

fail=0
for cap in 8 32; do
  $bin/moe-cached --model "tiny=$work/model" --listen "unix:$work/c$cap.sock" \
    --metrics-addr "" --device "$be" --cache-experts "$cap" --prefetch on \
    2>"$work/cached$cap.log" &
  cpid=$!; pids+=("$cpid")
  wait_for_socket "$work/c$cap.sock" "$cpid" || { cat "$work/cached$cap.log"; exit 1; }
  $bin/moe-worker --model "$work/model" --listen "unix:$work/w$cap.sock" \
    --cache "unix:$work/c$cap.sock" --cache-model tiny --backend "$be" --metrics-addr "" \
    2>"$work/worker$cap.log" &
  wpid=$!; pids+=("$wpid")
  wait_for_socket "$work/w$cap.sock" "$wpid" || { cat "$work/worker$cap.log"; exit 1; }
  got=$($bin/moectl generate --target "unix:$work/w$cap.sock" --prompt "$prompt" \
          --max-new-tokens 16 --ignore-eos --json | tokens)
  if [ "$got" = "$want" ]; then
    echo "RESULT $be arena, $cap of 32 experts: tokens equal"
  else
    echo "RESULT $be arena, $cap of 32 experts: tokens DIFFER: $got" >&2
    fail=1
  fi
  $bin/moectl stats --cache "unix:$work/c$cap.sock" || true
  kill -TERM "$wpid" "$cpid"
  wait "$wpid" || fail=1
  wait "$cpid" || fail=1
  pids=()
done
exit $fail
