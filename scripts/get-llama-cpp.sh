#!/bin/sh
# Builds the pinned llama.cpp that depthkv's speed figures compare against: the llama.cpp vendored in
# llama-cpp-python 0.3.36's source distribution (PyPI), built in Release with its defaults
# (GGML_NATIVE on: the build machine's instruction sets; OpenMP), programs llama-bench,
# llama-perplexity and llama-quantize. Into a cache outside the repository,
# $DEPTHKV_LLAMA_DIR (default ~/.cache/depthkv/llama.cpp-0.3.36); prints the folder of the programs
# (build/bin) on its last line. Idempotent: a folder already holding the three programs is kept.
# Needs python3 with pip, cmake and a C++ compiler; about 10 minutes on 2 cores.
# --source-only: fetch the source into $DEPTHKV_LLAMA_DIR/src and build nothing (what
# integrations/llama.cpp/build.sh needs); prints that folder on its last line.
# llama-bench's --repack 0|1 turns llama.cpp's weight repacking off or on; every figure says which.
set -eu
VERSION=0.3.36
DIR="${DEPTHKV_LLAMA_DIR:-$HOME/.cache/depthkv/llama.cpp-$VERSION}"
PY="${PYTHON:-python3}"
JOBS="${JOBS:-2}"
BIN="$DIR/build/bin"
fail() { echo "get-llama-cpp.sh: $*" >&2; exit 1; }
SOURCE_ONLY=0
[ "${1:-}" = "--source-only" ] && SOURCE_ONLY=1
if [ "$SOURCE_ONLY" = 0 ] && [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-perplexity" ] && [ -x "$BIN/llama-quantize" ]; then
  echo "get-llama-cpp.sh: $BIN holds llama-bench, llama-perplexity and llama-quantize"
  echo "$BIN"
  exit 0
fi
mkdir -p "$DIR" || fail "cannot create $DIR"
if [ ! -f "$DIR/src/CMakeLists.txt" ]; then
  WORK=$(mktemp -d "$DIR/.fetch.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT INT TERM
  "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK" ||
    fail "pip could not fetch llama-cpp-python==$VERSION's source distribution"
  tar -xzf "$WORK"/llama_cpp_python-$VERSION.tar.gz -C "$WORK" || fail "cannot unpack the source distribution"
  [ -f "$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp/CMakeLists.txt" ] || fail "no vendor/llama.cpp in the sdist"
  rm -rf "$DIR/src"
  mv "$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp" "$DIR/src"
fi
if [ "$SOURCE_ONLY" = 1 ]; then
  echo "get-llama-cpp.sh: $DIR/src holds llama.cpp's source (llama-cpp-python $VERSION)"
  echo "$DIR/src"
  exit 0
fi
cmake -S "$DIR/src" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON > "$DIR/configure.log" 2>&1 ||
  fail "cmake configure failed (see $DIR/configure.log)"
cmake --build "$DIR/build" -j "$JOBS" --target llama-bench llama-perplexity llama-quantize > "$DIR/build.log" 2>&1 ||
  fail "build failed (see $DIR/build.log)"
echo "get-llama-cpp.sh: built llama.cpp (llama-cpp-python $VERSION) in $BIN"
echo "$BIN"
