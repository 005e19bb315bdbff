#!/usr/bin/env bash
# Builds the GPU check's programs into one folder, with nvcc directly (no CMake, no Catch2), so a
# GPU machine runs them without compiling (scripts/gpu_check.sh --prebuilt DIR):
#   cuda_score_test, cuda_evict_test, cuda_paged_compact_test, evict_cuda_bench
# Code for sm_80 and sm_90 plus compute_90 PTX (JIT-compiled by newer drivers), static CUDA
# runtime, static libstdc++/libgcc, -O3, warnings as errors (nvcc -Werror=all-warnings and the host
# compiler's -Wall -Wextra -Werror). DIR also gets:
#   BUILD_INFO  commit, date, host, nvcc release, architectures, flags, per-program build notes;
#   COMMIT      the commit alone (gpu_check.sh reads it: the GPU machine's copy may have no .git).
#
# Usage: scripts/build_gpu_binaries.sh [DIR]     (default build/gpu-prebuilt; one command here)
# Environment:
#   CUDA_ARCHS    space-separated compute capabilities (default "80 90"): SASS for each, PTX for the last
#   NVCC          the compiler (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc)
#   JOBS          parallel compiles (default 3)
#   BUILD_TIMEOUT seconds per program and attempt (default: none)
#   RETRY_NO_WERROR=1  a program that fails with -Werror is built once more without it (the
#                 on-device fallback of gpu_check.sh; BUILD_INFO and the output say so)
#   DEPTHKV_COMMIT the commit to record (default: git rev-parse, "(with local changes)" when dirty)
#   WHEEL_PYTHON  a Python with scikit-build-core and nanobind: DIR also gets the depthkv wheel
#                 (pip wheel, with the CUDA extension for CUDA_ARCHS) that gpu_check.sh's python_cuda
#                 step installs; its Python version must be the GPU machine's (a wheel is per version)
# Without Eigen (/usr/include/eigen3 or EIGEN_INCLUDE) the eviction test is built with
# -DDEPTHKV_TEST_NO_CPU_EVICTOR: its reference is then the naive one alone (the paged compaction
# test needs Eigen: its reference is PagedLayer with the CPU evictor).
# Exit status: 0 when every program was built.
set -u
cd "$(dirname "$0")/.." || exit 2
DIR=${1:-build/gpu-prebuilt}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_ARCHS=${CUDA_ARCHS:-80 90}
JOBS=${JOBS:-3}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-0}

GENCODE=()
last=""
for a in $CUDA_ARCHS; do
  GENCODE+=("-gencode=arch=compute_$a,code=sm_$a")
  last=$a
done
[ -n "$last" ] || { echo "build_gpu_binaries: no architecture in CUDA_ARCHS" >&2; exit 2; }
GENCODE+=("-gencode=arch=compute_$last,code=compute_$last")
# shellcheck disable=SC2054  # the commas belong to -Xcompiler
BASE=(-std=c++17 -O3 -DNDEBUG "${GENCODE[@]}" -cudart static -Xcompiler=-static-libstdc++,-static-libgcc
      -Iinclude -Itests)
EIGEN=${EIGEN_INCLUDE:-/usr/include/eigen3}
[ -d "$EIGEN" ] && BASE+=(-isystem "$EIGEN")
# shellcheck disable=SC2054
WERROR=(-Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror)

if [ -n "${DEPTHKV_COMMIT:-}" ]; then
  COMMIT=$DEPTHKV_COMMIT
elif git rev-parse --short HEAD >/dev/null 2>&1; then
  COMMIT="$(git rev-parse --short HEAD)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
else
  COMMIT=unknown
fi
echo "$COMMIT" >"$DIR/COMMIT"

