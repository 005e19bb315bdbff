#!/usr/bin/env bash
# Long contexts on the real models with real prefills (issue 44, item 5): SmolLM2-135M-Instruct Q4_1
# at 2K-8K (its context) and Gemma 3 270M Q4_K_M at 2K-32K, 2 threads, F16 KV on both sides, the
# context's tokens spread over the vocabulary (each engine's own benchmark input), 32 decoded tokens:
#  - depthkv: benchmarks/long_context_bench --prefill real, full cache, keep 0.2 and keep 0.1 (chunked
#    schedule: chunk 1024, interval 32, sinks 4 + recent 16, SnapKV, uniform budgets; Gemma 3's
#    sliding-window layers capped at their window by the driver); prefill tok/s, decode tok/s at the
#    end of the context (mean over the 32 steps), peak RSS (VmHWM), KV bytes at the peak and at the end;
#  - llama.cpp (scripts/get-llama-cpp.sh's build, llama-bench, repacking off, one run after its
#    warm-up): prefill tok/s of the context from an empty cache (-p C -n 0), and decode tok/s of 32
#    tokens after a real prefill of the context (-p 0 -n 32 -d C, the prefill not timed), that run's
#    peak RSS (GNU time) and its KV bytes (the "llama_kv_cache: size = ... MiB" lines llama.cpp logs
#    with -v, summed: Gemma 3's sliding-window cache is one of them).
# One run per process and figure, one after the other. JSON per run into OUT; then
# benchmarks/real_long_context_table.py OUT prints the table.
# Usage: benchmarks/real_long_context.sh BUILD LLAMA_BIN_DIR [OUT]
#   BUILD: a Release build with benchmarks; LLAMA_BIN_DIR: llama.cpp's build/bin (llama-bench);
#   OUT: default benchmarks/results/long_context/real. Models from DEPTHKV_MODEL_DIR (default
#   ~/.cache/depthkv/models, scripts/get-models.sh). CONTEXTS_SMOL / CONTEXTS_GEMMA override the contexts.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$1 LLAMA=$2
OUT=${3:-benchmarks/results/long_context/real}
MODELS=${DEPTHKV_MODEL_DIR:-$HOME/.cache/depthkv/models}
LC="$BUILD/benchmarks/long_context_bench"
mkdir -p "$OUT"
echo "real_long_context: $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)" |
  tee -a "$OUT/runs.log"
run_model() {  # name file contexts...
  local name=$1 file=$2
  shift 2
  for ctx in "$@"; do
    for keep in 1 0.2 0.1; do
      "$LC" --model "$file" --context "$ctx" --decode 32 --threads 2 --keep "$keep" --prefill real --scorer snapkv \
        --json "$OUT/depthkv-$name-keep$keep-$ctx.json" 2>&1 | tee -a "$OUT/runs.log"
    done
    "$LLAMA/llama-bench" -m "$file" -p "$ctx" -n 0 -t 2 -r 1 --repack 0 -o json > "$OUT/llamacpp-$name-prefill-$ctx.json"
    /usr/bin/time -f "MAXRSS_KB %M" "$LLAMA/llama-bench" -m "$file" -p 0 -n 32 -d "$ctx" -t 2 -r 1 --repack 0 -o json -v \
      > "$OUT/llamacpp-$name-decode-$ctx.json" 2> "$OUT/llamacpp-$name-decode-$ctx.full.log"
    # kept: the context's settings, the KV cache lines and the peak RSS (the rest is per-tensor loading)
    grep -E "llama_context:|llama_kv_cache|system_info|MAXRSS_KB" "$OUT/llamacpp-$name-decode-$ctx.full.log" \
      > "$OUT/llamacpp-$name-decode-$ctx.log"
    rm "$OUT/llamacpp-$name-decode-$ctx.full.log"
    echo "llama.cpp $name $ctx: $(grep -o 'MAXRSS_KB [0-9]*' "$OUT/llamacpp-$name-decode-$ctx.log")" | tee -a "$OUT/runs.log"
  done
}
run_model smollm2 "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" ${CONTEXTS_SMOL:-2048 4096 8192}
run_model gemma3 "$MODELS/gemma-3-270m-q4_k_m.gguf" ${CONTEXTS_GEMMA:-2048 4096 8192 16384 32768}
echo "real_long_context: done $(date -u +%FT%TZ)" | tee -a "$OUT/runs.log"
