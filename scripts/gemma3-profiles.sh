#!/usr/bin/env bash
# Gemma 3 270M's profiles (docs/results/gemma3.profile.json, gemma3.best.profile.json and
# gemma3.retrieval.profile.json), made as
# SmolLM2's in scripts/main-job.sh: on calibration text only, the licences of
# /usr/share/common-licenses cut into 384 + 128-token windows (windows 0..5; the best profile on
# windows 0..1). SnapKV layer curves at keeps 0.1-0.5; the best profile SnapKV head curves with
# max pooling, output-aware norms and a 32-token lookahead (what --preset best reads); the
# retrieval profile snapkv-keydiff head curves (--preset retrieval). The RULER
# suite (scripts/ruler.sh) reads them. About 20 minutes on 2 cores; an interrupted run resumes
# (--resume: each profile continues from its checkpointed partial file).
# Usage: scripts/gemma3-profiles.sh (DK: the depthkv program, default build/release/tools/depthkv)
set -euo pipefail
cd "$(dirname "$0")/.."
DK="${DK:-build/release/tools/depthkv}"
scripts/get-models.sh
G="${DEPTHKV_MODEL_DIR:-$HOME/.cache/depthkv/models}/gemma-3-270m-q4_k_m.gguf"
TEXT="${TMPDIR:-/tmp}/depthkv-licenses.txt"  # a fixed path: --resume checks it
L=/usr/share/common-licenses
cat "$L/GPL-3" "$L/Apache-2.0" "$L/MPL-2.0" "$L/GFDL-1.3" "$L/LGPL-2.1" "$L/Artistic" > "$TEXT"
OUT=docs/results
$DK profile --model "$G" --text "$TEXT" --doc-separator '' --context 384 --continuation 128 --windows 6 \
  --scorers snapkv --ratios 0.1,0.2,0.3,0.5 --resume -o "$OUT/gemma3.profile.json" > "$OUT/gemma3.profile.txt"
$DK profile --model "$G" --text "$TEXT" --doc-separator '' --context 384 --continuation 128 --windows 2 \
  --scorers snapkv --pooling max --output-aware --lookahead 32 --head-curves --ratios 0.1,0.2,0.3 --resume \
  -o "$OUT/gemma3.best.profile.json" > "$OUT/gemma3.best.profile.txt"
$DK profile --model "$G" --text "$TEXT" --doc-separator '' --context 384 --continuation 128 --windows 2 \
  --preset retrieval --ratios 0.1,0.2,0.3 --resume \
  -o "$OUT/gemma3.retrieval.profile.json" > "$OUT/gemma3.retrieval.profile.txt"
