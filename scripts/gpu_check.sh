#!/usr/bin/env bash
# One prepared check for a GPU machine, within a wall-time budget (default 330 s, sized for one
# H100/H200), that cannot waste the run: every step has its own timeout, the important steps run
# first, and a step that cannot run is reported as SKIPPED with its reason, never as PASS or FAIL.
#
#   scripts/gpu_check.sh --prebuilt DIR [--dry-run] [OUT_DIR]   run the programs built here by
#                                        scripts/build_gpu_binaries.sh (no compiling on the device)
#   scripts/gpu_check.sh [--dry-run] [OUT_DIR]                   fallback: compile on the device first
#   --dry-run: print the plan and its worst-case time, touch no device, run nothing; exit 0 when
#              the plan fits the budget and every program it plans to run is there (with --prebuilt:
#              the four programs in DIR; fallback: the sources scripts/build_gpu_binaries.sh compiles);
#              exit 1 otherwise (ctests run it both ways, and on an empty folder, which must fail).
#
# Steps, in this order (timeout in seconds; each killed step gets 5 s more to exit):
#   0. device info (nvidia-smi; 10)
#   [build, fallback only: scripts/build_gpu_binaries.sh for the local GPU's architecture,
#    BUILD_TIMEOUT per attempt (120), and if -Werror fails one retry without it, which the report
#    names; the 330 s budget then starts after the build]
#   1. cuda_score_test (40)
#   2. cuda_evict_test --seconds EVICT_TEST_SECONDS (55; timeout +40)
#   3. cuda_paged_compact_test --seconds PAGED_TEST_SECONDS (15; timeout +15)
#   4. compute-sanitizer memcheck of cuda_evict_test, directed tests + a few small cases (60)
#   5. evict_cuda_bench, BENCH_RUNS runs (5) per configuration (55)
#   6. compute-sanitizer racecheck of small random cases (45), only if that much time is left
#   7. torch.topk + gather baseline (benchmarks/torch_topk_baseline.py; 60), only if time is left
#   8. the Python package's CUDA path (scripts/gpu_python_check.sh: python/tests/test_cuda.py with the
#      wheel in DIR; 60), only if time is left; SKIPPED without a wheel or torch with CUDA
# A required step gets at most the time left; with under 10 s left it is SKIPPED (time).
# Results: PASS; FAIL (non-zero exit, timeout, missing program; exit 77 "no device" counts as FAIL
# on a machine that has a GPU); SKIPPED (time; compute-sanitizer missing or refusing the device,
# e.g. "Device not supported" on some virtualised machines, or timing out under it with no error
# reported: incomplete; torch missing; 77 where no GPU exists).
#
# Everything goes to OUT_DIR (else $OUT, else ./gpu_check_out): gpu_check.log (all output),
# tests.txt, sanitizer.txt, bench.txt, torch.txt and results.md: one summary (commit, device,
# driver, per-step result and seconds, the benchmark's ratios to the device-to-device copy and to
# torch.topk + gather), ready to paste into benchmarks/RESULTS.md. The commit comes from
# $DEPTHKV_COMMIT, else DIR/COMMIT (written by the prebuilt build), else git, else "unknown": the
# tree copied to a GPU machine may have no .git.
# Exit status: 0 when no step failed.
#
# Environment: BUDGET_S (330), EVICT_TEST_SECONDS (55), PAGED_TEST_SECONDS (15), BENCH_TOKENS (4096,32768,131072),
# BENCH_RUNS (5), BUILD_TIMEOUT (120), BUILD_DIR (build/gpu-local), CUDA_ARCH (fallback build;
# default the GPU's), SKIP_SANITIZER=1, COMPUTE_SANITIZER (path).
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
PREBUILT=""
DRY=0
OUT_ARG=""
while [ $# -gt 0 ]; do
  case $1 in
    --prebuilt) PREBUILT=${2:-}; shift 2 || { echo "gpu_check: --prebuilt needs a folder" >&2; exit 2; } ;;
    --prebuilt=*) PREBUILT=${1#--prebuilt=}; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    -*) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
    *) OUT_ARG=$1; shift ;;
  esac
done
[ -z "$PREBUILT" ] || [ "$DRY" = 1 ] || [ -d "$PREBUILT" ] || { echo "gpu_check: no folder $PREBUILT" >&2; exit 2; }
[ -n "$PREBUILT" ] && [ -d "$PREBUILT" ] && PREBUILT=$(cd "$PREBUILT" && pwd)

