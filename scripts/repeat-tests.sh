#!/usr/bin/env bash
# Runs the built suite several times in a row to find flaky tests, optionally
# beside CPU hogs (one busy loop per core), and prints one line per run.
#   scripts/repeat-tests.sh [--sanitize] [--runs N] [--hog] [--log DIR] [-- CTEST_ARGS]
# Build first (scripts/test.sh, or cmake --build build / build-asan). Each
# run's full ctest output is kept in DIR (default /tmp/moe-repeat-tests); the
# summary lines go to stdout and DIR/summary.txt. Exit 0 only if every run
# passed.
set -uo pipefail
cd "$(dirname "$0")/.."

build=build
runs=3
hog=0
logdir=/tmp/moe-repeat-tests
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) build=build-asan ;;
    --runs) runs=$2; shift ;;
    --hog) hog=1 ;;
    --log) logdir=$2; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "repeat-tests.sh: unknown flag $1" >&2; exit 2 ;;
  esac
  shift
done
if [ "$build" = build-asan ]; then
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fi
mkdir -p "$logdir"

hogs=()
stop_hogs() { for p in "${hogs[@]}"; do kill "$p" 2>/dev/null; done; hogs=(); }
trap stop_hogs EXIT
if [ "$hog" = 1 ]; then
  for _ in $(seq "$(nproc)"); do
    bash -c 'while :; do :; done' &
    hogs+=($!)
  done
fi

failed_runs=0
for i in $(seq "$runs"); do
  out="$logdir/$build-run$i-$(date -u +%H%M%S).log"
  start=$(date +%s)
  ctest --test-dir "$build" -j"$(nproc)" --timeout 900 --output-on-failure "$@" > "$out" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  result=$(grep -E 'tests passed, [0-9]+ tests failed out of' "$out" | tail -1)
  failed=$(sed -n '/The following tests FAILED:/,$p' "$out" | grep -E '^\s+[0-9]+ - ' \
           | sed -E 's/^\s+[0-9]+ - //' | tr '\n' ';')
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  line="$(date -u +%FT%TZ) $build run $i/$runs hog=$hog rc=$rc ${secs}s load=[$load] $result ${failed:+FAILED: $failed}"
  echo "$line" | tee -a "$logdir/summary.txt"
  [ "$rc" = 0 ] || failed_runs=$((failed_runs + 1))
done
exit $(( failed_runs > 0 ))
