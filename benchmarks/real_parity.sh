#!/usr/bin/env bash
# Speed parity on the real models (SmolLM2-135M-Instruct Q4_1 and Gemma 3 270M Q4_K_M, from
# scripts/get-models.sh): depthkv's gguf_engine_bench against llama.cpp's llama-bench (the pinned
# build of scripts/get-llama-cpp.sh), on the same file, threads and F16 KV cache:
#   prefill: a prompt of P tokens from an empty cache (llama-bench -p P -n 0; depthkv --prompt P,
#            one chunk of up to 1024 tokens at a time; llama.cpp its default batch 2048 / ubatch 512);
#   decode:  32 tokens after P tokens of context (llama-bench -p 0 -n 32 -d P; depthkv --decode 32
#            after its prompt).
# Statistic, both sides: the mean of REPEAT runs' tok/s after one warm-up run (llama-bench's avg_ts;
# depthkv runs REPEAT + 1 times and drops its first). llama.cpp with weight repacking off and on
# (--repack 0 / 1); a setting that fails is reported as missing. JSON per run into OUT, then the
# table (benchmarks/parity_table.py --real).
# Usage: benchmarks/real_parity.sh BUILD [OUT]   (BUILD: a Release build with benchmarks)
#   PROMPTS (default "512 4096"), THREADS (default "1 2"), REPEAT (default 3), MODELS (default both).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$1
OUT=${2:-benchmarks/results/real_parity}
LLAMA=$(scripts/get-llama-cpp.sh | tail -1)
scripts/get-models.sh > /dev/null
DIR=${DEPTHKV_MODEL_DIR:-$HOME/.cache/depthkv/models}
R=${REPEAT:-3}
mkdir -p "$OUT"
for model in ${MODELS:-SmolLM2-135M-Instruct.Q4_1 gemma-3-270m-q4_k_m}; do
  f="$DIR/$model.gguf"
  for P in ${PROMPTS:-512 4096}; do
    for t in ${THREADS:-1 2}; do
      echo "real_parity: $model prompt $P threads $t" >&2
      "$BUILD/benchmarks/gguf_engine_bench" "$f" --prompt "$P" --decode 32 --threads "$t" --repeat $((R + 1)) \
        --kv-type f16 --json "$OUT/depthkv-$model-p$P-t$t.json" > /dev/null
      for rp in 0 1; do
        for kind in pp tg; do
          args=(-p "$P" -n 0)
          [[ $kind == tg ]] && args=(-p 0 -n 32 -d "$P")
          "$LLAMA/llama-bench" -m "$f" "${args[@]}" -t "$t" -r "$R" --repack $rp -o json \
            > "$OUT/llamacpp-$model-p$P-t$t-repack$rp-$kind.json" 2> "$OUT/llamacpp-$model-p$P-t$t-repack$rp-$kind.log" ||
            { echo "real_parity: llama-bench failed ($model, repack $rp, $kind): see the .log" >&2;
              rm -f "$OUT/llamacpp-$model-p$P-t$t-repack$rp-$kind.json"; }
        done
      done
    done
  done
done
python3 benchmarks/parity_table.py --real "$OUT"
