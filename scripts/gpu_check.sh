#!/usr/bin/env bash
# One prepared check for a GPU machine (designed to finish in under 8 minutes on one H100/H200):
#   1. records the date, GPU, driver and toolkit (nvidia-smi, nvcc);
#   2. builds the CUDA targets warnings-as-errors for the local GPU's architecture: through CMake
#      (-DDEPTHKV_ENABLE_CUDA=ON -DDEPTHKV_WERROR=ON, CUDA targets + the CPU host-logic test) when
#      its dependencies (Eigen3, Catch2) are there, else directly with nvcc (the CUDA tests and the
#      benchmark need neither);
#   3. runs the CUDA tests (cuda_score_test, cuda_evict_test) and the CPU host-logic test;
#   4. runs the CUDA eviction benchmark and, if `python3 -c "import torch"` works, the
#      torch.topk + gather baseline on the same shapes;
#   5. if time is left, runs compute-sanitizer (memcheck, racecheck) on small eviction cases.
# Everything goes to OUT_DIR (first argument, else $OUT, else ./gpu_check_out): gpu_check.log (all
# output), tests.txt, bench.txt, torch.txt, sanitizer.txt and results.md (a summary to paste into
# benchmarks/RESULTS.md). Exit status: 0 when every test that ran passed.
#
# Environment: CUDA_ARCH (e.g. 90; default: the GPU's compute capability), BUILD_DIR (default
# build/gpu), JOBS (default nproc), EVICT_TEST_SECONDS (default 90), BENCH_TOKENS (default
# 4096,32768,131072), BENCH_RUNS (default 15), SKIP_SANITIZER=1.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT_DIR=${1:-${OUT:-$ROOT/gpu_check_out}}
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/gpu_check.log
: >"$LOG"
START=$(date +%s)
BUILD_DIR=${BUILD_DIR:-build/gpu}
JOBS=${JOBS:-$(nproc)}
EVICT_TEST_SECONDS=${EVICT_TEST_SECONDS:-90}
BENCH_TOKENS=${BENCH_TOKENS:-4096,32768,131072}
BENCH_RUNS=${BENCH_RUNS:-15}
FAILED=""

log() { echo "$*" | tee -a "$LOG"; }
elapsed() { echo $(( $(date +%s) - START )); }
run_step() {  # run_step NAME TIMEOUT OUTFILE CMD...: runs with a timeout, appends to OUTFILE and the log
  local name=$1 limit=$2 out=$3
  shift 3
  log "=== [$name] $* (timeout ${limit}s, at $(elapsed)s)"
  timeout --signal=KILL "$limit" "$@" >>"$out.tmp" 2>&1
  local rc=$?
  cat "$out.tmp" >>"$LOG"
  cat "$out.tmp" >>"$out"
  rm -f "$out.tmp"
  log "=== [$name] exit $rc after $(elapsed)s"
  case $rc in
    0) ;;
    77) log "=== [$name] SKIPPED" ;;
    *) FAILED="$FAILED $name(rc=$rc)" ;;
  esac
  return $rc
}

{
  echo "# depthkv GPU check"
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "host: $(uname -srm), $(nproc) CPUs"
} | tee -a "$LOG"
nvidia-smi 2>&1 | tee -a "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,compute_cap --format=csv 2>&1 | tee -a "$LOG"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
"$NVCC" --version 2>&1 | tail -2 | tee -a "$LOG"
if [ -z "${CUDA_ARCH:-}" ]; then
  CUDA_ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [ -n "$CUDA_ARCH" ] || CUDA_ARCH=90
fi
log "CUDA_ARCH=$CUDA_ARCH BUILD_DIR=$BUILD_DIR JOBS=$JOBS"

# ---- build ----
BIN=""
GEN=""
command -v ninja >/dev/null 2>&1 && GEN="-G Ninja"
if cmake -S . -B "$BUILD_DIR" $GEN -DCMAKE_BUILD_TYPE=Release -DDEPTHKV_ENABLE_CUDA=ON -DDEPTHKV_WERROR=ON \
     -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" -DDEPTHKV_BUILD_TOOLS=OFF -DDEPTHKV_BUILD_EXAMPLES=OFF \
     -DCMAKE_CUDA_COMPILER="$NVCC" >>"$LOG" 2>&1; then
  log "=== cmake configured; building CUDA targets (at $(elapsed)s)"
  if cmake --build "$BUILD_DIR" -j "$JOBS" --target cuda_evict_test cuda_score_test evict_cuda_bench \
       detail_cuda_host_logic_test >>"$LOG" 2>&1; then
    BIN=$BUILD_DIR
  else
    log "=== cmake build FAILED (see the log); trying nvcc directly"
    FAILED="$FAILED cmake-build"
  fi
else
  log "=== cmake configure failed (Eigen3/Catch2 missing?); building with nvcc directly"
