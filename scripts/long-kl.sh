#!/usr/bin/env bash
# KL(full || pruned) on SmolLM2 at 2K-token windows (2048 context + 128 continuation, 6 windows per
# kind) on three kinds of Debian text: licences (the main job's licenses.txt, windows 2..7: after
# the profiles' calibration tokens), Python sources and markup (scripts/robust_texts.py, windows
# 0..5). SnapKV uniform and optimal (smollm2.profile.json) and `--preset best`
# (smollm2.best.profile.json); both profiles were measured at 384 + 128 tokens on licences.
# Rows: docs/results/long-kl/ (docs/results/long-kl.md quotes them). About 8 minutes on 2 cores.
# Usage: scripts/long-kl.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")/.."
DK="${1:-build/release}/tools/depthkv"
M="${DEPTHKV_MODEL_DIR:-$HOME/.cache/depthkv/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT=docs/results/long-kl
WORK=${TMPDIR:-/tmp}/depthkv-long-kl
mkdir -p "$OUT" "$WORK"
L=/usr/share/common-licenses
cat "$L/GPL-3" "$L/Apache-2.0" "$L/MPL-2.0" "$L/GFDL-1.3" "$L/LGPL-2.1" "$L/Artistic" > "$WORK/licenses.txt"
python3 scripts/robust_texts.py "$WORK" > /dev/null
run() {  # kind, text, first window
  local common=(--model "$M" --text "$2" --doc-separator '' --context 2048 --continuation 128 --windows 6 --skip "$3"
                --keeps 0.1,0.2,0.3,0.5)
  $DK eval "${common[@]}" --profile docs/results/smollm2.profile.json --scorers snapkv --policies uniform,optimal \
    > "$OUT/smollm2.$1.policies.txt" 2>&1
  $DK eval "${common[@]}" --profile docs/results/smollm2.best.profile.json --preset best > "$OUT/smollm2.$1.preset.txt" 2>&1
}
run licences "$WORK/licenses.txt" 2
run code "$WORK/code.txt" 0
run markup "$WORK/markup.txt" 0
