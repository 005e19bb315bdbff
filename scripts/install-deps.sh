#!/bin/sh
# Installs the Debian 12 packages depthkv's build, tests, tools and benchmarks need.
set -eu
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake libeigen3-dev catch2 libcli11-dev nlohmann-json3-dev \
  libbenchmark-dev gnuplot-nox clang libclang-rt-14-dev libomp-dev libpcre2-dev pkg-config \
  python3-venv python3-dev patch >/dev/null
echo "install-deps: done"
