#!/usr/bin/env bash
# Decode beside a busy process (issue 44, item 3): depthkv's gguf_engine_bench against llama.cpp's
# llama-bench (the pinned build of scripts/get-llama-cpp.sh, --repack 0) on the real models, 32
# tokens decoded after a 512-token prompt (llama-bench -p 0 -n 32 -d 512), F16 KV cache, 1 and 2
# threads, first alone, then beside one busy process: a shell loop pinned to the last core
# (taskset), started before and stopped after each configuration. No environment variable is set.
# Statistic, both sides: the mean of REPEAT runs' tok/s after one warm-up run. BASE (optional): a
# second gguf_engine_bench (e.g. an older commit's build) run the same way, one after the other
# with the first. JSON per run into OUT, then the table (benchmarks/parity_table.py --busy).
# Usage: benchmarks/busy_decode.sh BUILD [OUT]   (BUILD: a Release build with benchmarks)
#   THREADS (default "1 2"), REPEAT (default 3), MODELS (default both), BASE.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$1
OUT=${2:-benchmarks/results/busy_decode}
LLAMA=$(scripts/get-llama-cpp.sh | tail -1)
scripts/get-models.sh > /dev/null
DIR=${DEPTHKV_MODEL_DIR:-$HOME/.cache/depthkv/models}
R=${REPEAT:-3}
LAST=$(($(nproc) - 1))
mkdir -p "$OUT"
HOG=
stop_hog() { if [[ -n $HOG ]]; then kill "$HOG" 2> /dev/null || true; wait "$HOG" 2> /dev/null || true; HOG=; fi; }
trap stop_hog EXIT INT TERM
for busy in 0 1; do
  for model in ${MODELS:-SmolLM2-135M-Instruct.Q4_1 gemma-3-270m-q4_k_m}; do
    f="$DIR/$model.gguf"
    for t in ${THREADS:-1 2}; do
      stem="$model-t$t-busy$busy"
      echo "busy_decode: $model threads $t busy $busy" >&2
      if [[ $busy == 1 ]]; then taskset -c "$LAST" sh -c 'while :; do :; done' & HOG=$!; fi
      "$BUILD/benchmarks/gguf_engine_bench" "$f" --prompt 512 --decode 32 --threads "$t" --repeat $((R + 1)) \
        --kv-type f16 --json "$OUT/depthkv-$stem.json" > /dev/null
      if [[ -n ${BASE:-} ]]; then
        "$BASE" "$f" --prompt 512 --decode 32 --threads "$t" --repeat $((R + 1)) --kv-type f16 \
          --json "$OUT/base-$stem.json" > /dev/null
      fi
      "$LLAMA/llama-bench" -m "$f" -p 0 -n 32 -d 512 -t "$t" -r "$R" --repack 0 -o json \
        > "$OUT/llamacpp-$stem.json" 2> "$OUT/llamacpp-$stem.log" ||
        { echo "busy_decode: llama-bench failed ($stem): see the .log" >&2; rm -f "$OUT/llamacpp-$stem.json"; }
      stop_hog
    done
  done
done
python3 benchmarks/parity_table.py --busy "$OUT"
