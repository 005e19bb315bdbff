#!/bin/sh
# The memory and speed table of docs/llamacpp.md: llamacpp_generate (build.sh) on SmolLM2-135M at 8K and Gemma 3 270M
# at 32K tokens, the full cache on the unpatched llama.cpp ("stock") and on the patched one without tiers, against
# depthkv's budgets at keep 0.1 (uniform, and optimal from the committed profile in 3 tiers), SnapKV, ubatch 128,
# decode eviction every 16 tokens, 2 threads, flash attention off, swa_full false. Each run is its own process (its
# peak RSS is its own). The prompt: /usr/share/common-licenses/* concatenated, its first N tokens.
# usage: memory_table.sh OUTDIR [smollm2_tokens=8160] [gemma_tokens=32736] [n_gen=32]
# Writes OUTDIR/runs.jsonl (one JSON line per run) and OUTDIR/table.md (memory_table.py).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${1:?usage: memory_table.sh OUTDIR [smollm2_tokens] [gemma_tokens] [n_gen]}
NS=${2:-8160}
NG=${3:-32736}
GEN=${4:-32}
MODELS="${DEPTHKV_MODELS:-$HOME/.cache/depthkv/models}"
SMOL="$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA="$MODELS/gemma-3-270m-q4_k_m.gguf"
BIN=$(sh "$HERE/build.sh" | tail -1)
[ -x "$BIN/llamacpp_generate_stock" ] || { echo "memory_table.sh: no llamacpp_generate_stock (build the stock llama.cpp first: scripts/get-llama-cpp.sh)" >&2; exit 1; }
mkdir -p "$OUT"
TEXT="$OUT/prompt.txt"
cat /usr/share/common-licenses/* > "$TEXT"
: > "$OUT/runs.jsonl"
run() { # label, program, args...
  label=$1; shift
  echo "memory_table.sh: $label" >&2
  line=$("$@") || { echo "memory_table.sh: $label failed" >&2; exit 1; }
  echo "{\"run\": \"$label\", ${line#\{}" >> "$OUT/runs.jsonl"
}
run "stock full" "$BIN/llamacpp_generate_stock" "$SMOL" "$TEXT" "$NS" "$GEN"
run "patched full" "$BIN/llamacpp_generate" "$SMOL" "$TEXT" "$NS" "$GEN"
run "uniform 0.1" "$BIN/llamacpp_generate" "$SMOL" "$TEXT" "$NS" "$GEN" 0.1 uniform
run "optimal 0.1" "$BIN/llamacpp_generate" "$SMOL" "$TEXT" "$NS" "$GEN" 0.1 optimal "$REPO/docs/results/smollm2.profile.json" 3
run "stock full" "$BIN/llamacpp_generate_stock" "$GEMMA" "$TEXT" "$NG" "$GEN"
run "uniform 0.1" "$BIN/llamacpp_generate" "$GEMMA" "$TEXT" "$NG" "$GEN" 0.1 uniform "" 3 snapkv 128 16 2 6
run "optimal 0.1" "$BIN/llamacpp_generate" "$GEMMA" "$TEXT" "$NG" "$GEN" 0.1 optimal "$REPO/docs/results/gemma3.profile.json" 3 snapkv 128 16 2 6
rm -f "$TEXT"
python3 "$HERE/memory_table.py" "$OUT/runs.jsonl" > "$OUT/table.md"
cat "$OUT/table.md"
