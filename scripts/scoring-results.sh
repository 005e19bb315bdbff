#!/usr/bin/env bash
# Output-aware scoring (--output-aware, CriticalKV) and adaptive cross-head budgets
# (--head-alloc adaptive, AdaKV) against plain SnapKV / H2O, uniform and optimal per-layer
# budgets, keep 0.1 / 0.2 / 0.3, on stories260K and aidreams260K. Writes the profiles measured
# under each setting and every eval's CSV rows to docs/results/scoring/ (the tables of
# docs/results/scoring.md). Usage: scripts/scoring-results.sh [build dir] (DEPTHKV_DATA_DIR: data)
set -euo pipefail
BUILD=${1:-build}
DK="$BUILD/tools/depthkv"
DATA=${DEPTHKV_DATA_DIR:-/work/shared}
OUT=docs/results/scoring
mkdir -p "$OUT"
TEXT="$DATA/text/tinystories_valid.txt"
S="$DATA/models/stories260K/stories260K.bin"
A="$DATA/models/aidreams260K/aidreams260K.bin"
SP=docs/results/stories260K.profile.json   # 24 calibration windows 0..23, 384 + 128 tokens, 4/16/16
AP=docs/results/aidreams260K.profile.json  # 48 calibration windows 0..47, 96 + 32 tokens, 2/4/4
ASEL="--sinks 2 --recent 4 --obs-window 4"
OA=--output-aware
AD="--head-alloc adaptive"

# profiles measured under each setting (the main profiles' calibration windows and selection)
sprof() { local n=$1; shift; $DK profile --model "$S" --text "$TEXT" --windows 24 --scorers snapkv "$@" -o "$OUT/$n.profile.json" 2>/dev/null; }
aprof() { local n=$1; shift; $DK profile --model "$A" --text "$TEXT" --context 96 --continuation 32 --windows 48 \
  --scorers snapkv $ASEL "$@" -o "$OUT/$n.profile.json" 2>/dev/null; }
sprof stories260K.oa $OA
sprof stories260K.ada $AD
sprof stories260K.oa_ada $OA $AD
aprof aidreams260K.oa $OA
aprof aidreams260K.ada $AD
aprof aidreams260K.oa_ada $OA $AD

# evaluation windows: the first after the calibration windows (stories260K 24..87, aidreams260K 48..175)
sev() { local n=$1 sc=$2 p=$3; shift 3; $DK eval --model "$S" --text "$TEXT" --profile "$p" --scorers $sc \
  --policies uniform,optimal --keeps 0.1,0.2,0.3 --csv "$OUT/$n.csv" "$@" > /dev/null 2>&1; }
aev() { local n=$1 p=$2; shift 2; $DK eval --model "$A" --text "$TEXT" --profile "$p" --scorers snapkv $ASEL \
  --windows 128 --policies uniform,optimal --keeps 0.1,0.2,0.3 --csv "$OUT/$n.csv" "$@" > /dev/null 2>&1; }
sev s_snapkv_plain snapkv $SP
sev s_snapkv_oa snapkv $SP $OA
sev s_snapkv_ada snapkv $SP $AD
sev s_snapkv_oa_ada snapkv $SP $OA $AD
sev s_snapkv_oa_own snapkv "$OUT/stories260K.oa.profile.json" $OA
sev s_snapkv_ada_own snapkv "$OUT/stories260K.ada.profile.json" $AD
sev s_snapkv_oa_ada_own snapkv "$OUT/stories260K.oa_ada.profile.json" $OA $AD
sev s_h2o_plain h2o $SP
sev s_h2o_oa h2o $SP $OA
sev s_h2o_ada h2o $SP $AD
sev s_h2o_oa_ada h2o $SP $OA $AD
aev a_snapkv_plain $AP
aev a_snapkv_oa $AP $OA
aev a_snapkv_ada $AP $AD
aev a_snapkv_oa_ada $AP $OA $AD
aev a_snapkv_oa_own "$OUT/aidreams260K.oa.profile.json" $OA
aev a_snapkv_ada_own "$OUT/aidreams260K.ada.profile.json" $AD
aev a_snapkv_oa_ada_own "$OUT/aidreams260K.oa_ada.profile.json" $OA $AD
rm -f "$OUT"/*-sensitivity.csv
