#!/usr/bin/env bash
# The RULER-style suite's committed figures (docs/results/ruler.md), SmolLM2-135M-Instruct Q4_1,
# report seeds. Needs the depthkv Python package (scripts/python-test.sh builds it into
# $DEPTHKV_VENV, default /tmp/depthkv-venv), the model (scripts/get-models.sh), and for the 4k set
# benchmarks/ruler/requirements.txt (torch, transformers, kvpress, gguf) in that environment.
# Usage: scripts/ruler.sh 2k|4k|gemma4k|retrieval|retrieval8k|gemma-retrieval
#   2k  2048 tokens, seeds 1000-1001, both protocols, depthkv's methods, then span pooling on the
#       same samples (about 5 minutes on 2 cores)
#   4k  4096 tokens, seeds 1000-1001, kvpress's protocol (outside): depthkv's methods on all 7 tasks
#       (15 minutes), TOVA and KeyDiff rows (with a KeyDiff profile) on the 5 needle tasks (10
#       minutes), then kvpress's presses in transformers on the same ids of the 5 needle tasks
#       (50 minutes), then the merged table and plot of the needle tasks
#       (docs/results/ruler/smollm2.4k.outside.{md,svg}); the depthkv file's own table has all 7
#   gemma4k  Gemma 3 270M at 4096 tokens, depthkv's side (10 minutes)
#   retrieval  --preset retrieval: its KL on calibration licence windows, then at 4096 tokens on the
#       5 needle tasks the calibration seeds that chose its floor and the report seeds (23 minutes)
#   retrieval8k  the same on SmolLM2 at 8064 tokens, report seeds (17 minutes)
#   gemma-retrieval  --preset retrieval on Gemma 3 at 4096 tokens, report seeds (10 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${DEPTHKV_VENV:-/tmp/depthkv-venv}/bin/python"
M="${DEPTHKV_MODEL_DIR:-$HOME/.cache/depthkv/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT=docs/results/ruler
mkdir -p "$OUT"
profiles=(--profile docs/results/smollm2.profile.json --best-profile docs/results/smollm2.best.profile.json)
case "${1:-}" in
2k)
  common=(--model "$M" --lengths 2048 --samples 2 --compressions 0.5,0.75 "${profiles[@]}")
  for proto in outside inside; do
    "$PY" benchmarks/ruler/run.py "${common[@]}" --protocol $proto --tasks niah_single_1,niah_single_2,vt \
      --methods full,snapkv,optimal,preset --out "$OUT/smollm2.2k.$proto.json" > /dev/null
    "$PY" benchmarks/ruler/run.py "${common[@]}" --protocol $proto --tasks niah_single_1,niah_single_2 \
      --methods snapkv-span,preset-span --out "$OUT/smollm2.2k.$proto.span.json" > /dev/null
    "$PY" benchmarks/ruler/report.py --no-plot --out "$OUT/smollm2.2k.$proto.table" "$OUT/smollm2.2k.$proto.json" \
      "$OUT/smollm2.2k.$proto.span.json"
  done ;;
4k)
  "$PY" benchmarks/ruler/run.py --model "$M" --lengths 4096 --samples 2 "${profiles[@]}" --protocol outside \
    --methods full,snapkv,snapkv-span,optimal,preset,preset-span --out "$OUT/smollm2.4k.outside.depthkv.json" > /dev/null
  # the scorers' rows on the needle tasks: TOVA and KeyDiff with uniform budgets, KeyDiff with
  # depthkv's budgets from KeyDiff curves measured as smollm2.profile.json's SnapKV curves
  # (scripts/main-job.sh: licence windows 0..5, 384 + 128 tokens; 5-10 minutes)
  niah=niah_single_1,niah_single_2,niah_multikey_1,niah_multivalue,niah_multiquery
  L=/usr/share/common-licenses
  lic="$(mktemp -d)/licenses.txt"
  cat "$L/GPL-3" "$L/Apache-2.0" "$L/MPL-2.0" "$L/GFDL-1.3" "$L/LGPL-2.1" "$L/Artistic" > "$lic"
  "${DK:-build/release/tools/depthkv}" profile --model "$M" --text "$lic" --doc-separator '' --context 384 \
    --continuation 128 --windows 6 --scorers keydiff --ratios 0.1,0.2,0.3,0.5 \
    -o docs/results/smollm2.keydiff.profile.json > docs/results/smollm2.keydiff.profile.txt
  "$PY" benchmarks/ruler/run.py --model "$M" --lengths 4096 --samples 2 --protocol outside --tasks $niah \
    --methods tova,keydiff,keydiff-optimal --profile docs/results/smollm2.keydiff.profile.json \
    --out "$OUT/smollm2.4k.outside.scorers.json" > /dev/null
  # kvpress: the 5 needle tasks (SmolLM2's full cache scores 0 on vt and cwe), 8 presses (about
  # 9 s per row on 2 threads: 50 minutes)
  "$PY" benchmarks/ruler/kvpress_run.py --model "$M" --lengths 4096 --samples 2 --protocol outside --tasks $niah \
    --presses snapkv,tova,keydiff,expected-attention,adakv,pyramidkv,streamingllm,depthkv \
    --profile docs/results/smollm2.profile.json --out "$OUT/smollm2.4k.outside.kvpress.json" > /dev/null
  "$PY" benchmarks/ruler/report.py --tasks $niah --out "$OUT/smollm2.4k.outside" "$OUT/smollm2.4k.outside.depthkv.json" \
    "$OUT/smollm2.4k.outside.scorers.json" "$OUT/smollm2.4k.outside.kvpress.json" ;;
