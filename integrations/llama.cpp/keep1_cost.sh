#!/bin/sh
# The patch's cost at keep 1: llamacpp_generate on the unpatched library (llamacpp_generate_stock) and on the
# patched one without tiers (llama.cpp's own memory), alternated R times per model, 2048 tokens + 32 decoded,
# ubatch 128, 2 threads, flash attention off, swa_full false. Prints per model and side the mean and standard
# deviation of prefill and decode tok/s, and the ratio of the means.
# usage: keep1_cost.sh [R=5] [n_prompt=2048]
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
R=${1:-5}
N=${2:-2048}
MODELS="${DEPTHKV_MODEL_DIR:-$HOME/.cache/depthkv/models}"
BIN=$(sh "$HERE/build.sh" | tail -1)
[ -x "$BIN/llamacpp_generate_stock" ] || { echo "keep1_cost.sh: no llamacpp_generate_stock (scripts/get-llama-cpp.sh, then build.sh)" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT INT TERM
cat /usr/share/common-licenses/* > "$TMP/prompt.txt"
for m in SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf; do
  i=0
  while [ "$i" -lt "$R" ]; do
    for side in stock patched; do
      prog="$BIN/llamacpp_generate"
      [ "$side" = stock ] && prog="$BIN/llamacpp_generate_stock"
      printf '{"side": "%s", %s\n' "$side" "$("$prog" "$MODELS/$m" "$TMP/prompt.txt" "$N" 32 | cut -c2-)" >> "$TMP/runs.jsonl"
    done
    i=$((i + 1))
  done
done
python3 - "$TMP/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print("| model | side | runs | prefill tok/s | decode tok/s |")
print("|---|---|---|---|---|")
for m in dict.fromkeys(r["model"] for r in runs):
    means = {}
    for side in ("stock", "patched"):
        rs = [r for r in runs if r["model"] == m and r["side"] == side]
        p = [r["prefill_tok_s"] for r in rs]
        d = [r["decode_tok_s"] for r in rs]
        means[side] = (statistics.mean(p), statistics.mean(d))
        print(f"| {m} | {side} | {len(rs)} | {statistics.mean(p):.1f} ± {statistics.stdev(p):.1f} | "
              f"{statistics.mean(d):.2f} ± {statistics.stdev(d):.2f} |")
    print(f"| {m} | patched / stock | | {means['patched'][0] / means['stock'][0]:.3f}x | "
          f"{means['patched'][1] / means['stock'][1]:.3f}x |")
PY
