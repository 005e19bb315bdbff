#!/bin/sh
# Builds the pinned llama.cpp (llama-cpp-python 0.3.36's vendored copy, see scripts/get-llama-cpp.sh) with the
# tiered-KV-cache patches of this folder (patches/*.patch) applied, and the check programs check_tiers (llama.cpp's
# API only) and check_observe (also depthkv's headers: needs Eigen, skipped with a note when it is missing).
# The stock source comes from $DEPTHKV_LLAMA_DIR (default ~/.cache/depthkv/llama.cpp-0.3.36; fetched and built
# by scripts/get-llama-cpp.sh when missing). The patched copy and its build go to $DEPTHKV_LLAMA_TIERED_DIR
# (default ~/.cache/depthkv/llama.cpp-0.3.36-tiered): src/ (stock src + patches), build/ (Release, the same cmake
# options as get-llama-cpp.sh, target llama), build/bin/check_*. Prints the folder of libllama.so and the checks
# (build/bin) on its last line. Idempotent: the library is rebuilt only when the patches changed (their sha256 is
# kept in build/depthkv-patches.sha256), a check program only when the library or its source changed
# (build/bin/<check>.sha256). Needs cmake, patch, sha256sum and a C++17 compiler; $EIGEN_DIR (default
# /usr/include/eigen3) for check_observe.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VERSION=0.3.36
STOCK="${DEPTHKV_LLAMA_DIR:-$HOME/.cache/depthkv/llama.cpp-$VERSION}"
DIR="${DEPTHKV_LLAMA_TIERED_DIR:-$HOME/.cache/depthkv/llama.cpp-$VERSION-tiered}"
JOBS="${JOBS:-2}"
CXX="${CXX:-c++}"
EIGEN_DIR="${EIGEN_DIR:-/usr/include/eigen3}"
BIN="$DIR/build/bin"
STAMP="$DIR/build/depthkv-patches.sha256"
fail() { echo "build.sh: $*" >&2; exit 1; }

command -v patch > /dev/null 2>&1 || fail "needs patch(1)"
command -v sha256sum > /dev/null 2>&1 || fail "needs sha256sum"
ls "$HERE"/patches/*.patch > /dev/null 2>&1 || fail "no patches in $HERE/patches"

HASH=$(cat "$HERE"/patches/*.patch | sha256sum | cut -d' ' -f1)
LIB_OK=0
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ] && [ -f "$BIN/libllama.so" ]; then
  LIB_OK=1
fi

if [ "$LIB_OK" = 0 ]; then
  if [ ! -f "$STOCK/src/CMakeLists.txt" ]; then
    echo "build.sh: no stock source in $STOCK/src, fetching it with scripts/get-llama-cpp.sh" >&2
    DEPTHKV_LLAMA_DIR="$STOCK" sh "$REPO/scripts/get-llama-cpp.sh" > /dev/null || fail "scripts/get-llama-cpp.sh failed"
    [ -f "$STOCK/src/CMakeLists.txt" ] || fail "still no stock source in $STOCK/src"
  fi

  mkdir -p "$DIR" || fail "cannot create $DIR"
  rm -rf "$DIR/src.new"
  # cp -p keeps the stock timestamps, so that a rebuild only recompiles the patched files
  cp -Rp "$STOCK/src" "$DIR/src.new" || fail "cannot copy $STOCK/src"
  for p in "$HERE"/patches/*.patch; do
    patch -p1 -s -N -d "$DIR/src.new" < "$p" > "$DIR/patch.log" 2>&1 ||
      fail "patch $(basename "$p") does not apply to $STOCK/src (see $DIR/patch.log)"
  done
  rm -rf "$DIR/src"
  mv "$DIR/src.new" "$DIR/src"
  rm -f "$STAMP"

  cmake -S "$DIR/src" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON > "$DIR/configure.log" 2>&1 ||
    fail "cmake configure failed (see $DIR/configure.log)"
  nice -n 10 cmake --build "$DIR/build" -j "$JOBS" --target llama > "$DIR/build.log" 2>&1 ||
    fail "build failed (see $DIR/build.log)"
  [ -f "$BIN/libllama.so" ] || fail "no libllama.so in $BIN"
  echo "$HASH" > "$STAMP"
fi

# check programs: rebuilt when the library or their source changed
build_check() { # name, extra compiler flags
  chash=$(cat "$STAMP" "$HERE/$1.cpp" | sha256sum | cut -d' ' -f1)
  if [ -x "$BIN/$1" ] && [ -f "$BIN/$1.sha256" ] && [ "$(cat "$BIN/$1.sha256")" = "$chash" ]; then
    return 0
  fi
  rm -f "$BIN/$1.sha256"
  # shellcheck disable=SC2086
  nice -n 10 "$CXX" -std=c++17 -O2 -Wall $2 -I"$DIR/src/include" -I"$DIR/src/ggml/include" "$HERE/$1.cpp" \
    -L"$BIN" -lllama -lggml -lggml-base -Wl,-rpath,"$BIN" -o "$BIN/$1" > "$DIR/$1.log" 2>&1 ||
    fail "$1.cpp does not build (see $DIR/$1.log)"
  echo "$chash" > "$BIN/$1.sha256"
}
build_check check_tiers ""
if [ -f "$EIGEN_DIR/Eigen/Core" ]; then
  build_check check_observe "-I$REPO/include -I$EIGEN_DIR -fopenmp"
else
  echo "build.sh: no Eigen in $EIGEN_DIR (set EIGEN_DIR), check_observe not built" >&2
fi

if [ "$LIB_OK" = 1 ]; then
  echo "build.sh: $BIN holds libllama.so built from the same patches"
else
  echo "build.sh: built the tiered llama.cpp (llama-cpp-python $VERSION + $(ls "$HERE"/patches/*.patch | wc -l) patches) in $BIN"
fi
echo "$BIN"