gemma4k)
  # Gemma 3 270M at 4096 tokens, depthkv's side, all 7 tasks (profiles: scripts/gemma3-profiles.sh;
  # about 10 minutes on 2 cores). Its 15 local layers hold at most 511 slots: at 4K the model holds
  # 27% of a naive full cache, so compressions up to 0.73 keep all it holds.
  G="${DEPTHKV_MODEL_DIR:-$HOME/.cache/depthkv/models}/gemma-3-270m-q4_k_m.gguf"
  "$PY" benchmarks/ruler/run.py --model "$G" --lengths 4096 --samples 2 --protocol outside \
    --profile docs/results/gemma3.profile.json --best-profile docs/results/gemma3.best.profile.json \
    --methods full,snapkv,tova,keydiff,optimal,preset --out "$OUT/gemma3.4k.outside.depthkv.json" > /dev/null ;;
retrieval)
  # --preset retrieval on SmolLM2 at 4K, kvpress's protocol, the 5 needle tasks (its profile:
  # scripts/main-job.sh step 8). First the calibration seeds 0-1, where its floor was chosen (0,
  # 0.25, 0.5 = the preset, 0.75; 10 minutes), then the report seeds 1000-1001 (8 minutes).
  niah=niah_single_1,niah_single_2,niah_multikey_1,niah_multivalue,niah_multiquery
  r=(--model "$M" --lengths 4096 --samples 2 --protocol outside --tasks $niah --profile docs/results/smollm2.profile.json
     --best-profile docs/results/smollm2.best.profile.json --retrieval-profile docs/results/smollm2.retrieval.profile.json)
  L=/usr/share/common-licenses
  lic="$(mktemp -d)/licenses.txt"
  cat "$L/GPL-3" "$L/Apache-2.0" "$L/MPL-2.0" "$L/GFDL-1.3" "$L/LGPL-2.1" "$L/Artistic" > "$lic"
  # its KL on calibration licence windows 18..29 (disjoint from the profile's 0..5 and the main
  # job's held-out 6..17; 1 minute)
  "${DK:-build/release/tools/depthkv}" eval --model "$M" --text "$lic" --doc-separator '' --windows 12 --skip 18 \
    --keeps 0.1,0.2,0.3 --profile docs/results/smollm2.retrieval.profile.json --preset retrieval \
    > "$OUT/retrieval.calibration-kl.txt"
  "$PY" benchmarks/ruler/run.py "${r[@]}" --seeds calibration \
    --methods full,snapkv-keydiff,preset,retrieval,retrieval-f0,retrieval-f0.25,retrieval-f0.75 \
    --out "$OUT/smollm2.4k.outside.calibration.retrieval.json" > /dev/null
  "$PY" benchmarks/ruler/run.py "${r[@]}" --methods full,snapkv-keydiff,preset,retrieval \
    --out "$OUT/smollm2.4k.outside.retrieval.json" > /dev/null
  for f in calibration.retrieval retrieval; do
    "$PY" benchmarks/ruler/report.py --no-plot --out "$OUT/smollm2.4k.outside.$f.table" "$OUT/smollm2.4k.outside.$f.json"
  done ;;
retrieval8k)
  # --preset retrieval on SmolLM2 at 8064 tokens (8K less room for the question and the answer in
  # its 8192-token context), report seeds, the 5 needle tasks (17 minutes)
  "$PY" benchmarks/ruler/run.py --model "$M" --lengths 8064 --samples 2 --protocol outside \
    --tasks niah_single_1,niah_single_2,niah_multikey_1,niah_multivalue,niah_multiquery \
    --best-profile docs/results/smollm2.best.profile.json --retrieval-profile docs/results/smollm2.retrieval.profile.json \
    --methods full,snapkv-keydiff,preset,retrieval --out "$OUT/smollm2.8k.outside.retrieval.json" > /dev/null
  "$PY" benchmarks/ruler/report.py --no-plot --out "$OUT/smollm2.8k.outside.retrieval.table" "$OUT/smollm2.8k.outside.retrieval.json" ;;
gemma-retrieval)
  # --preset retrieval on Gemma 3 270M at 4096 tokens, report seeds, the 5 needle tasks (its floor
  # was chosen on SmolLM2's calibration seeds; profiles: scripts/gemma3-profiles.sh; 10 minutes)
  G="${DEPTHKV_MODEL_DIR:-$HOME/.cache/depthkv/models}/gemma-3-270m-q4_k_m.gguf"
  "$PY" benchmarks/ruler/run.py --model "$G" --lengths 4096 --samples 2 --protocol outside \
    --tasks niah_single_1,niah_single_2,niah_multikey_1,niah_multivalue,niah_multiquery \
    --best-profile docs/results/gemma3.best.profile.json --retrieval-profile docs/results/gemma3.retrieval.profile.json \
    --methods full,snapkv-keydiff,preset,retrieval --out "$OUT/gemma3.4k.outside.retrieval.json" > /dev/null
  "$PY" benchmarks/ruler/report.py --no-plot --out "$OUT/gemma3.4k.outside.retrieval.table" "$OUT/gemma3.4k.outside.retrieval.json" ;;
*) echo "usage: scripts/ruler.sh 2k|4k|gemma4k|retrieval|retrieval8k|gemma-retrieval" >&2; exit 2 ;;
esac
