#!/usr/bin/env bash
# The main job on the built-in tiny model: set up, build, make the model,
# start the expert-cache daemon (moe-cached) and an inference worker
# (moe-worker) on the CPU backend with an emulated host->device link and a
# cache smaller than the model, generate from a few prompts through the
# worker's gRPC API, print the cache statistics, and stop both cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "demo: installing what the three programs need (scripts/setup-deps.sh --demo)"
scripts/setup-deps.sh --demo
echo "demo: building moe-cached, moe-worker and moectl (not the tests: scripts/test.sh builds those)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target moe-cached moe-worker moectl

bin=build/bin
$bin/moectl info
# The default model is the project's own, trained on the King James Bible
# (deploy/models/kjv-moe, scripts/train-small-moe.py): 6 MoE layers x 16
# experts, so its text reads like (archaic) English. MOE_DEMO_ARCH picks a
# made model of random weights instead, whose text is noise: mixtral,
# qwen2_moe, qwen3_moe, olmoe, deepseek_v2 (MLA with a latent KV cache,
# grouped routing, shared experts), deepseek_v3 (sigmoid + bias-corrected
# noaux_tc routing) or gpt_oss (attention sinks, sliding and full layers,
# biased clamped-SwiGLU experts). A made demo model is remade on every run
# (make-model refuses a non-empty directory without --force); a directory
# given in MOE_DEMO_MODEL is written only if it is empty.
arch=${MOE_DEMO_ARCH:-}
if [ -z "$arch" ]; then
  model=deploy/models/kjv-moe
  cache_experts=32
  prompts=("And God said" "The LORD is my shepherd" "And God said")
  sampling=(--temperature 0.8 --top-p 0.95 --seed 7)
else
  model=${MOE_DEMO_MODEL:-build/demo/tiny-$arch}
  force=()
  [ -z "${MOE_DEMO_MODEL:-}" ] && force=(--force)
  $bin/moectl make-model --preset tiny --arch "$arch" --out "$model" "${force[@]}"
  cache_experts=12
  prompts=("The expert cache keeps" "Mixture of experts models route each token"
           "The expert cache keeps")
  sampling=()
fi
$bin/moectl inspect "$model"
name=$(basename "$model")  # the name the daemon holds it under

work=$(mktemp -d /tmp/moe-demo.XXXXXX)
cached_pid=""
worker_pid=""
cleanup() {
  for pid in $worker_pid $cached_pid; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

wait_for_socket() {  # PATH PID NAME
  for _ in $(seq 1 300); do
    [ -S "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || { echo "demo: $3 exited during start-up" >&2; return 1; }
    sleep 0.1
  done
  echo "demo: $3 did not start within 30 s" >&2
  return 1
}

# The trained model has 96 experts, the cache holds 32 (2 layers' worth);
# tiny mixtral: 4 MoE layers x 8 experts = 32 experts (deepseek: 3 MoE
# layers, its first layer is dense), the cache holds 12 (1.5 layers). Copies
# are paced to 1 GB/s so that misses cost time, as over PCIe.
echo "== starting moe-cached (${arch:-kjv-moe}: $cache_experts experts cached, policy moe-infinity, link 1 GB/s, misses run where cheaper)"
$bin/moe-cached --model "$name=$model" --listen "unix:$work/cached.sock" \
  --metrics-addr "" --cache-experts "$cache_experts" --policy moe-infinity --prefetch on \
  --link-gbps 1 --miss-mode auto --state-dir "$work/state" 2>"$work/cached.log" &
cached_pid=$!
wait_for_socket "$work/cached.sock" "$cached_pid" moe-cached || { cat "$work/cached.log"; exit 1; }

# A free loopback port for the worker's /metrics (moectl stats reads it).
metrics_port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo "== starting moe-worker (CPU backend, experts from the daemon, metrics on 127.0.0.1:$metrics_port)"
$bin/moe-worker --model "$model" --listen "unix:$work/worker.sock" \
  --cache "unix:$work/cached.sock" --cache-model "$name" --device cpu \
  --metrics-addr "127.0.0.1:$metrics_port" 2>"$work/worker.log" &
worker_pid=$!
wait_for_socket "$work/worker.sock" "$worker_pid" moe-worker || { cat "$work/worker.log"; exit 1; }

# The same prompt and seed give the same text for every cache size, policy
# and miss mode (see tests/integration): the third prompt repeats the first.
i=0
for prompt in "${prompts[@]}"; do
  i=$((i + 1))
  if [ "$i" = 3 ]; then
    echo "== moectl generate: \"$prompt\" again: a determinism check. The cache now holds other"
    echo "   experts and the daemon may answer misses differently; the text must be the same."
  else
    echo "== moectl generate: \"$prompt\""
  fi
  $bin/moectl generate --target "unix:$work/worker.sock" --prompt "$prompt" \
    --max-new-tokens 40 --ignore-eos "${sampling[@]}"
  echo
done

echo "== cache statistics"
$bin/moectl stats --cache "unix:$work/cached.sock" --worker "127.0.0.1:$metrics_port"
cat <<'EXPLAIN'
   How to read it: a hit is an expert the worker found in the daemon's arena;
   a miss was either copied in over the (emulated 1 GB/s) link, which the
   step waits for (stall), or, in miss mode auto, run by the worker's CPU
   straight from the daemon's host copy when that costs less than the copy:
   "misses run on the host". With every miss run on the host nothing waits
   for the link, so the stall is 0. The prefetch figures are copies started
   ahead of need from the learned activation matrices.
EXPLAIN

echo "== stopping"
kill -TERM "$worker_pid"
worker_rc=0; wait "$worker_pid" || worker_rc=$?
kill -TERM "$cached_pid"
cached_rc=0; wait "$cached_pid" || cached_rc=$?
worker_pid=""
cached_pid=""
echo "moe-worker exited $worker_rc, moe-cached exited $cached_rc"
[ "$worker_rc" = 0 ] && [ "$cached_rc" = 0 ]
