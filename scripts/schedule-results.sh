#!/usr/bin/env bash
# Bounded KV memory: peak KV bytes against context length (table and plot), chunked against
# oneshot quality, profiles measured under each schedule, and decode-time eviction over a long
# continuation, on stories260K and aidreams260K. Writes docs/results/schedule/* and
# docs/results/schedule.md (+ schedule-peak.svg). Usage: scripts/schedule-results.sh [build dir]
# (DEPTHKV_DATA_DIR: data)
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
for ctx in 256 320 384 448; do
  $DK eval --model "$S" --text "$TEXT" --profile "$SP" --windows 8 --context $ctx --continuation 64 \
    --keeps 0.1,0.2,0.3 --policies uniform --scorers h2o --threads $T --json > "$OUT/peak_s_ctx${ctx}_oneshot.json"
  for ch in 32 64 128; do
    $DK eval --model "$S" --text "$TEXT" --profile "$SP" --windows 8 --context $ctx --continuation 64 \
      --keeps 0.1,0.2,0.3 --policies uniform --scorers h2o --threads $T --json --schedule chunked --chunk $ch \
      > "$OUT/peak_s_ctx${ctx}_chunk${ch}.json"
  done
done

# 1b. the same for aidreams260K (trained context 128: continuation 32, chunks 16/32/64)
AOPT="--sinks 2 --recent 4 --obs-window 4"
for ctx in 64 80 96; do
  $DK eval --model "$A" --text "$TEXT" --profile "$AP" --windows 8 --context $ctx --continuation 32 $AOPT \
    --keeps 0.1,0.2,0.3 --policies uniform --scorers h2o --threads $T --json > "$OUT/peak_a_ctx${ctx}_oneshot.json"
  for ch in 16 32 64; do
    $DK eval --model "$A" --text "$TEXT" --profile "$AP" --windows 8 --context $ctx --continuation 32 $AOPT \
      --keeps 0.1,0.2,0.3 --policies uniform --scorers h2o --threads $T --json --schedule chunked --chunk $ch \
      > "$OUT/peak_a_ctx${ctx}_chunk${ch}.json"
  done
done

# 2. quality: chunked against oneshot at the same final budget, uniform vs optimal (H2O)
$DK eval --model "$S" --text "$TEXT" --profile "$SP" --windows 64 --keeps 0.1,0.2,0.3 --policies uniform,optimal \
  --scorers h2o --threads $T --json > "$OUT/kl_s_oneshot.json"
for ch in 32 64 128; do
  $DK eval --model "$S" --text "$TEXT" --profile "$SP" --windows 64 --keeps 0.1,0.2,0.3 --policies uniform,optimal \
    --scorers h2o --threads $T --json --schedule chunked --chunk $ch > "$OUT/kl_s_chunk${ch}.json"
done
$DK eval --model "$A" --text "$TEXT" --profile "$AP" --windows 128 $AOPT --keeps 0.1,0.2,0.3 --policies uniform,optimal \
  --scorers h2o --threads $T --json > "$OUT/kl_a_oneshot.json"
for ch in 16 32 64; do
  $DK eval --model "$A" --text "$TEXT" --profile "$AP" --windows 128 $AOPT --keeps 0.1,0.2,0.3 --policies uniform,optimal \
    --scorers h2o --threads $T --json --schedule chunked --chunk $ch > "$OUT/kl_a_chunk${ch}.json"
done
OTHER=/usr/share/common-licenses/GPL-3   # non-story English text

# 3. profiles measured under the chunked schedule, against the oneshot profiles, evaluated chunked
$DK profile --model "$S" --text "$TEXT" --context 384 --continuation 128 --windows 24 --scorers h2o \
  --schedule chunked --chunk 64 --threads $T -o "$OUT/stories260K.chunk64.profile.json" > "$OUT/profile_s_chunk64.txt"
for src in story other; do
  if [ $src = story ]; then TX="$TEXT"; NW=64; else TX="$OTHER"; NW=16; fi
  for pf in oneshot chunk64; do
    P=$SP; [ $pf = chunk64 ] && P="$OUT/stories260K.chunk64.profile.json"
    $DK eval --model "$S" --text "$TX" --profile "$P" --windows $NW --keeps 0.1,0.2,0.3 --policies uniform,optimal \
      --scorers h2o --threads $T --json --schedule chunked --chunk 64 > "$OUT/prof_s_${src}_${pf}.json"
  done
done
$DK profile --model "$A" --text "$TEXT" --context 96 --continuation 32 --windows 48 $AOPT --scorers h2o \
  --schedule chunked --chunk 32 --threads $T -o "$OUT/aidreams260K.chunk32.profile.json" > "$OUT/profile_a_chunk32.txt"
for src in story other; do
  if [ $src = story ]; then TX="$TEXT"; NW=128; else TX="$OTHER"; NW=32; fi
  for pf in oneshot chunk32; do
    P=$AP; [ $pf = chunk32 ] && P="$OUT/aidreams260K.chunk32.profile.json"
    $DK eval --model "$A" --text "$TX" --profile "$P" --windows $NW $AOPT --keeps 0.1,0.2,0.3 --policies uniform,optimal \
      --scorers h2o --threads $T --json --schedule chunked --chunk 32 > "$OUT/prof_a_${src}_${pf}.json"
  done
done

# 4. decode-time eviction: a short context and a long teacher-forced continuation
DS="--context 128 --continuation 384 --windows 32 --chunk 64"
$DK eval --model "$S" --text "$TEXT" --profile "$SP" $DS --keeps 0.1,0.2,0.3 --policies uniform,optimal --scorers h2o \
  --threads $T --json --schedule chunked > "$OUT/dec_s_none.json"
for m in 1 8 32 128; do
  $DK eval --model "$S" --text "$TEXT" --profile "$SP" $DS --keeps 0.1,0.2,0.3 --policies uniform,optimal --scorers h2o \
    --threads $T --json --schedule decode --interval $m > "$OUT/dec_s_i$m.json"
done
DA="--context 32 --continuation 96 --windows 64 --chunk 16 $AOPT"
$DK eval --model "$A" --text "$TEXT" --profile "$AP" $DA --keeps 0.1,0.2,0.3 --policies uniform,optimal --scorers h2o \
  --threads $T --json --schedule chunked > "$OUT/dec_a_none.json"
for m in 1 8 32; do
  $DK eval --model "$A" --text "$TEXT" --profile "$AP" $DA --keeps 0.1,0.2,0.3 --policies uniform,optimal --scorers h2o \
    --threads $T --json --schedule decode --interval $m > "$OUT/dec_a_i$m.json"
done

python3 scripts/schedule-table.py "$OUT" docs/results/schedule-peak > docs/results/schedule.md
gnuplot docs/results/schedule-peak.gp
echo "schedule-results: docs/results/schedule.md"
