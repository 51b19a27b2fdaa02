#!/usr/bin/env bash
# Installs the Debian packages moecache builds and tests with. Idempotent: it
# only calls apt-get when something is missing.
#   scripts/setup-deps.sh          everything the tests use (scripts/test.sh)
#   scripts/setup-deps.sh --demo   only what building the three binaries and
#                                  running scripts/demo.sh need
set -euo pipefail

demo=0
if [ "${1:-}" = "--demo" ]; then demo=1; fi

# What the binaries build with (CMake configures the test targets too, so
# GoogleTest is here) and the demo runs with.
PKGS=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev
  libsentencepiece-dev libsystemd-dev libcpp-httplib-dev
  python3
)
# The tests and benchmarks beside them.
if [ "$demo" = 0 ]; then
  PKGS+=(
    libbenchmark-dev python3-numpy python3-grpcio python3-grpc-tools
    prometheus curl gnuplot-nox systemd openssl
  )
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# The OpenAI Node client test needs node and npm (Debian's nodejs is enough);
# a node already on PATH (e.g. v20) is kept.
if [ "$demo" = 0 ] && { ! command -v node >/dev/null || ! command -v npm >/dev/null; }; then
  missing+=(nodejs npm)
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-deps: all ${#PKGS[@]} packages present"
else
  echo "setup-deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The official OpenAI Node client, at the version package-lock.json pins, for
# tests/openai/http_process_test. Without the registry this fails (and so
# does that test, naming this script): it never skips.
NODE_DIR="$(cd "$(dirname "$0")/.." && pwd)/tests/openai_node"
if [ "$demo" = 0 ] && [ ! -f "$NODE_DIR/node_modules/openai/package.json" ]; then
  echo "setup-deps: npm ci in $NODE_DIR"
  (cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error)
fi