BUDGET_S=${BUDGET_S:-330}
EVICT_TEST_SECONDS=${EVICT_TEST_SECONDS:-55}
PAGED_TEST_SECONDS=${PAGED_TEST_SECONDS:-15}
BENCH_TOKENS=${BENCH_TOKENS:-4096,32768,131072}
BENCH_RUNS=${BENCH_RUNS:-5}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-120}
BUILD_DIR=${BUILD_DIR:-build/gpu-local}
KILL_GRACE=5     # seconds a timed-out step gets after SIGTERM
RESERVE=10       # seconds kept for the summary
MIN_STEP=10      # a required step with less time than this is skipped

T_INFO=10
T_SCORE=40
T_EVICT=$((EVICT_TEST_SECONDS + 40))
T_PAGED=$((PAGED_TEST_SECONDS + 15))
T_MEMCHECK=60
T_BENCH=55
T_RACECHECK=45
T_TORCH=60
T_PYTHON=60
BIN=${PREBUILT:-$BUILD_DIR}

# ---- the plan ----------------------------------------------------------------------------------
# name|timeout|required or optional|command (run from the repository root; $BIN, $SAN expanded at run time)
PLAN=(
  "cuda_score_test|$T_SCORE|required|\$BIN/cuda_score_test"
  "cuda_evict_test|$T_EVICT|required|\$BIN/cuda_evict_test --seconds $EVICT_TEST_SECONDS"
  "cuda_paged_compact_test|$T_PAGED|required|\$BIN/cuda_paged_compact_test --seconds $PAGED_TEST_SECONDS"
  "memcheck|$T_MEMCHECK|required|\$SAN --tool memcheck --error-exitcode 3 \$BIN/cuda_evict_test --cases 4 --seconds 5 --budget-mb 4"
  "evict_cuda_bench|$T_BENCH|required|\$BIN/evict_cuda_bench --tokens $BENCH_TOKENS --runs $BENCH_RUNS"
  "racecheck|$T_RACECHECK|optional|\$SAN --tool racecheck --error-exitcode 3 \$BIN/cuda_evict_test --random-only --cases 3 --seconds 3 --budget-mb 2"
  "torch_topk_baseline|$T_TORCH|optional|python3 benchmarks/torch_topk_baseline.py --tokens $BENCH_TOKENS --runs $BENCH_RUNS"
  "python_cuda|$T_PYTHON|optional|scripts/gpu_python_check.sh \$BIN"
)

print_plan() {
  local mode="prebuilt programs in $PREBUILT"
  [ -n "$PREBUILT" ] || mode="fallback: compile on the device into $BUILD_DIR"
  echo "# gpu_check plan ($mode), budget ${BUDGET_S}s"
  local worst=$((T_INFO + KILL_GRACE)) opt=0 i=1
  printf '%-3s %-24s %8s  %-9s %s\n' "#" step timeout kind command
  printf '%-3s %-24s %7ss  %-9s %s\n' 0 device-info "$T_INFO" required "nvidia-smi"
  if [ -z "$PREBUILT" ]; then
    printf '%-3s %-24s %7ss  %-9s %s\n' "-" build "$((2 * BUILD_TIMEOUT))" required \
      "scripts/build_gpu_binaries.sh $BUILD_DIR (local arch; ${BUILD_TIMEOUT}s per attempt, one retry without -Werror; outside the budget)"
  fi
  for entry in "${PLAN[@]}"; do
    IFS='|' read -r name limit kind cmd <<<"$entry"
    printf '%-3s %-24s %7ss  %-9s %s\n' "$i" "$name" "$limit" "$kind" "$cmd"
    if [ "$kind" = required ]; then worst=$((worst + limit + KILL_GRACE)); else opt=$((opt + limit + KILL_GRACE)); fi
    i=$((i + 1))
  done
  worst=$((worst + RESERVE))
  local missing=0
  if [ -n "$PREBUILT" ]; then
    for t in cuda_score_test cuda_evict_test cuda_paged_compact_test evict_cuda_bench; do
      if [ -x "$PREBUILT/$t" ]; then echo "program $t: present"; else echo "program $t: MISSING (its steps would FAIL)"; missing=$((missing + 1)); fi
    done
    [ -f "$PREBUILT/BUILD_INFO" ] && sed 's/^/prebuilt /' "$PREBUILT/BUILD_INFO"
  else
    for f in scripts/build_gpu_binaries.sh tests/cuda/score_test.cu tests/cuda/evict_test.cu \
             tests/cuda/paged_compact_test.cu benchmarks/evict_cuda_bench.cu; do
      if [ -f "$ROOT/$f" ]; then echo "source $f: present"; else echo "source $f: MISSING (the build would FAIL)"; missing=$((missing + 1)); fi
    done
  fi
  echo "required steps: worst case ${worst}s (timeouts + ${KILL_GRACE}s kill grace each + ${RESERVE}s summary);" \
       "optional steps (${opt}s) run only with their full timeout left"
  if [ -z "$PREBUILT" ]; then
    echo "with the on-device build: worst case $((worst + 2 * BUILD_TIMEOUT + KILL_GRACE))s in all (build outside the ${BUDGET_S}s budget)"
  fi
  local fits=1
  if [ "$worst" -le "$BUDGET_S" ]; then
    echo "plan: worst case ${worst}s of required steps within the ${BUDGET_S}s budget"
  else
    echo "plan: worst case ${worst}s of required steps EXCEEDS the ${BUDGET_S}s budget"
    fits=0
  fi
  if [ "$missing" -gt 0 ]; then
    echo "plan: FAILS: $missing program(s) or source(s) it plans to run are missing"
    return 1
  fi
  [ "$fits" = 1 ]
}