compile() {  # compile SRC OUT LOG [extra flags...]: one attempt, with the timeout when set
  local src=$1 out=$2 log=$3
  shift 3
  echo "+ $NVCC ${BASE[*]} $* $src -o $out" >>"$log"
  if [ "$BUILD_TIMEOUT" -gt 0 ] 2>/dev/null; then
    timeout --signal=KILL "$BUILD_TIMEOUT" "$NVCC" "${BASE[@]}" "$@" "$src" -o "$out" >>"$log" 2>&1
  else
    "$NVCC" "${BASE[@]}" "$@" "$src" -o "$out" >>"$log" 2>&1
  fi
  local rc=$?
  [ $rc -eq 137 ] && echo "(timed out after ${BUILD_TIMEOUT}s)" >>"$log"
  return $rc
}

build_one() {  # build_one NAME SRC: -Werror; without the CPU evictor if Eigen is missing; retry without -Werror when asked
  local name=$1 src=$2 out="$DIR/$1" log="$DIR/$1.build.log" note="" extra=()
  : >"$log"
  rm -f "$out"
  [ "$name" = cuda_evict_test ] && [ ! -d "$EIGEN" ] && { extra=(-DDEPTHKV_TEST_NO_CPU_EVICTOR); note="no Eigen: naive reference only; "; }
  local t0
  t0=$(date +%s)
  if compile "$src" "$out" "$log" "${WERROR[@]}" "${extra[@]}"; then
    note="${note}-Werror"
  elif [ "${RETRY_NO_WERROR:-0}" = 1 ]; then
    echo "(retrying without -Werror)" >>"$log"
    if compile "$src" "$out" "$log" "${extra[@]}"; then
      note="${note}built WITHOUT -Werror (the -Werror build failed; see $name.build.log)"
    else
      note="${note}FAILED (also without -Werror)"
    fi
  else
    note="${note}FAILED"
  fi
  echo "$name: $note, $(( $(date +%s) - t0 ))s" >"$DIR/$name.note"
}

T0=$(date +%s)
i=0
for prog in "cuda_score_test tests/cuda/score_test.cu" "cuda_evict_test tests/cuda/evict_test.cu" \
            "cuda_paged_compact_test tests/cuda/paged_compact_test.cu" "evict_cuda_bench benchmarks/evict_cuda_bench.cu"; do
  set -- $prog
  build_one "$1" "$2" &
  i=$((i + 1))
  [ $((i % JOBS)) -eq 0 ] && wait
done
wait

{
  echo "commit: $COMMIT"
  echo "built: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(uname -srm), $(( $(date +%s) - T0 ))s"
  echo "nvcc: $("$NVCC" --version 2>/dev/null | grep -m1 release | sed 's/.*release //')"
  echo "host compiler: $(${CXX:-g++} --version 2>/dev/null | head -1)"
  echo "architectures: $(for a in $CUDA_ARCHS; do printf 'sm_%s ' "$a"; done)+ compute_$last PTX"
  echo "flags: ${BASE[*]} ${WERROR[*]}"
  cat "$DIR"/*.note 2>/dev/null
} >"$DIR/BUILD_INFO"
rm -f "$DIR"/*.note
cat "$DIR/BUILD_INFO"
ok=0
for t in cuda_score_test cuda_evict_test cuda_paged_compact_test evict_cuda_bench; do
  if [ -x "$DIR/$t" ]; then
    echo "built $DIR/$t ($(du -h "$DIR/$t" | cut -f1))"
  else
    echo "FAILED: $t (see $DIR/$t.build.log)"
    tail -20 "$DIR/$t.build.log"
    ok=1
  fi
done
if [ -n "${WHEEL_PYTHON:-}" ]; then
  rm -f "$DIR"/depthkv-*.whl
  archs=$(for a in $CUDA_ARCHS; do printf '%s-real;' "$a"; done)
  if CMAKE_BUILD_PARALLEL_LEVEL=$JOBS "$WHEEL_PYTHON" -m pip wheel -q --no-build-isolation --no-deps -w "$DIR" \
       -C "cmake.define.CMAKE_CUDA_ARCHITECTURES=${archs}${last}-virtual" . >"$DIR/wheel.build.log" 2>&1; then
    echo "built $(ls "$DIR"/depthkv-*.whl)"
  else
    echo "FAILED: the depthkv wheel (see $DIR/wheel.build.log)"
    tail -20 "$DIR/wheel.build.log"
    ok=1
  fi
fi
exit $ok
