#!/usr/bin/env bash
# The choice of `--preset best`'s context weight (kPresetContextWeight, preset.hpp) on CALIBRATION
# kinds only (stories, legal; scripts/robust.sh): the preset at --context-weight 0 (the lookahead
# alone), 0.25, 0.5, 1, 2, 4, both models, both protocols, keep 0.1-0.9, 16 windows, against
# plain SnapKV uniform's rows of scripts/robust.sh (docs/results/robust/*.plain.csv). Rows:
# docs/results/robust/context-weight/<model>.<kind>.<protocol>.w<W>.csv; the table (geometric-mean
# ratio to SnapKV uniform over the 48 cells, the worst cell, cells above 1.0x) on stdout.
# Usage: scripts/context-weight-selection.sh [build dir] (DEPTHKV_DATA_DIR: data folder)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
DK="$BUILD/tools/depthkv"
DATA=${DEPTHKV_DATA_DIR:-../shared}
OUT=docs/results/robust/context-weight
WORK=${TMPDIR:-/tmp}/depthkv-context-weight
mkdir -p "$OUT" "$WORK/texts"
python3 scripts/robust_texts.py "$WORK/texts" > /dev/null
for W in 0 0.25 0.5 1 2 4; do
  for name in stories260K aidreams260K; do
    if [[ $name == stories260K ]]; then model=$DATA/models/stories260K/stories260K.bin skip=24 prot=(--sinks 4 --recent 16 --obs-window 16)
    else model=$DATA/models/aidreams260K/aidreams260K.bin skip=48 prot=(--sinks 0 --recent 4 --obs-window 4); fi
    for kind in stories legal; do
      text=$WORK/texts/$kind.txt at=(--skip 0)
      [[ $kind == stories ]] && text=$DATA/text/tinystories_valid.txt at=(--skip $skip)
      for src in text model; do
        tag="$OUT/$name.$kind.$src.w$W"
        $DK eval --model "$model" --text "$text" --windows 16 "${at[@]}" "${prot[@]}" --continuation-source $src \
          --keeps 0.1,0.2,0.3,0.5,0.7,0.9 --profile "docs/results/$name.best.profile.json" --preset best \
          --context-weight $W --csv "$tag.csv" > /dev/null 2>&1
        rm -f "$tag"-sensitivity.csv
      done
    done
  done
done
python3 - "$OUT" <<'PY'
import csv, math, sys
d = sys.argv[1]
def kl(path, pick):
    with open(path) as f:
        return {float(r["keep"]): (float(r["kl"]), float(r["kl_stderr"])) for r in csv.DictReader(f) if pick(r)}
print("| w | geometric-mean ratio (48 cells) | worst cell | cells above 1.0x |\n|---|---|---|---|")
for W in ("0", "0.25", "0.5", "1", "2", "4"):
    ratios, worst = [], (0.0, 0.0, "")
    for m in ("stories260K", "aidreams260K"):
        for k in ("stories", "legal"):
            for s in ("text", "model"):
                base = kl(f"docs/results/robust/{m}.{k}.{s}.plain.csv", lambda r: r["scorer"] == "snapkv")
                p = kl(f"{d}/{m}.{k}.{s}.w{W}.csv", lambda r: not r["scorer"].endswith("+oracle"))
                for keep in sorted(base):
                    r = p[keep][0] / base[keep][0]
                    se = r * math.hypot(p[keep][1] / p[keep][0], base[keep][1] / base[keep][0]) if p[keep][0] > 0 else 0.0
                    ratios.append(r)
                    if r > worst[0]:
                        worst = (r, se, f"{m} {k} {s}, keep {keep:g}")
    gm = math.exp(sum(math.log(max(r, 1e-9)) for r in ratios) / len(ratios))
    print(f"| {W} | {gm:.3f} | {worst[0]:.2f} +- {worst[1]:.2f} ({worst[2]}) | {sum(r > 1 for r in ratios)} |")
PY