if [ "$DRY" = 1 ]; then
  print_plan
  exit $?
fi

# ---- the run -----------------------------------------------------------------------------------
OUT_DIR=${OUT_ARG:-${OUT:-$ROOT/gpu_check_out}}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
LOG=$OUT_DIR/gpu_check.log
: >"$LOG"
START=$(date +%s)
DEADLINE=$((START + BUDGET_S))
S_NAMES=() S_RESULT=() S_SECS=() S_NOTE=()
log() { echo "$*" | tee -a "$LOG"; }
elapsed() { echo $(( $(date +%s) - START )); }
record() {  # record NAME RESULT SECONDS NOTE
  S_NAMES+=("$1"); S_RESULT+=("$2"); S_SECS+=("$3"); S_NOTE+=("$4")
  log "=== [$1] $2 (${3}s)${4:+: $4}"
}

print_plan | tee -a "$LOG"
if [ -n "${DEPTHKV_COMMIT:-}" ]; then
  COMMIT=$DEPTHKV_COMMIT
elif [ -n "$PREBUILT" ] && [ -s "$PREBUILT/COMMIT" ]; then
  COMMIT="$(head -1 "$PREBUILT/COMMIT") (from $PREBUILT/COMMIT)"
elif git rev-parse --short HEAD >/dev/null 2>&1; then
  COMMIT="$(git rev-parse --short HEAD)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
else
  COMMIT=unknown
fi
log "# depthkv GPU check"
log "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
log "commit: $COMMIT"
log "host: $(uname -srm), $(nproc) CPUs"

# 0. device info; whether this machine has a GPU (then exit 77 "no device" is a failure)
t0=$(date +%s)
timeout -k "$KILL_GRACE" "$T_INFO" nvidia-smi >>"$LOG" 2>&1
GPU_CSV=$(timeout -k "$KILL_GRACE" "$T_INFO" nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
            --format=csv,noheader 2>/dev/null | head -1)
ON_DEVICE=0
if [ -n "$GPU_CSV" ] || ls /dev/nvidia[0-9]* >/dev/null 2>&1; then ON_DEVICE=1; fi
log "gpu: ${GPU_CSV:-none found}"
if [ "$ON_DEVICE" = 1 ]; then
  record device-info PASS $(( $(date +%s) - t0 )) "GPU present: exit 77 counts as FAIL"
else
  record device-info SKIPPED $(( $(date +%s) - t0 )) "no GPU found (nvidia-smi, /dev/nvidia*): exit 77 counts as SKIPPED"
fi

