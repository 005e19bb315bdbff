#!/usr/bin/env bash
# The README's headline figures on the untouched windows (docs/results/windows.md: stories260K
# windows 216..279, aidreams260K windows 176..303 of tinystories_valid.txt; no setting is ever
# chosen on them) beside the same figures on the evaluation windows that several revisions of the
# preset were scored on (stories260K 24..87, aidreams260K 48..175), with the same commands on both:
#  - the main job's comparison (five policies x H2O, SnapKV x four budgets, the main profiles);
#  - `--preset best` against uniform budgets (scripts/preset-heldout.sh's rows: plain SnapKV, and
#    the preset's output-aware scorers with and without its lookahead), with the preset's profiles
#    and protection;
#  - head-level budgets (main job step 7's story-text rows: SnapKV, output-aware, lookahead 32;
#    uniform, optimal per layer, head-optimal per KV head);
#  - the kvpress ratios, when benchmarks/kvpress_peer/run.py has written kvpress_peer.json
#    (evaluation windows) and kvpress_peer_untouched.json (`--skip stories260K=216,aidreams260K=176
#    --out kvpress_peer_untouched`).
# Profiles: docs/results/<model>.profile.json and <model>.best.profile.json (scripts/main-job.sh).
# Writes the rows to docs/results/untouched/ and the tables to docs/results/untouched.md.
# Usage: scripts/untouched-windows.sh [build dir] (DEPTHKV_DATA_DIR: data folder; ROWS: the row
# files to (re)write, e.g. ROWS=best after a change of the preset alone; default all)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
DK="$BUILD/tools/depthkv"
DATA=${DEPTHKV_DATA_DIR:-../shared}
OUT=docs/results/untouched
mkdir -p "$OUT"
TEXT="$DATA/text/tinystories_valid.txt"
S="$DATA/models/stories260K/stories260K.bin"
A="$DATA/models/aidreams260K/aidreams260K.bin"
KEEP=0.1,0.2,0.3,0.5
ROWS=${ROWS:-main,plain,oa,oa0,best,heads}
want() { [[ ,$ROWS, == *,$1,* ]]; }

# name model windows eval-skip untouched-skip main-selection... -- preset-selection...
run_model() {
  local name=$1 model=$2 n=$3 eskip=$4 uskip=$5
  shift 5
  local main=() best=()
  while [[ $1 != -- ]]; do main+=("$1"); shift; done
  shift
  best=("$@")
  local plain="docs/results/$name.profile.json" own="docs/results/$name.best.profile.json"
  for set in eval untouched; do
    local skip=$eskip
    [[ $set == untouched ]] && skip=$uskip
    local ev=(eval --model "$model" --text "$TEXT" --skip "$skip" --windows "$n" --keeps "$KEEP")
    want main && $DK "${ev[@]}" --profile "$plain" "${main[@]}" --scorers h2o,snapkv \
      --policies uniform,pyramid,proportional,middle,optimal --csv "$OUT/$set.$name.main.csv" > "$OUT/$set.$name.main.txt"
    want plain && $DK "${ev[@]}" --profile "$plain" "${best[@]}" --scorers snapkv --policies uniform \
      --csv "$OUT/$set.$name.plain.csv" > /dev/null
    want oa && $DK "${ev[@]}" --profile "$own" "${best[@]}" --scorers snapkv,h2o --output-aware --lookahead 32 \
      --policies uniform --csv "$OUT/$set.$name.oa.csv" > /dev/null
    want oa0 && $DK "${ev[@]}" --profile "$own" "${best[@]}" --scorers snapkv,h2o --output-aware --lookahead 0 \
      --policies uniform --csv "$OUT/$set.$name.oa0.csv" > /dev/null
    want best && $DK "${ev[@]}" --profile "$own" "${best[@]}" --preset best --csv "$OUT/$set.$name.best.csv" > /dev/null
    want heads && $DK "${ev[@]}" --profile "$own" "${best[@]}" --scorers snapkv --output-aware --lookahead 32 \
      --policies uniform,optimal,head-optimal --csv "$OUT/$set.$name.heads.csv" > /dev/null
    rm -f "$OUT"/*-sensitivity.csv
    echo "untouched-windows: $name $set (windows $skip..$((skip + n - 1))) done"
  done
}

run_model stories260K "$S" 64 24 216 -- --sinks 4 --recent 16 --obs-window 16
run_model aidreams260K "$A" 128 48 176 --sinks 2 --recent 4 --obs-window 4 -- --sinks 0 --recent 4 --obs-window 4
python3 scripts/untouched-table.py "$OUT" > docs/results/untouched.md
echo "untouched-windows: docs/results/untouched.md"
