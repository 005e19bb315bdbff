#!/usr/bin/env bash
# The RULER-style suite's committed figures (docs/results/ruler.md): SmolLM2-135M-Instruct at 2K
# tokens, report seeds (1000, 1001), both protocols; the plain methods, then span pooling on the
# same samples. About 35 minutes on 2 cores. Needs the depthkv Python package (scripts/python-test.sh
# builds it into $DEPTHKV_VENV) and the model (scripts/get-models.sh).
# Usage: scripts/ruler.sh (DEPTHKV_VENV: the virtual environment, default /tmp/depthkv-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${DEPTHKV_VENV:-/tmp/depthkv-venv}/bin/python"
M="${DEPTHKV_MODEL_DIR:-$HOME/.cache/depthkv/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT=docs/results/ruler
mkdir -p "$OUT"
common=(--model "$M" --lengths 2048 --samples 2 --compressions 0.5,0.75
        --profile docs/results/smollm2.profile.json --best-profile docs/results/smollm2.best.profile.json)
for proto in outside inside; do
  "$PY" benchmarks/ruler/run.py "${common[@]}" --protocol $proto --tasks niah_single_1,niah_single_2,vt \
    --methods full,snapkv,optimal,preset --out "$OUT/smollm2.2k.$proto.json" > /dev/null
  "$PY" benchmarks/ruler/run.py "${common[@]}" --protocol $proto --tasks niah_single_1,niah_single_2 \
    --methods snapkv-span,preset-span --out "$OUT/smollm2.2k.$proto.span.json" > /dev/null
  "$PY" benchmarks/ruler/report.py --no-plot --out "$OUT/smollm2.2k.$proto.table" "$OUT/smollm2.2k.$proto.json" \
    "$OUT/smollm2.2k.$proto.span.json"
done
