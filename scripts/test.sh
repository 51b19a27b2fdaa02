#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every test.
#   scripts/test.sh              all tests (CUDA module too where nvcc exists)
#   scripts/test.sh --sanitize   the same suite under ASan+UBSan (no CUDA module)
#   scripts/test.sh --quick      only the tests labelled "quick" (parsers,
#                                fuzzers, malformed input, the services' input
#                                handling, concurrency, faults); CI runs
#                                `--sanitize --quick` after the full suite
#   scripts/test.sh --long       also the long variants (soak, fuzzing for a
#                                time budget from fresh seeds)
# Exit code: 0 only if the build and every test passed.
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=0
quick=0
for arg in "$@"; do
  case "$arg" in
    --sanitize) sanitize=1 ;;
    --quick) quick=1 ;;
    --long) export MOE_LONG_TESTS=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown flag $arg" >&2; exit 2 ;;
  esac
done

scripts/setup-deps.sh

build=build
# -Werror here (CI runs this script), not in a developer's default build.
cmake_flags=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOE_WERROR=ON)
if [ "$sanitize" = 1 ]; then
  build=build-asan
  cmake_flags+=(-DMOE_SANITIZE=ON)
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fi

jobs=$(nproc)
cmake -S . -B "$build" "${cmake_flags[@]}"
if [ "$quick" = 1 ]; then
  cmake --build "$build" -j"$jobs" --target quick_tests
  ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout 900 -L quick
else
  cmake --build "$build" -j"$jobs"
  ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout 900
fi
