#!/bin/sh
# The llama.cpp integration's checks on a small configuration, for CI (scripts/test.sh runs it): builds the patched
# library and the programs (build.sh: the stock source fetched by scripts/get-llama-cpp.sh --source-only, both
# cached outside the repository), then on the real models (scripts/get-models.sh):
#   1. check_tiers, SmolLM2 and Gemma 3, a 256-token prompt, flash attention off: 3 tiers holding everything give
#      llama.cpp's own tokens and logits; a removal from one tier changes only that tier; removal from every tier
#      equals llama_memory_seq_rm; real budgets run; two sequences stay apart (exit 1 on any failure);
#   2. llamacpp_generate, SmolLM2, 1024 tokens + 16 decoded: at keep 0.2 (uniform, SnapKV) evictions ran and
#      llama.cpp's KV buffers are those of a tier of budget + one ubatch: ceil((208 + 128) / 32) * 32 = 352 cells
#      per layer against the full cache's ceil(1040 / 256) * 256 = 1280 (llama.cpp pads a context to 256): 0.275x;
#   3. check_quality, SmolLM2, 512 + 32 tokens at keep 0.2: the two engines' full caches agree (KL below 0.05) and
#      every pruned run's KL against its full cache is finite and above 0 (pruning ran).
# Exits 1 naming the failed check. About 8 minutes on 2 cores, most of it the library's build.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
MODELS="${DEPTHKV_MODEL_DIR:-$HOME/.cache/depthkv/models}"
SMOL="$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA="$MODELS/gemma-3-270m-q4_k_m.gguf"
fail() { echo "ci_check.sh: $*" >&2; exit 1; }
[ -f "$SMOL" ] && [ -f "$GEMMA" ] || fail "no real models in $MODELS (scripts/get-models.sh)"
BIN=$(sh "$HERE/build.sh" | tail -1)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT INT TERM
cat /usr/share/common-licenses/* > "$TMP/prompt.txt"

for m in "$SMOL" "$GEMMA"; do
  "$BIN/check_tiers" "$m" 256 off > "$TMP/tiers.log" 2>&1 || { cat "$TMP/tiers.log"; fail "check_tiers $(basename "$m")"; }
done
echo "ci_check.sh: check_tiers passed on both models"

"$BIN/llamacpp_generate" "$SMOL" "$TMP/prompt.txt" 1024 16 > "$TMP/full.json" || fail "llamacpp_generate keep 1"
"$BIN/llamacpp_generate" "$SMOL" "$TMP/prompt.txt" 1024 16 0.2 > "$TMP/pruned.json" || fail "llamacpp_generate keep 0.2"
"$BIN/check_quality" "$SMOL" "$TMP/prompt.txt" 512 32 0.2 > "$TMP/quality.json" || fail "check_quality"
python3 - "$TMP" <<'PY' || fail "a check on the runs' figures (above)"
import json, math, sys
d = sys.argv[1]
full, pruned, q = (json.load(open(f"{d}/{n}.json")) for n in ("full", "pruned", "quality"))
ok = True
def check(cond, what):
    global ok
    print(("ok   " if cond else "FAIL ") + what)
    ok = ok and cond
ratio = pruned["kv_buffer_mib"] / full["kv_buffer_mib"]
pad = lambda n, m: -(-n // m) * m
bound = pad(round(0.2 * 1040) + 128, 32) / pad(1040, 256)
check(abs(ratio - bound) < 0.01, f"keep 0.2 KV buffers {pruned['kv_buffer_mib']:.2f} MiB = {ratio:.3f}x the full cache's ({bound:.3f}x expected)")
check(pruned["removed"] > 0 and pruned["evictions"] > 0, f"keep 0.2 evicted ({pruned['evictions']} rounds, {pruned['removed']} positions)")
check(q["engines_full"]["kl"][0] < 0.05, f"full caches: llama.cpp against depthkv's engine, KL {q['engines_full']['kl'][0]:.4f} (< 0.05)")
for r in ("llamacpp_tiers", "llamacpp_layers", "depthkv_engine"):
    kl = q[r]["kl"][0]
    check(math.isfinite(kl) and kl > 0, f"{r}: KL against its full cache {kl:.4f} (finite, > 0)")
sys.exit(0 if ok else 1)
PY
echo "ci_check.sh: all llama.cpp checks passed"
