#!/bin/sh
# Builds the pinned llama.cpp (llama-cpp-python 0.3.36's vendored copy, see scripts/get-llama-cpp.sh) with the
# tiered-KV-cache patches of this folder (patches/*.patch) applied, and the check program check_tiers.
# The stock source comes from $DEPTHKV_LLAMA_DIR (default ~/.cache/depthkv/llama.cpp-0.3.36; fetched and built
# by scripts/get-llama-cpp.sh when missing). The patched copy and its build go to $DEPTHKV_LLAMA_TIERED_DIR
# (default ~/.cache/depthkv/llama.cpp-0.3.36-tiered): src/ (stock src + patches), build/ (Release, the same cmake
# options as get-llama-cpp.sh, targets llama and check_tiers). Prints the folder of libllama.so and check_tiers
# (build/bin) on its last line. Idempotent: skipped when build/ was built from the same patches and check_tiers.cpp
# (their sha256 is kept in build/depthkv-patches.sha256). Needs cmake, patch, sha256sum and a C++17 compiler.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VERSION=0.3.36
STOCK="${DEPTHKV_LLAMA_DIR:-$HOME/.cache/depthkv/llama.cpp-$VERSION}"
DIR="${DEPTHKV_LLAMA_TIERED_DIR:-$HOME/.cache/depthkv/llama.cpp-$VERSION-tiered}"
JOBS="${JOBS:-2}"
CXX="${CXX:-c++}"
BIN="$DIR/build/bin"
STAMP="$DIR/build/depthkv-patches.sha256"
fail() { echo "build.sh: $*" >&2; exit 1; }

command -v patch > /dev/null 2>&1 || fail "needs patch(1)"
command -v sha256sum > /dev/null 2>&1 || fail "needs sha256sum"
ls "$HERE"/patches/*.patch > /dev/null 2>&1 || fail "no patches in $HERE/patches"

HASH=$(cat "$HERE"/patches/*.patch "$HERE/check_tiers.cpp" | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ] && [ -f "$BIN/libllama.so" ] && [ -x "$BIN/check_tiers" ]; then
  echo "build.sh: $BIN holds libllama.so and check_tiers built from the same patches"
  echo "$BIN"
  exit 0
fi

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

"$CXX" -std=c++17 -O2 -Wall -I"$DIR/src/include" -I"$DIR/src/ggml/include" "$HERE/check_tiers.cpp" \
  -L"$BIN" -lllama -Wl,-rpath,"$BIN" -o "$BIN/check_tiers" > "$DIR/check_tiers.log" 2>&1 ||
  fail "check_tiers.cpp does not build (see $DIR/check_tiers.log)"

echo "$HASH" > "$STAMP"
echo "build.sh: built the tiered llama.cpp (llama-cpp-python $VERSION + $(ls "$HERE"/patches/*.patch | wc -l) patches) in $BIN"
echo "$BIN"
