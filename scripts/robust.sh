#!/usr/bin/env bash
# `--preset best` on many kinds of text and both continuation protocols, against plain SnapKV and
# H2O with uniform budgets, the oracle with the preset's budgets (scores from the continuation's
# own attention, `eval --oracle`; a measurement only) and the preset without its lookahead.
# Kinds (scripts/robust_texts.py builds the texts from files on this Debian machine):
#   stories (TinyStories, the main results' evaluation windows) and legal (licences but GPL-3,
#     windows 0..15): CALIBRATION kinds, the only ones any setting may be chosen on, but on other
#     windows (scripts/preset-calibration.sh); the windows here choose nothing;
#   code (Python sources), markup (.md/.rst/.html docs), changelog (Debian changelogs): HELD OUT.
# Protocols: --continuation-source text (the true text teacher-forced) and model (the model's own
# greedy continuation). Both models, keep 0.1/0.2/0.3/0.5/0.7/0.9, 16 windows per kind.
# Writes the rows to docs/results/robust/, the windows to docs/results/robust-windows.md and the
# table to docs/results/robust.md (scripts/robust-table.py).
# Usage: scripts/robust.sh [build dir] (DEPTHKV_DATA_DIR: data folder; ROBUST_WINDOWS: windows per kind)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
DK="$BUILD/tools/depthkv"
DATA=${DEPTHKV_DATA_DIR:-../shared}
OUT=docs/results/robust
WORK=${TMPDIR:-/tmp}/depthkv-robust
N=${ROBUST_WINDOWS:-16}
KEEP=0.1,0.2,0.3,0.5,0.7,0.9
mkdir -p "$OUT" "$WORK/texts"
STORIES="$DATA/text/tinystories_valid.txt"
python3 scripts/robust_texts.py "$WORK/texts" > "$WORK/files.md"

# name, model, stories skip (the evaluation windows), selection flags
run_model() {
  local name=$1 model=$2 skip=$3
  shift 3
  local main="docs/results/$name.profile.json" best="docs/results/$name.best.profile.json"
  for kind in stories legal code markup changelog; do
    local text="$WORK/texts/$kind.txt" at=(--skip 0)
    [[ $kind == stories ]] && text=$STORIES at=(--skip "$skip")
    for src in text model; do
      local tag="$OUT/$name.$kind.$src" common=(--model "$model" --text "$text" --windows "$N" "${at[@]}" "$@"
                                                   --continuation-source "$src" --keeps $KEEP)
      $DK eval "${common[@]}" --profile "$main" --scorers snapkv,h2o --policies uniform --csv "$tag.plain.csv" > /dev/null 2>&1
      $DK eval "${common[@]}" --profile "$best" --preset best --oracle --csv "$tag.best.csv" > /dev/null 2>&1
      $DK eval "${common[@]}" --profile "$best" --preset best --lookahead 0 --csv "$tag.best0.csv" > /dev/null 2>&1
      rm -f "$tag".*-sensitivity.csv
      echo "robust: $name $kind $src" >&2
    done
  done
}

run_model stories260K "$DATA/models/stories260K/stories260K.bin" 24 --sinks 4 --recent 16 --obs-window 16
run_model aidreams260K "$DATA/models/aidreams260K/aidreams260K.bin" 48 --sinks 0 --recent 4 --obs-window 4

{
  echo "# Windows of the robustness measurement"
  echo
  echo "Written by \`scripts/robust.sh\` (texts: \`scripts/robust_texts.py\`). Every kind: $N consecutive windows"
  echo "(stories260K 384 + 128 tokens, aidreams260K 96 + 32), cut by \`eval\` from the kind's text from its start,"
  echo "except stories: the main results' evaluation windows of \`tinystories_valid.txt\` (stories260K from"
  echo "window 24, aidreams260K from 48; \`windows.md\`). Each kind's text is its files in sorted path order"
  echo "(1 KB to 400 KB each), joined by a blank line, until it holds 120,000 characters; the windows use its"
  echo "beginning only."
  echo
  echo "**CALIBRATION kinds** (a setting may be chosen on them): stories, legal."
  echo "**HELD OUT kinds** (reported only, never used for a choice): code, markup, changelog."
  echo
  cat "$WORK/files.md"
} > docs/results/robust-windows.md
python3 scripts/robust-table.py "$OUT" "$N" > docs/results/robust.md
echo "robust: docs/results/robust.md"
