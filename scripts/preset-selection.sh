#!/usr/bin/env bash
# The measurement behind `--preset best`, on calibration data only: each main profile's
# calibration windows are split in two, candidate settings are profiled on the first half and
# evaluated on the second (stories260K: profile 0..11, select on 12..23 of the 24 calibration
# windows; aidreams260K: 0..23 and 24..47 of 48). The evaluation windows of the reported results
# (stories260K 24..87, aidreams260K 48..175) and the GPL-3 text are never used here.
# Candidates: SnapKV (max or avg pooling) and H2O, each plain, output-aware, adaptive heads, or
# both; optimal per-layer budgets on curves measured under the candidate's own setting, and
# head-optimal per-(layer, KV head) budgets on head curves measured alongside (uniform rows too);
# and `--preset best` as it is now: per keep, the output-aware scorer (SnapKV max or H2O) of the
# lower predicted head-optimal loss on the first half's curves. Writes every eval's CSV rows to docs/results/preset/ and the table
# docs/results/preset.md (scripts/preset-table.py).
# Usage: scripts/preset-selection.sh [build dir] (DEPTHKV_DATA_DIR: data folder)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
DK="$BUILD/tools/depthkv"
DATA=${DEPTHKV_DATA_DIR:-../shared}
OUT=docs/results/preset
WORK=${TMPDIR:-/tmp}/depthkv-preset
mkdir -p "$OUT" "$WORK"
TEXT="$DATA/text/tinystories_valid.txt"
S="$DATA/models/stories260K/stories260K.bin"
A="$DATA/models/aidreams260K/aidreams260K.bin"
KEEP=0.1,0.2,0.3,0.5
. scripts/selection-split.sh

# model, profile windows, context, continuation, selection flags
run_model() {
  local name=$1 model=$2 half=$3 ctx=$4 cont=$5
  shift 5
  local sel=("$@")
  for scorer in snapkv-max snapkv-avg h2o; do
    local sc=${scorer%%-*} pool=()
    [[ $scorer == snapkv-avg ]] && pool=(--pooling avg)
    for setting in plain oa ada oa_ada; do
      local flags=()
      [[ $setting == oa || $setting == oa_ada ]] && flags+=(--output-aware)
      [[ $setting == ada || $setting == oa_ada ]] && flags+=(--head-alloc adaptive)
      local tag="$name.$scorer.$setting"
      $DK profile --model "$model" --text "$TEXT" --context "$ctx" --continuation "$cont" --windows "$half" \
        --scorers "$sc" "${sel[@]}" "${pool[@]}" "${flags[@]}" --head-curves -o "$WORK/$tag.profile.json" > /dev/null 2>&1
      $DK eval --model "$model" --text "$TEXT" --profile "$WORK/$tag.profile.json" --skip "$half" --windows "$half" \
        --scorers "$sc" "${sel[@]}" "${pool[@]}" "${flags[@]}" --policies uniform,optimal,head-optimal --keeps $KEEP \
        --csv "$OUT/$tag.csv" > /dev/null 2>&1
      rm -f "$OUT/$tag-sensitivity.csv"
      echo "preset-selection: $tag done"
    done
  done
  # the preset itself: both output-aware candidates profiled together, per keep the scorer of the
  # lower predicted head-optimal loss (its rows equal those of the chosen candidate above)
  split_preset_best "$name.best" "$model" "$half" "$ctx" "$cont" "$OUT/$name.preset.best.csv" "${sel[@]}"
  echo "preset-selection: $name preset best done"
}

run_model stories260K "$S" 12 384 128
run_model aidreams260K "$A" 24 96 32 --sinks 2 --recent 4 --obs-window 4
python3 scripts/preset-table.py "$OUT" > docs/results/preset.md
echo "preset-selection: docs/results/preset.md"
