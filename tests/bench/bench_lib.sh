# Shell helpers shared by the end-to-end bench and check scripts (sourced).

# bench_cleanup: the service benches' EXIT trap (`trap bench_cleanup EXIT`):
# TERM to every process in $pids, wait for them, remove $work.
bench_cleanup() {
  for p in ${pids:-}; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}

# wait_for_socket PATH PID: waits up to 30 s for the Unix socket PATH to
# appear; fails at once if process PID exits first.
wait_for_socket() {
  for _ in $(seq 1 300); do
    [ -S "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
