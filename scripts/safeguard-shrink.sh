#!/usr/bin/env bash
# The measurement behind the default safeguard floor of short contexts, on calibration data only,
# with the split of scripts/preset-selection.sh (aidreams260K: profile windows 0..23, evaluate on
# 24..47 of the main profile's 48 calibration windows; 96 + 32 tokens, --sinks 2 --recent 4
# --obs-window 4). At keep 0.1 the floor sinks + recent + 8 = 14 does not fit the ~10 tokens per
# layer; the rows compare what a floor that does not fit turns into: uniform budgets (--min-tokens
# 14, a fixed floor), the margin halved until it fits (--min-tokens -1, the default), or no margin
# (--min-tokens 0), for both output-aware scorers of `--preset best` and both curve policies.
# Writes docs/results/safeguard-shrink.md.
# Usage: scripts/safeguard-shrink.sh [build dir] (DEPTHKV_DATA_DIR: data folder)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
DK="$BUILD/tools/depthkv"
DATA=${DEPTHKV_DATA_DIR:-../shared}
WORK=${TMPDIR:-/tmp}/depthkv-safeguard-shrink
mkdir -p "$WORK"
TEXT="$DATA/text/tinystories_valid.txt"
A="$DATA/models/aidreams260K/aidreams260K.bin"
SEL=(--sinks 2 --recent 4 --obs-window 4)
$DK profile --model "$A" --text "$TEXT" --context 96 --continuation 32 --windows 24 "${SEL[@]}" --preset best \
  -o "$WORK/profile.json" > /dev/null 2>&1
for m in 14 -1 0; do
  $DK eval --model "$A" --text "$TEXT" --profile "$WORK/profile.json" --skip 24 --windows 24 "${SEL[@]}" \
    --scorers snapkv,h2o --output-aware --pooling max --min-tokens "$m" --policies uniform,optimal,head-optimal \
    --keeps 0.1,0.2 --csv "$WORK/m$m.csv" > /dev/null 2>&1
done
python3 - "$WORK" > docs/results/safeguard-shrink.md <<'PY'
import csv, os, sys
d = sys.argv[1]
rows = {}
for m in ("14", "-1", "0"):
    with open(os.path.join(d, f"m{m}.csv")) as f:
        for r in csv.DictReader(f):
            rows[(m, r["scorer"], r["policy"], float(r["keep"]))] = (float(r["kl"]), r["budgets"])
print("# The safeguard floor where it does not fit\n")
print("Written by `scripts/safeguard-shrink.sh`. aidreams260K, calibration data only: curves (`profile --preset best`) "
      "on windows 0..23, mean KL on windows 24..47 (96 + 32 tokens, 2 sinks + 4 recent tokens). The floor "
      "sinks + recent + 8 = 14 tokens per head does not fit keep 0.1 (~10 tokens per head). Budgets per layer "
      "in brackets.\n")
print("| scorer | policy | keep | fixed floor 14 (uniform fallback) | margin halved until it fits (default) | no margin (`--min-tokens 0`) |")
print("|---|---|---|---|---|---|")
for sc in ("snapkv", "h2o"):
    for keep in (0.1, 0.2):
        for pol in ("uniform", "optimal", "head-optimal"):
            cells = [f"{rows[(m, sc, pol, keep)][0]:.5f} ({rows[(m, sc, pol, keep)][1].replace(';', ',')})"
                     for m in ("14", "-1", "0")]
            print(f"| {sc} + output-aware | {pol} | {keep:g} | " + " | ".join(cells) + " |")
PY
echo "safeguard-shrink: docs/results/safeguard-shrink.md"
