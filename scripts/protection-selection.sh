#!/usr/bin/env bash
# The measurement behind the protection (--sinks, --recent) of the main job's `--preset best` runs,
# on calibration data only, with the same split as scripts/preset-selection.sh: each main
# profile's calibration windows are split in two, every candidate is profiled (with head curves)
# on the first half and evaluated with `--preset best` on the second (stories260K: profile 0..11,
# select on 12..23; aidreams260K: 0..23 and 24..47). The evaluation windows of the reported
# results and the GPL-3 text are never used. The observation window stays the main job's (16 and
# 4: it is the scorer's, not protection), and the safeguard floor follows the protection
# (sinks + recent + 8). Writes the rows to docs/results/protection/ and the table
# docs/results/protection.md.
# Usage: scripts/protection-selection.sh [build dir] (DEPTHKV_DATA_DIR: data folder)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
DK="$BUILD/tools/depthkv"
DATA=${DEPTHKV_DATA_DIR:-../shared}
OUT=docs/results/protection
WORK=${TMPDIR:-/tmp}/depthkv-protection
mkdir -p "$OUT" "$WORK"
TEXT="$DATA/text/tinystories_valid.txt"
KEEP=0.1,0.2,0.3,0.5
. scripts/selection-split.sh

# name, model, profile windows, context, continuation, observation window, sinks list, recent list
run_model() {
  local name=$1 model=$2 half=$3 ctx=$4 cont=$5 obs=$6 sinks=$7 recents=$8
  for s in $sinks; do
    for r in $recents; do
      local tag="$name.s$s.r$r" sel=(--sinks "$s" --recent "$r" --obs-window "$obs")
      split_preset_best "$tag" "$model" "$half" "$ctx" "$cont" "$OUT/$tag.csv" "${sel[@]}"
      echo "protection-selection: $tag done"
    done
  done
}

run_model stories260K "$DATA/models/stories260K/stories260K.bin" 12 384 128 16 "0 2 4" "0 4 16"
run_model aidreams260K "$DATA/models/aidreams260K/aidreams260K.bin" 24 96 32 4 "0 1 2" "0 1 2 4"

python3 - "$OUT" > docs/results/protection.md <<'PY'
import csv, math, os, sys
d = sys.argv[1]
rows = {}
for fn in sorted(os.listdir(d)):
    if not fn.endswith(".csv"):
        continue
    model, s, r = fn[:-4].split(".")
    with open(os.path.join(d, fn)) as f:
        rows[(model, int(s[1:]), int(r[1:]))] = {float(x["keep"]): float(x["kl"]) for x in csv.DictReader(f)}
models = sorted({k[0] for k in rows}, key=lambda m: m != "stories260K")
print("# Protection of `--preset best`: chosen on calibration windows\n")
print("Written by `scripts/protection-selection.sh`. Each main profile's calibration windows split in two "
      "(stories260K: profile 0..11, select on 12..23, 384 + 128 tokens, observation window 16; aidreams260K: "
      "0..23 and 24..47, 96 + 32 tokens, observation window 4); every (sinks, recent) candidate profiled with "
      "`--preset best` (head curves) on the first half and evaluated with `--preset best` on the second; the "
      "safeguard floor is sinks + recent + 8. Rule: per model (the protection depends on the context length), "
      "the lowest geometric mean over the keep ratios of the mean KL. The reported evaluation windows and "
      "GPL-3 are not used.\n")
for m in models:
    cands = sorted(k[1:] for k in rows if k[0] == m)
    keeps = sorted(next(iter(rows.values())).keys())
    score = {c: math.exp(sum(math.log(rows[(m, *c)][k]) for k in keeps) / len(keeps)) for c in cands}
    best = min(cands, key=lambda c: score[c])
    print(f"## {m}: mean KL on the selection windows\n")
    print("| sinks | recent | " + " | ".join(f"keep {k:g}" for k in keeps) + " | geometric mean |")
    print("|---|---|" + "---|" * (len(keeps) + 1))
    for c in sorted(cands, key=lambda c: score[c]):
        cells = " | ".join(f"{rows[(m, *c)][k]:.5f}" for k in keeps)
        print(f"| {c[0]} | {c[1]} | {cells} | {score[c]:.5f}{' (chosen)' if c == best else ''} |")
    print(f"\nChosen for {m}: **--sinks {best[0]} --recent {best[1]}**.\n")
PY
echo "protection-selection: docs/results/protection.md"