# fallback build on the device (outside the budget: the deadline moves by its duration)
if [ -z "$PREBUILT" ]; then
  t0=$(date +%s)
  ARCH=${CUDA_ARCH:-$(echo "$GPU_CSV" | awk -F', ' '{print $4}' | tr -d ' .')}
  [ -n "$ARCH" ] || ARCH=90
  log "=== [build] scripts/build_gpu_binaries.sh $BUILD_DIR for sm_$ARCH (timeout ${BUILD_TIMEOUT}s per attempt)"
  CUDA_ARCHS=$ARCH RETRY_NO_WERROR=1 BUILD_TIMEOUT=$BUILD_TIMEOUT JOBS=3 \
    scripts/build_gpu_binaries.sh "$BUILD_DIR" >>"$LOG" 2>&1
  brc=$?
  note=$(grep -E '^(cuda_|evict_)' "$BUILD_DIR/BUILD_INFO" 2>/dev/null | tr '\n' ';')
  if [ $brc -eq 0 ]; then
    if grep -q "WITHOUT -Werror" "$BUILD_DIR/BUILD_INFO"; then
      record build PASS $(( $(date +%s) - t0 )) "built WITHOUT -Werror after a -Werror failure: $note"
    else
      record build PASS $(( $(date +%s) - t0 )) "$note"
    fi
  else
    record build FAIL $(( $(date +%s) - t0 )) "$note"
  fi
  DEADLINE=$((DEADLINE + $(date +%s) - t0))
fi
BIN=$(cd "$BIN" 2>/dev/null && pwd || echo "$BIN")

SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || true)}
for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [ -n "$SAN" ] || { [ -x "$c" ] && SAN=$c; }
done

TESTS=$OUT_DIR/tests.txt BENCH=$OUT_DIR/bench.txt TORCH=$OUT_DIR/torch.txt SANOUT=$OUT_DIR/sanitizer.txt
: >"$TESTS"; : >"$BENCH"; : >"$TORCH"; : >"$SANOUT"

run_step() {  # run_step NAME LIMIT KIND OUTFILE CMD...
  local name=$1 limit=$2 kind=$3 out=$4
  shift 4
  local left=$(( DEADLINE - $(date +%s) - RESERVE ))
  if [ "$kind" = optional ] && [ "$left" -lt $((limit + KILL_GRACE)) ]; then
    record "$name" SKIPPED 0 "time: ${left}s left, the step needs up to $((limit + KILL_GRACE))s"
    return
  fi
  [ "$left" -lt $((limit + KILL_GRACE)) ] && limit=$((left - KILL_GRACE))
  if [ "$limit" -lt "$MIN_STEP" ]; then
    record "$name" SKIPPED 0 "time: ${left}s left of the ${BUDGET_S}s budget"
    return
  fi
  log "=== [$name] $* (timeout ${limit}s, at $(elapsed)s)"
  local t0
  t0=$(date +%s)
  timeout -k "$KILL_GRACE" "$limit" "$@" >"$out.tmp" 2>&1
  local rc=$? dt=$(( $(date +%s) - t0 ))
  cat "$out.tmp" >>"$LOG"
  { echo "=== [$name] $*"; cat "$out.tmp"; echo "=== [$name] exit $rc after ${dt}s"; } >>"$out"
  local tail_line
  tail_line=$(grep -E '^(PASS|FAIL|SKIP)' "$out.tmp" | tail -1)
  case $name in
    memcheck|racecheck)
      if grep -qiE 'device not supported|not supported on this (device|platform)|no supported device|unsupported (gpu|device)' "$out.tmp"; then
        rm -f "$out.tmp"
        record "$name" SKIPPED "$dt" "compute-sanitizer refused the device: $(grep -m1 -iE 'not supported|unsupported' "$out" | sed 's/^=* *//')"
        return
      fi
      if { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && ! grep -qE '^=+ +(Invalid|Error|.*[Rr]ace|.*[Hh]azard)' "$out.tmp" &&
         ! grep -q '^MISMATCH' "$out.tmp"; then
        rm -f "$out.tmp"
        record "$name" SKIPPED "$dt" "incomplete: timed out after ${limit}s under compute-sanitizer, no error reported before"
        return
      fi ;;
    torch_topk_baseline|python_cuda)
      if grep -q '^SKIP' "$out.tmp" && { [ $rc -eq 0 ] || [ $rc -eq 77 ]; }; then
        record "$name" SKIPPED "$dt" "$(grep -m1 '^SKIP' "$out.tmp")"
        rm -f "$out.tmp"
        return
      fi ;;
  esac
  rm -f "$out.tmp"
  case $rc in
    0) record "$name" PASS "$dt" "$tail_line" ;;
    77) if [ "$ON_DEVICE" = 1 ]; then
          record "$name" FAIL "$dt" "exit 77 (no device) on a machine with a GPU: $tail_line"
        else
          record "$name" SKIPPED "$dt" "no CUDA device: $tail_line"
        fi ;;
    124|137) record "$name" FAIL "$dt" "timed out after ${limit}s" ;;
    *) record "$name" FAIL "$dt" "exit $rc${tail_line:+: $tail_line}" ;;
  esac
}

