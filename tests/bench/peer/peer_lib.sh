# Shared by tests/bench/peer_bench.sh and tests/bench/peer/gguf_agreement.sh
# (sourced, not run): llama.cpp's prebuilt release from npm and the tools
# built against it, in the scratch folder $peer. Never in CI.
#
# peer_setup: needs $peer (an existing folder), $root (the repo), $py, $work
# (a scratch folder for logs) and die/log; installs, clones and builds what
# is missing and sets nlc_version, bins, src, llama_tag, libllama, libggml,
# driver (llama_driver) and read_bw.

peer_check_tools() {
  local tool
  for tool in npm node git g++; do
    command -v "$tool" >/dev/null ||
      die "'$tool' is missing (Debian: apt-get install nodejs npm git g++; scripts/setup-deps.sh installs Node)"
  done
}

peer_setup() {
  # 1. llama.cpp: prebuilt libraries from npm, sources from its bundle
  nlc_version=3.22.1
  bins=$peer/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
  installed=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' \
    "$peer/node_modules/@node-llama-cpp/linux-x64/package.json" 2>/dev/null | head -1 || true)
  if [ "$installed" != "$nlc_version" ] || ! ls "$bins"/libllama*.so >/dev/null 2>&1; then
    log "installing node-llama-cpp@$nlc_version + @node-llama-cpp/linux-x64@$nlc_version into $peer"
    [ -f "$peer/package.json" ] || echo '{"name": "moe-peer-bench", "private": true}' >"$peer/package.json"
    (cd "$peer" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --ignore-scripts --omit=optional \
       --no-audit --no-fund "node-llama-cpp@$nlc_version" "@node-llama-cpp/linux-x64@$nlc_version") \
       >"$work/npm.log" 2>&1 || { cat "$work/npm.log" >&2; die "npm install failed (registry reachable? see above)"; }
    ls "$bins"/libllama*.so >/dev/null 2>&1 || die "npm installed no libllama under $bins"
  fi
  bundle=$peer/node_modules/node-llama-cpp/llama/gitRelease.bundle
  src=$peer/llama.cpp
  if [ ! -f "$src/include/llama.h" ]; then
    [ -f "$bundle" ] || die "no llama.cpp bundle at $bundle"
    log "cloning the llama.cpp bundle into $src"
    rm -rf "$src"
    git clone -q "$bundle" "$src" 2>"$work/clone.log" || { cat "$work/clone.log" >&2; die "git clone of $bundle failed"; }
  fi
  llama_tag=$("$py" -c "import json; print(json.load(open('$peer/node_modules/node-llama-cpp/llama/llama.cpp.info.json'))['tag'])" 2>/dev/null || echo "?")
  libllama=$(basename "$(ls "$bins"/libllama.*so | grep -v common | head -1)")
  libggml=$(basename "$(ls "$bins"/libggml.*so | head -1)")

  # 2. the driver and the bandwidth probe
  driver=$peer/llama_driver
  if [ ! -x "$driver" ] || [ "$root/tests/bench/peer/llama_driver.cc" -nt "$driver" ]; then
    log "building $driver"
    nice -n 10 g++ -O2 -std=c++17 -Wall -I"$src/include" -I"$src/ggml/include" \
      "$root/tests/bench/peer/llama_driver.cc" -o "$driver" \
      -L"$bins" -l:"$libllama" -l:"$libggml" -l:libggml-base.so -Wl,-rpath,"$bins" ||
      die "building llama_driver failed"
  fi
  read_bw=$peer/read_bw
  if [ ! -x "$read_bw" ] || [ "$root/tests/bench/peer/read_bw.cc" -nt "$read_bw" ]; then
    nice -n 10 g++ -O2 -mavx2 -std=c++17 -Wall -pthread "$root/tests/bench/peer/read_bw.cc" \
      -o "$read_bw" || die "building read_bw failed"
  fi
}
