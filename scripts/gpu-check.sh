#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU, build with CUDA, run every GPU
# test (ctest label "gpu" plus the CUDA module/backend tests, with skips
# turned into failures) and the GPU benchmark, then print a short table.
# Designed to finish within 8 minutes.
#
#   scripts/gpu-check.sh            # on the GPU machine
#   scripts/gpu-check.sh --bundle   # on a dev machine without a GPU: build
#                                   # with CUDA and pack build-gpu/bundle
#
# Two ways to run on the GPU machine:
#  * source: when the project's build dependencies (gRPC, abseil, GoogleTest,
#    ...) are installed there, configure and build into build-gpu.
#  * bundle: when they are not (e.g. a bare CUDA image), run the binaries that
#    `--bundle` packed (with their own loader and libraries, so no system
#    library is needed but the driver and cuBLAS 13). Ship build-gpu/bundle
#    with the working tree (it is git-ignored; the device tool's `carry`),
#    e.g. run: command "scripts/gpu-check.sh", carry ["build-gpu/bundle"].
# Without a GPU it exits 2 with a message saying so.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${GPU_CHECK_BUILD_DIR:-build-gpu}
BUNDLE=$BUILD/bundle
DEADLINE=$((SECONDS + ${GPU_CHECK_BUDGET_S:-470}))
declare -a ROWS=()
FAILED=0

row() { ROWS+=("$(printf '%-28s %-5s %6ss  %s' "$1" "$2" "$3" "$4")"); }
left() { local l=$((DEADLINE - SECONDS)); ((l < 10)) && l=10; echo $l; }
table() {
  echo
  echo "==== gpu-check summary ($(date -u +%FT%TZ)) ===="
  printf '%-28s %-5s %7s  %s\n' step result time detail
  for r in "${ROWS[@]}"; do echo "$r"; done
  ((FAILED)) && echo "gpu-check: FAILED" || echo "gpu-check: OK"
}

# step NAME DETAIL_CMD -- COMMAND...: runs COMMAND with the remaining time,
# logs to $BUILD/gpu-check-NAME.log, records a table row.
step() {
  local name=$1; shift
  local t0=$SECONDS log="$BUILD/gpu-check-$name.log"
  timeout "$(left)" "$@" >"$log" 2>&1
  local rc=$?
  local detail
  detail=$(grep -E '^(RESULT|\[  PASSED  \]|\[  SKIPPED \]| [0-9]+ FAILED|[0-9]+% tests passed)' "$log" |
           tail -n 2 | tr '\n' ' ' | cut -c1-90)
  ((rc == 124)) && detail="timed out; $detail"
  if ((rc == 0)); then row "$name" ok $((SECONDS - t0)) "$detail"
  else row "$name" FAIL $((SECONDS - t0)) "rc=$rc $detail (see $log)"; FAILED=1
       tail -n 30 "$log"; fi
  return $rc
}

gpu_present() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

