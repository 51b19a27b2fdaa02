#!/usr/bin/env bash
# The main job on the built-in tiny model: set up, build, make the model and
# describe it. (Serving through moe-cached and moe-worker joins as it lands.)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"

bin=build/bin
$bin/moectl info
model=${MOE_DEMO_MODEL:-build/demo/tiny-mixtral}
if [ -x $bin/moectl ] && $bin/moectl make-model --help >/dev/null 2>&1; then
  $bin/moectl make-model --preset tiny --arch mixtral --out "$model"
  $bin/moectl inspect "$model"
  echo "== moectl run: greedy generation on the tiny model (random weights, so the text is noise)"
  $bin/moectl run --model "$model" --prompt "The expert cache keeps" --max-new-tokens 24 --ignore-eos
fi