fi
if [ -z "$BIN" ]; then
  BIN=$BUILD_DIR/direct
  mkdir -p "$BIN"
  FLAGS=(-std=c++17 -O3 -DNDEBUG "-gencode=arch=compute_$CUDA_ARCH,code=sm_$CUDA_ARCH" -Werror=all-warnings
         -Xcompiler=-Wall,-Wextra,-Werror -Iinclude)
  [ -d /usr/include/eigen3 ] && FLAGS+=(-isystem /usr/include/eigen3)
  build_one() {  # build_one SRC OUT: with the CPU evictor if it compiles here, else without
    "$NVCC" "${FLAGS[@]}" "$1" -o "$2" >>"$2.log" 2>&1 ||
      { echo "(retrying $1 without the CPU evictor)" >>"$2.log";
        "$NVCC" "${FLAGS[@]}" -DDEPTHKV_TEST_NO_CPU_EVICTOR "$1" -o "$2" >>"$2.log" 2>&1; }
  }
  build_one tests/cuda/evict_test.cu "$BIN/cuda_evict_test" &
  build_one tests/cuda/score_test.cu "$BIN/cuda_score_test" &
  build_one benchmarks/evict_cuda_bench.cu "$BIN/evict_cuda_bench" &
  wait
  cat "$BIN"/*.log >>"$LOG" 2>/dev/null
  for t in cuda_evict_test cuda_score_test evict_cuda_bench; do
    [ -x "$BIN/$t" ] || { log "=== build of $t FAILED"; FAILED="$FAILED build-$t"; }
  done
fi
log "=== build done at $(elapsed)s"
find_bin() { for d in "$BIN" "$BIN/tests" "$BIN/benchmarks"; do [ -x "$d/$1" ] && { echo "$d/$1"; return; }; done; }

# ---- tests ----
TESTS=$OUT_DIR/tests.txt
: >"$TESTS"
T=$(find_bin detail_cuda_host_logic_test); [ -n "$T" ] && run_step host-logic-test 120 "$TESTS" "$T"
T=$(find_bin cuda_score_test); [ -n "$T" ] && run_step cuda_score_test 120 "$TESTS" "$T"
T=$(find_bin cuda_evict_test); [ -n "$T" ] && run_step cuda_evict_test $((EVICT_TEST_SECONDS + 90)) "$TESTS" "$T" --seconds "$EVICT_TEST_SECONDS"

# ---- benchmarks ----
BENCH=$OUT_DIR/bench.txt
: >"$BENCH"
T=$(find_bin evict_cuda_bench); [ -n "$T" ] && run_step evict_cuda_bench 150 "$BENCH" "$T" --tokens "$BENCH_TOKENS" --runs "$BENCH_RUNS"
TORCH=$OUT_DIR/torch.txt
: >"$TORCH"
if python3 -c "import torch" >/dev/null 2>&1; then
  if [ "$(elapsed)" -lt 330 ]; then
    run_step torch_topk_baseline 120 "$TORCH" python3 benchmarks/torch_topk_baseline.py --tokens "$BENCH_TOKENS" --runs "$BENCH_RUNS"
  else
    log "=== torch baseline skipped: $(elapsed)s used"
  fi
else
  log "=== torch not importable: baseline skipped"
fi

# ---- sanitizers on small cases, if time is left ----
SAN=$OUT_DIR/sanitizer.txt
: >"$SAN"
T=$(find_bin cuda_evict_test)
if [ "${SKIP_SANITIZER:-0}" != "1" ] && [ -n "$T" ] && command -v compute-sanitizer >/dev/null 2>&1; then
  for tool in memcheck racecheck; do
    if [ "$(elapsed)" -lt 400 ]; then
      run_step "sanitizer-$tool" 45 "$SAN" compute-sanitizer --tool "$tool" --error-exitcode 3 \
        "$T" --cases 6 --seconds 10 --budget-mb 4
    fi
  done
fi

# ---- summary ----
{
  echo "## GPU check $(date -u '+%Y-%m-%d')"
  echo
  echo '```'
  grep -E "^(date|commit):" "$LOG" | head -2
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
  "$NVCC" --version 2>/dev/null | grep -m1 release | sed "s/^/nvcc: /"
  grep -hE "^(PASS|FAIL|SKIP)" "$TESTS" 2>/dev/null
  echo '```'
  echo
  echo '```'
  grep -hE "^(#|copy:|impl|depthkv)" "$BENCH" 2>/dev/null
  grep -hE "^(#|copy:|torch)" "$TORCH" 2>/dev/null
  echo '```'
  echo
  echo "failed steps: ${FAILED:-none}; total $(elapsed)s"
} >"$OUT_DIR/results.md"
cat "$OUT_DIR/results.md" | tee -a "$LOG"
[ -z "$FAILED" ]