for entry in "${PLAN[@]}"; do
  IFS='|' read -r name limit kind cmd <<<"$entry"
  out=$TESTS
  case $name in
    memcheck|racecheck) out=$SANOUT ;;
    evict_cuda_bench) out=$BENCH ;;
    torch_topk_baseline|python_cuda) out=$TORCH ;;
  esac
  case $name in
    memcheck|racecheck)
      if [ "${SKIP_SANITIZER:-0}" = 1 ]; then record "$name" SKIPPED 0 "SKIP_SANITIZER=1"; continue; fi
      if [ -z "$SAN" ]; then record "$name" SKIPPED 0 "compute-sanitizer not installed"; continue; fi ;;
  esac
  if [ "$name" != torch_topk_baseline ] && [ "$name" != python_cuda ]; then
    prog=$(echo "$cmd" | grep -oE '\$BIN/[a-z_]+' | head -1 | sed 's/\$BIN\///')
    if [ ! -x "$BIN/$prog" ]; then record "$name" FAIL 0 "program $BIN/$prog missing"; continue; fi
  fi
  eval "set -- $cmd"
  run_step "$name" "$limit" "$kind" "$out" "$@"
done

# ---- summary -----------------------------------------------------------------------------------
FAILED=0
for r in "${S_RESULT[@]}"; do [ "$r" = FAIL ] && FAILED=$((FAILED + 1)); done
{
  echo "## GPU check $(date -u '+%Y-%m-%d') (scripts/gpu_check.sh${PREBUILT:+ --prebuilt})"
  echo
  echo '```'
  echo "commit: $COMMIT"
  echo "gpu: ${GPU_CSV:-none found} (name, driver, memory, compute capability)"
  if [ -f "$BIN/BUILD_INFO" ]; then sed 's/^/build: /' "$BIN/BUILD_INFO"; fi
  echo '```'
  echo
  echo "| step | result | seconds | note |"
  echo "|---|---|---|---|"
  for i in "${!S_NAMES[@]}"; do
    echo "| ${S_NAMES[$i]} | ${S_RESULT[$i]} | ${S_SECS[$i]} | $(echo "${S_NOTE[$i]}" | tr '|' '/') |"
  done
  echo
  if grep -qE '^(MISMATCH|  rerun:)' "$TESTS" "$SANOUT" 2>/dev/null; then
    echo "Failures (first lines) and how to rerun a failing random case alone:"
    echo
    echo '```'
    grep -hE '^MISMATCH' "$TESTS" "$SANOUT" 2>/dev/null | head -10
    grep -hE '^  rerun:' "$TESTS" "$SANOUT" 2>/dev/null | sort -u | head -10
    echo '```'
    echo
  fi
  if grep -q '^depthkv' "$BENCH" 2>/dev/null; then
    echo "Benchmark (evict_cuda_bench; frac_copy = effective bandwidth / measured D2D copy bandwidth;"
    echo "torch = torch.topk + gather on the same shapes, x_torch = torch time / depthkv time):"
    echo
    echo '```'
    grep -hE '^(# evict_cuda_bench|copy:)' "$BENCH"
    grep -hE '^copy:' "$TORCH" 2>/dev/null | sed 's/^/torch /'
    awk 'FILENAME == ARGV[1] { if ($1 == "torch") t[$2 " " $3 " " $4 " " $5] = $6; next }
         $1 == "depthkv" {
           if (!hdr) { printf "%-15s %7s %5s %-7s %10s %9s %10s %8s  %s\n", "mode", "tokens", "keep", "k", "depthkv_ms", "frac_copy", "torch_ms", "x_torch", "path"; hdr = 1 }
           key = $2 " " $3 " " $4 " " $5
           tm = (key in t) ? sprintf("%10.4f", t[key]) : sprintf("%10s", "-")
           x = (key in t && $6 > 0) ? sprintf("%8.2f", t[key] / $6) : sprintf("%8s", "-")
           printf "%-15s %7s %5s %-7s %10.4f %9.3f %s %s  %s\n", $2, $3, $4, $5, $6, $9, tm, x, $11 }' \
        "$TORCH" "$BENCH"
    echo '```'
    echo
  fi
  echo "failed steps: $FAILED; total $(elapsed)s of the ${BUDGET_S}s budget${PREBUILT:+ (prebuilt programs)}"
} >"$OUT_DIR/results.md"
tee -a "$LOG" <"$OUT_DIR/results.md"
[ "$FAILED" -eq 0 ]
