#!/usr/bin/env bash
# The lookahead of `--preset best`, on calibration data only: the split of scripts/preset-selection.sh
# (stories260K: profile windows 0..11, select on 12..23; aidreams260K: 0..23 and 24..47), the preset
# profiled and evaluated with --lookahead G for each candidate G (0 = the context's own queries).
# Rule: the geometric mean over both models and keep 0.1, 0.2, 0.3, 0.5 of (KL of the candidate) /
# (plain SnapKV uniform KL of the same cell, docs/results/preset/*.snapkv-max.plain.csv, written by
# preset-selection.sh). The reported evaluation windows and the GPL-3 text are not used. Writes the
# rows to docs/results/lookahead/ and the table docs/results/lookahead.md.
# Usage: scripts/lookahead-selection.sh [build dir] (DEPTHKV_DATA_DIR: data folder)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
DK="$BUILD/tools/depthkv"
DATA=${DEPTHKV_DATA_DIR:-../shared}
OUT=docs/results/lookahead
WORK=${TMPDIR:-/tmp}/depthkv-lookahead
mkdir -p "$OUT" "$WORK"
TEXT="$DATA/text/tinystories_valid.txt"
S="$DATA/models/stories260K/stories260K.bin"
A="$DATA/models/aidreams260K/aidreams260K.bin"
KEEP=0.1,0.2,0.3,0.5
. scripts/selection-split.sh

for G in 0 8 16 32 64 128; do
  split_preset_best "stories260K.la$G" "$S" 12 384 128 "$OUT/stories260K.lookahead$G.csv" --lookahead "$G"
  split_preset_best "aidreams260K.la$G" "$A" 24 96 32 "$OUT/aidreams260K.lookahead$G.csv" \
    --sinks 2 --recent 4 --obs-window 4 --lookahead "$G"
  echo "lookahead-selection: G=$G done"
done
python3 - "$OUT" docs/results/preset > docs/results/lookahead.md <<'PY'
import csv, math, sys
out, ref_dir = sys.argv[1], sys.argv[2]
models = ["stories260K", "aidreams260K"]
gs = [0, 8, 16, 32, 64, 128]
def rows(path):
    with open(path) as f:
        return {float(r["keep"]): (r["scorer"], float(r["kl"])) for r in csv.DictReader(f) if r["policy"] != "uniform"}
ref = {}
for m in models:
    with open(f"{ref_dir}/{m}.snapkv-max.plain.csv") as f:
        ref[m] = {float(r["keep"]): float(r["kl"]) for r in csv.DictReader(f) if r["policy"] == "uniform"}
print("# Lookahead of `--preset best`: chosen on calibration windows\n")
print("Written by `scripts/lookahead-selection.sh`. The split of `scripts/preset-selection.sh` "
      "(stories260K: profile windows 0..11, select on 12..23, 384 + 128 tokens, selection 4/16/16; "
      "aidreams260K: 0..23 and 24..47, 96 + 32 tokens, 2/4/4); `--preset best` profiled on the first "
      "half and evaluated on the second with `--lookahead G`: both output-aware scorers observe the "
      "attention of the model's next G greedy tokens after the context (decoded on the full cache, "
      "then removed) instead of the context's queries; G = 0 is the context's queries. Rule: the "
      "lowest geometric mean over both models and keep 0.1, 0.2, 0.3, 0.5 of the KL divided by the "
      "plain SnapKV uniform KL of the cell (`docs/results/preset/*.snapkv-max.plain.csv`). "
      "Mean KL on the selection windows (the scorer the preset chose):\n")
print("| G | " + " | ".join(f"{m} keep {k}" for m in models for k in (0.1, 0.2, 0.3, 0.5)) + " | geometric mean ratio |")
print("|---" * 10 + "|")
for g in gs:
    cells, logs = [], []
    for m in models:
        r = rows(f"{out}/{m}.lookahead{g}.csv")
        for k in (0.1, 0.2, 0.3, 0.5):
            sc, kl = r[k]
            cells.append(f"{kl:.5f} ({sc})")
            logs.append(math.log(kl / ref[m][k]))
    print(f"| {g} | " + " | ".join(cells) + f" | {math.exp(sum(logs) / len(logs)):.3f} |")
print("\nThe preset's lookahead is the shortest G whose score is within 1% of the lowest (a lookahead "
      "costs G decode steps over the full cache per prompt); this rule was set after seeing the table "
      "(by the lowest score alone, the winner is named above). `PresetSettings::kPresetLookahead`.")
PY
echo "lookahead-selection: docs/results/lookahead.md"
