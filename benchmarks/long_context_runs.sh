#!/usr/bin/env bash
# Every long-context figure of benchmarks/RESULTS.md ("Long contexts on a quiet machine"), in one
# run, 2 threads, F16 KV (the engine's default), chunked schedule (chunk 1024, interval 32, sinks 4 +
# recent 16, SnapKV, uniform budgets), JSON per run into $OUT:
#  A. TinyLlama-1.1B shape, Q4_K_M file (benchmarks/llamacpp_check/run.py writes it: random weights,
#     the real vocabulary): llama.cpp's full cache (its llama-bench program, repacking off, the
#     context filled by a real prefill) and depthkv full / keep 0.2 / keep 0.1 (synthetic prefill),
#     contexts 2K-32K, 32 decoded tokens;
#  B. the work-bound target: Qwen2.5-0.5B (Q8_0, Q4_K_M) and TinyLlama-1.1B (Q8_0; its Q4_K_M is A's)
#     shapes built in memory, 16K and 32K, full and keep 0.1 (synthetic prefill), 32 decoded tokens; and keep 0.1 at 32K with
#     the preset's scorer (output-aware SnapKV) for its scoring cost;
#  C. the prefill target: Qwen2.5-0.5B shape, Q8_0, a real 16K prefill, full and keep 0.1;
#  D. parity: TinyLlama-1.1B shape in F16, Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q4_0, prefill 512 and decode 32,
#     1 and 2 threads, depthkv's gguf_engine_bench and llama.cpp's llama-bench (repacking off and on);
#  E. OpenMP's wait policy: Q4_K_M, 2 threads, prompt 128 + 32 decoded, with and without one busy
#     process beside: depthkv with OMP_WAIT_POLICY unset and passive, llama.cpp (repacking off).
# Usage: benchmarks/long_context_runs.sh BUILD LLAMA_BIN_DIR GGUF_PYTHON [A|B|C|D|E ...]
#   BUILD: a Release build with benchmarks; LLAMA_BIN_DIR: llama.cpp's build/bin (llama-bench,
#   llama-quantize); GGUF_PYTHON: a Python with numpy and gguf. For D: PARITY_THREADS (default "1 2"),
#   PARITY_TYPES (default all six), PARITY_PROMPT (default 512; other lengths add -pN to the file
#   names), PARITY_REPEAT (default 2), PARITY_REPACK (llama.cpp's --repack values, default "0,1"),
#   PARITY_LLAMA_ARGS (more llama-bench arguments, e.g. --no-warmup).
#   OUT (default benchmarks/results/long_context/quiet), GGUF_DIR (default /tmp/depthkv-long-context).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$1 LLAMA=$2 PY=$3
shift 3
SETS=${*:-A B C D E}
OUT=${OUT:-benchmarks/results/long_context/quiet}
GGUF_DIR=${GGUF_DIR:-/tmp/depthkv-long-context}
LC="$BUILD/benchmarks/long_context_bench"
mkdir -p "$OUT" "$GGUF_DIR"
echo "long_context_runs: $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg), sets $SETS" | tee -a "$OUT/runs.log"
for set in $SETS; do
  case $set in
    A)
      "$PY" benchmarks/llamacpp_check/run.py --contexts 2048,4096,8192,16384,32768 --shapes tinyllama-1.1b \
        --types Q4_K_M --llama-bench "$LLAMA" --lc-bench "$LC" --lc-keeps 1,0.2,0.1 --decode 32 --threads 2 \
        --tmp "$GGUF_DIR" --lc-out "$OUT" 2>&1 | tee -a "$OUT/runs.log" ;;
    B)
      for st in qwen2.5-0.5b:Q8_0 qwen2.5-0.5b:Q4_K_M tinyllama-1.1b:Q8_0; do for ctx in 16384 32768; do
        shape=${st%%:*} type=${st##*:}
        for keep in 1 0.1; do
          "$LC" --shape $shape --type $type --context $ctx --decode 32 --threads 2 --keep $keep --prefill synthetic \
            --scorer snapkv --json "$OUT/bound-$shape-$type-keep$keep-$ctx.json" 2>&1 | tee -a "$OUT/runs.log"
        done
      done; done
      # the preset's scorer (output-aware SnapKV): its scoring cost at interval 32
      "$LC" --shape qwen2.5-0.5b --type Q8_0 --context 32768 --decode 32 --threads 2 --keep 0.1 --prefill synthetic \
        --scorer preset --json "$OUT/bound-qwen2.5-0.5b-Q8_0-keep0.1-preset-32768.json" 2>&1 | tee -a "$OUT/runs.log" ;;
    C)
      for keep in 1 0.1; do
        "$LC" --shape qwen2.5-0.5b --type Q8_0 --context 16384 --decode 8 --threads 2 --keep $keep --prefill real \
          --scorer snapkv --max-seconds 1500 --json "$OUT/prefill-qwen2.5-0.5b-Q8_0-keep$keep-16384.json" 2>&1 | tee -a "$OUT/runs.log"
      done ;;
    D)
      # parity: the TinyLlama-1.1B shape's file in 6 types (A's F16 file, quantized by llama-quantize),
      # prefill 512 and decode 32 at 1 and 2 threads; llama.cpp with repacking off and on
      P=${PARITY_PROMPT:-512}
      sfx=$([[ $P == 512 ]] || echo "-p$P")
      for type in ${PARITY_TYPES:-F16 Q8_0 Q6_K Q5_K_M Q4_K_M Q4_0}; do
        f="$GGUF_DIR/tinyllama-1.1b-$type.gguf"
        [[ -f $f ]] || "$LLAMA/llama-quantize" "$GGUF_DIR/tinyllama-1.1b-F16.gguf" "$f" $type 2 > /dev/null
        for t in ${PARITY_THREADS:-1 2}; do
          "$BUILD/benchmarks/gguf_engine_bench" "$f" --prompt $P --decode 32 --threads $t --repeat ${PARITY_REPEAT:-2} \
            --json "$OUT/parity-depthkv-$type-t$t$sfx.json" 2>&1 | tee -a "$OUT/runs.log"
          "$LLAMA/llama-bench" -m "$f" -p $P -n 32 -t $t -r ${PARITY_REPEAT:-2} --repack ${PARITY_REPACK:-0,1} ${PARITY_LLAMA_ARGS:-} -o json \
            > "$OUT/parity-llamacpp-$type-t$t$sfx.json"
        done
      done ;;
    E)
      # OpenMP's wait policy, on the quiet machine and beside one busy process (a CPU hog on one of
      # the two cores): Q4_K_M, 2 threads, depthkv with the default policy and with passive waiting
      f="$GGUF_DIR/tinyllama-1.1b-Q4_K_M.gguf"
      for hog in none one; do
        pid=
        if [[ $hog == one ]]; then (while :; do :; done) & pid=$!; fi
        for pol in default passive; do
          env $([[ $pol == passive ]] && echo OMP_WAIT_POLICY=passive) "$BUILD/benchmarks/gguf_engine_bench" "$f" \
            --prompt 128 --decode 32 --threads 2 --repeat 2 --json "$OUT/wait-depthkv-$pol-hog$hog.json" > /dev/null
        done
        "$LLAMA/llama-bench" -m "$f" -p 128 -n 32 -t 2 -r 2 --repack 0 -o json > "$OUT/wait-llamacpp-hog$hog.json"
        if [[ -n $pid ]]; then kill $pid; fi
      done ;;
    *) echo "unknown set $set" >&2; exit 2 ;;
  esac
done
echo "long_context_runs: done $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/runs.log"
