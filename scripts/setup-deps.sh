#!/usr/bin/env bash
# Installs the Debian packages moecache builds and tests with. Idempotent: it
# only calls apt-get when something is missing.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libsentencepiece-dev libsystemd-dev libcpp-httplib-dev
  python3 python3-numpy python3-grpcio python3-grpc-tools
  prometheus curl gnuplot-nox systemd openssl
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# The OpenAI Node client test needs node and npm (Debian's nodejs is enough);
# a node already on PATH (e.g. v20) is kept.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
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
if [ ! -f "$NODE_DIR/node_modules/openai/package.json" ]; then
  echo "setup-deps: npm ci in $NODE_DIR"
  (cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error)
fi
