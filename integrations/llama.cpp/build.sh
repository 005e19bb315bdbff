#!/bin/sh
# Builds the pinned llama.cpp (llama-cpp-python 0.3.36's vendored copy, see scripts/get-llama-cpp.sh) with the
# tiered-KV-cache patches of this folder (patches/*.patch) applied, and the programs on it: check_tiers (llama.cpp's
# API only); check_observe, llamacpp_generate and check_quality (also depthkv's headers and the adapter
# depthkv_llamacpp.hpp: need Eigen, skipped with a note when it is missing); llamacpp_generate_stock (the same
# program on the unpatched library, when scripts/get-llama-cpp.sh built it).
# The stock source comes from $DEPTHKV_LLAMA_DIR (default ~/.cache/depthkv/llama.cpp-0.3.36; fetched and built
# by scripts/get-llama-cpp.sh --source-only when missing). The patched copy and its build go to $DEPTHKV_LLAMA_TIERED_DIR
# (default ~/.cache/depthkv/llama.cpp-0.3.36-tiered): src/ (stock src + patches), build/ (Release, the same cmake
# options as get-llama-cpp.sh, target llama), build/bin/<program>. Prints the folder of libllama.so and the
# programs (build/bin) on its last line. Idempotent: the library is rebuilt only when the patches changed (their
# sha256 is kept in build/depthkv-patches.sha256), a program only when its library, its source or the adapter
# changed (build/bin/<program>.sha256). Needs cmake, patch, sha256sum and a C++17 compiler; $EIGEN_DIR (default
# /usr/include/eigen3) for the programs on depthkv's headers.
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
    DEPTHKV_LLAMA_DIR="$STOCK" sh "$REPO/scripts/get-llama-cpp.sh" --source-only > /dev/null || fail "scripts/get-llama-cpp.sh failed"
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

# programs: rebuilt when the library, their source or the adapter header changed
build_prog() { # name, output, library folder, include flags, extra compiler flags
  chash=$(cat "$STAMP" "$HERE/$1.cpp" "$HERE/depthkv_llamacpp.hpp" "$HERE/run_args.hpp" "$3/libllama.so" | sha256sum | cut -d' ' -f1)
  if [ -x "$BIN/$2" ] && [ -f "$BIN/$2.sha256" ] && [ "$(cat "$BIN/$2.sha256")" = "$chash" ]; then
    return 0
  fi
  rm -f "$BIN/$2.sha256"
  # shellcheck disable=SC2086
  nice -n 10 "$CXX" -std=c++17 -O2 -Wall $4 $5 "$HERE/$1.cpp" \
    -L"$3" -lllama -lggml -lggml-base -Wl,-rpath,"$3" -o "$BIN/$2" > "$DIR/$2.log" 2>&1 ||
    fail "$1.cpp does not build (see $DIR/$2.log)"
  echo "$chash" > "$BIN/$2.sha256"
}
TIERED_INC="-I$DIR/src/include -I$DIR/src/ggml/include"
build_prog check_tiers check_tiers "$BIN" "$TIERED_INC" ""
if [ -f "$EIGEN_DIR/Eigen/Core" ]; then
  build_prog check_observe check_observe "$BIN" "$TIERED_INC" "-I$REPO/include -I$EIGEN_DIR -fopenmp"
  build_prog llamacpp_generate llamacpp_generate "$BIN" "$TIERED_INC" "-I$REPO/include -I$EIGEN_DIR -fopenmp"
  build_prog check_quality check_quality "$BIN" "$TIERED_INC" "-I$REPO/include -I$EIGEN_DIR -fopenmp"
else
  echo "build.sh: no Eigen in $EIGEN_DIR (set EIGEN_DIR), check_observe, llamacpp_generate and check_quality not built" >&2
fi
# the same program on the unpatched library (full cache only): the stock side of the memory table
if [ -f "$STOCK/build/bin/libllama.so" ]; then
  build_prog llamacpp_generate llamacpp_generate_stock "$STOCK/build/bin" \
    "-I$STOCK/src/include -I$STOCK/src/ggml/include" "-DDEPTHKV_STOCK"
else
  echo "build.sh: no stock libllama.so in $STOCK/build/bin (scripts/get-llama-cpp.sh builds it): llamacpp_generate_stock not built" >&2
fi

if [ "$LIB_OK" = 1 ]; then
  echo "build.sh: $BIN holds libllama.so built from the same patches"
else
  echo "build.sh: built the tiered llama.cpp (llama-cpp-python $VERSION + $(ls "$HERE"/patches/*.patch | wc -l) patches) in $BIN"
fi
echo "$BIN"
