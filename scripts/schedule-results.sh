#!/usr/bin/env bash
# Bounded KV memory (issue 15): peak KV bytes against context length, and chunked against oneshot
# quality, on stories260K and aidreams260K. Writes docs/results/schedule/*.json and
# docs/results/schedule.md. Usage: scripts/schedule-results.sh [build dir] (DEPTHKV_DATA_DIR: data)
set -euo pipefail
BUILD=${1:-build}
DK="$BUILD/tools/depthkv"
DATA=${DEPTHKV_DATA_DIR:-/work/shared}
OUT=docs/results/schedule
mkdir -p "$OUT"
TEXT="$DATA/text/tinystories_valid.txt"
S="$DATA/models/stories260K/stories260K.bin"
A="$DATA/models/aidreams260K/aidreams260K.bin"
SP=docs/results/stories260K.profile.json
AP=docs/results/aidreams260K.profile.json
T=${THREADS:-1}

# 1. peak KV bytes against context (stories260K, 8 windows, continuation 64, uniform H2O)
for ctx in 256 384 448; do
  $DK eval --model "$S" --text "$TEXT" --profile "$SP" --windows 8 --context $ctx --continuation 64 \
    --keep 0.1,0.2,0.3 --policies uniform --scorers h2o --threads $T --json > "$OUT/peak_s_ctx${ctx}_oneshot.json"
  for ch in 32 64 128; do
    $DK eval --model "$S" --text "$TEXT" --profile "$SP" --windows 8 --context $ctx --continuation 64 \
      --keep 0.1,0.2,0.3 --policies uniform --scorers h2o --threads $T --json --schedule chunked --chunk $ch \
      > "$OUT/peak_s_ctx${ctx}_chunk${ch}.json"
  done
done

# 2. quality: chunked against oneshot at the same final budget, uniform vs optimal (H2O)
$DK eval --model "$S" --text "$TEXT" --profile "$SP" --windows 64 --keep 0.1,0.2,0.3 --policies uniform,optimal \
  --scorers h2o --threads $T --json > "$OUT/kl_s_oneshot.json"
for ch in 32 64 128; do
  $DK eval --model "$S" --text "$TEXT" --profile "$SP" --windows 64 --keep 0.1,0.2,0.3 --policies uniform,optimal \
    --scorers h2o --threads $T --json --schedule chunked --chunk $ch > "$OUT/kl_s_chunk${ch}.json"
done
AOPT="--sinks 2 --recent 4 --obs-window 4"
$DK eval --model "$A" --text "$TEXT" --profile "$AP" --windows 128 $AOPT --keep 0.1,0.2,0.3 --policies uniform,optimal \
  --scorers h2o --threads $T --json > "$OUT/kl_a_oneshot.json"
for ch in 16 32 64; do
  $DK eval --model "$A" --text "$TEXT" --profile "$AP" --windows 128 $AOPT --keep 0.1,0.2,0.3 --policies uniform,optimal \
    --scorers h2o --threads $T --json --schedule chunked --chunk $ch > "$OUT/kl_a_chunk${ch}.json"
done
python3 scripts/schedule-table.py "$OUT" > docs/results/schedule.md
echo "schedule-results: docs/results/schedule.md"