make_bundle() {
  command -v /usr/local/cuda/bin/nvcc >/dev/null 2>&1 || command -v nvcc >/dev/null 2>&1 || {
    echo "gpu-check --bundle: nvcc not found; cannot build the CUDA module" >&2; exit 2; }
  mkdir -p "$BUILD"
  cmake -S . -B "$BUILD" -G Ninja -DMOE_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES="80;90" >"$BUILD/configure.log" 2>&1 || {
    tail -n 20 "$BUILD/configure.log"; exit 1; }
  grep -q "CUDA module ON" "$BUILD/configure.log" || { echo "CUDA was not enabled" >&2; exit 1; }
  local targets="moe_cuda backend_ops_test deepseek_ops_test gpt_oss_ops_test cuda_module_test cuda_backend_test cuda_gguf_ops_test cpu_backend_test gguf_block_math_test kernel_bench cuda_copy_engine_test device_memory_test"
  cmake --build "$BUILD" -j"$(nproc)" --target $targets || exit 1
  rm -rf "$BUNDLE" && mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
  cp "$BUILD"/tests/{backend_ops_test,deepseek_ops_test,gpt_oss_ops_test,cuda_module_test,cuda_backend_test,cuda_gguf_ops_test,cpu_backend_test,gguf_block_math_test,cuda_copy_engine_test,device_memory_test} \
     "$BUILD/bin/kernel_bench" "$BUNDLE/bin/"
  cp "$BUILD/lib/libmoe_cuda.so" "$BUNDLE/lib/"
  # Every library the binaries need except the driver and cuBLAS (too big;
  # the GPU machine has its own), plus the loader they were linked against.
  for f in "$BUNDLE"/bin/* "$BUNDLE/lib/libmoe_cuda.so"; do
    ldd "$f" | awk '/=> \//{print $3}'
  done | sort -u | grep -Ev 'libcublas|libcuda\.so' | while read -r lib; do
    cp -L "$lib" "$BUNDLE/lib/"
  done
  cp -L /lib64/ld-linux-x86-64.so.2 "$BUNDLE/lib/"
  echo "bundle: $(du -sh "$BUNDLE" | cut -f1) in $BUNDLE" | tee "$BUNDLE/manifest"
}

# Directories holding libcuda.so.1 and libcublas(Lt).so.13 on this machine.
cuda_lib_path() {
  local dirs=() f
  for f in $(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1|libcublas(Lt)?\.so\.13/{print $NF}'); do
    dirs+=("$(dirname "$f")")
  done
  for f in /usr/local/cuda/lib64/libcublas.so.13 /usr/local/nvidia/lib64/libcuda.so.1 \
           $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p)))' 2>/dev/null); do
    [ -e "$f" ] && dirs+=("$( [ -d "$f" ] && echo "$f" || dirname "$f")")
  done
  local IFS=:; echo "${dirs[*]}"
}

run_bundle() {
  local B=$ROOT/$BUNDLE
  local libs="$B/lib:$(cuda_lib_path)"
  local run=("$B/lib/ld-linux-x86-64.so.2" --library-path "$libs")
  export MOE_CUDA_MODULE=$B/lib/libmoe_cuda.so MOE_REQUIRE_CUDA=1
  for t in cuda_module_test cuda_backend_test cuda_gguf_ops_test backend_ops_test deepseek_ops_test gpt_oss_ops_test cuda_copy_engine_test device_memory_test; do
    step "$t" "${run[@]}" "$B/bin/$t"
  done
  # The GPU host's CPU likely has AVX-512, which the dev machines lack: run
  # the SIMD dispatch parity test there too.
  step cpu-simd "${run[@]}" "$B/bin/cpu_backend_test"
  # The ggml kernels' block math on the host, beside their GPU run.
  step gguf_block_math_test "${run[@]}" "$B/bin/gguf_block_math_test"
  step kernel_bench "${run[@]}" "$B/bin/kernel_bench" --backend=cuda --reps=5
}

run_source() {
  local arch
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d ' .')
  step configure cmake -S . -B "$BUILD" -G Ninja -DMOE_WITH_CUDA=ON \
       -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" || return
  grep -q "CUDA module ON" "$BUILD/gpu-check-configure.log" || {
    row cuda-enabled FAIL 0 "configure did not enable CUDA"; FAILED=1; return; }
  # Keep going past unrelated breakage; the GPU targets are what matter here.
  step build cmake --build "$BUILD" -j"$(nproc)" -- -k 0
  export MOE_REQUIRE_CUDA=1
  step gpu-tests ctest --test-dir "$BUILD" -L gpu --output-on-failure \
       --timeout 240 -j 4
  step cpu-simd ctest --test-dir "$BUILD" -R 'CpuDispatchTest|CpuBackendTest' \
       --output-on-failure
  step kernel_bench "$BUILD/bin/kernel_bench" --backend=cuda --reps=5
  # moe-cached with a CUDA arena + moe-worker mapping it over CUDA IPC.
  step cuda-e2e tests/bench/cuda_e2e_check.sh "$BUILD"
}

if [ "${1:-}" = "--bundle" ]; then make_bundle; exit $?; fi

if ! gpu_present; then
  echo "gpu-check: no NVIDIA GPU visible (nvidia-smi missing or lists no GPU)." >&2
  echo "gpu-check: run this on a machine with a GPU; to prepare binaries for a" >&2
  echo "gpu-check: bare GPU machine from here, run: scripts/gpu-check.sh --bundle" >&2
  exit 2
fi
mkdir -p "$BUILD"
row gpu ok 0 "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1)"
MODE=${GPU_CHECK_MODE:-}
if [ -z "$MODE" ]; then
  if cmake -S . -B "$BUILD/probe" -G Ninja -DMOE_WITH_CUDA=OFF >/dev/null 2>&1; then
    MODE=source
  elif [ -f "$BUNDLE/manifest" ]; then
    MODE=bundle
  else
    echo "gpu-check: the project's build dependencies are missing here and no" >&2
    echo "gpu-check: $BUNDLE exists; make one with --bundle on a dev machine." >&2
    exit 2
  fi
fi
row mode ok 0 "$MODE"
if [ "$MODE" = bundle ]; then run_bundle; else run_source; fi
table
exit $FAILED
