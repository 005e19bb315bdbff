#!/usr/bin/env bash
# `--preset best` on data it was not chosen on: the evaluation windows of the main results
# (TinyStories, after the calibration windows) and a licence text (GPL-3, another kind of text),
# for both models, against depthkv's uniform budgets (plain SnapKV, and the preset's own scorers:
# SnapKV and H2O with output-aware scores; the change is against the one the preset chose for the
# cell). The preset's curves
# are the main profiles' calibration windows measured under its setting
# (docs/results/<model>.best.profile.json, from scripts/main-job.sh). Writes
# docs/results/preset-heldout.md.
# Usage: scripts/preset-heldout.sh [build dir] (DEPTHKV_DATA_DIR: data folder)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
DK="$BUILD/tools/depthkv"
DATA=${DEPTHKV_DATA_DIR:-../shared}
WORK=${TMPDIR:-/tmp}/depthkv-preset-heldout
mkdir -p "$WORK"
TEXT="$DATA/text/tinystories_valid.txt"
OTHER=/usr/share/common-licenses/GPL-3
KEEP=0.1,0.2,0.3,0.5

# name, model, main profile, windows on stories, windows on GPL-3, selection flags
check() {
  local name=$1 model=$2 plain=$3 ws=$4 wo=$5
  shift 5
  local own="docs/results/$name.best.profile.json"
  for src in stories other; do
    local text=$TEXT win=$ws
    [[ $src == other ]] && text=$OTHER win=$wo
    $DK eval --model "$model" --text "$text" --profile "$plain" --windows "$win" "$@" --scorers snapkv \
      --policies uniform --keeps $KEEP --csv "$WORK/$name.$src.plain.csv" > /dev/null 2>&1
    $DK eval --model "$model" --text "$text" --profile "$own" --windows "$win" "$@" --scorers snapkv,h2o \
      --output-aware --lookahead 32 --policies uniform --keeps $KEEP --csv "$WORK/$name.$src.oa.csv" > /dev/null 2>&1
    $DK eval --model "$model" --text "$text" --profile "$own" --windows "$win" "$@" --scorers snapkv,h2o \
      --output-aware --lookahead 0 --policies uniform --keeps $KEEP --csv "$WORK/$name.$src.oa0.csv" > /dev/null 2>&1
    $DK eval --model "$model" --text "$text" --profile "$own" --windows "$win" "$@" --preset best --keeps $KEEP \
      --csv "$WORK/$name.$src.best.csv" > /dev/null 2>&1
  done
}

check stories260K "$DATA/models/stories260K/stories260K.bin" docs/results/stories260K.profile.json 64 16
check aidreams260K "$DATA/models/aidreams260K/aidreams260K.bin" docs/results/aidreams260K.profile.json 128 16 \
  --sinks 0 --recent 4 --obs-window 4

python3 - "$WORK" > docs/results/preset-heldout.md <<'EOF'
import csv, os, sys
d = sys.argv[1]
def kl(path):  # (scorer, keep) -> (KL, standard error, scorer)
    with open(path) as f:
        return {(r["scorer"], float(r["keep"])): (float(r["kl"]), float(r["kl_stderr"]), r["scorer"])
                for r in csv.DictReader(f)}
print("# `--preset best` on held-out data\n")
print("Written by `scripts/preset-heldout.sh`. Mean KL(full || pruned) +- standard error over the windows. "
      "Story text: the main results' evaluation windows (stories260K 24..87 of 384 + 128 tokens, aidreams260K "
      "48..175 of 96 + 32); other text: 16 windows of `/usr/share/common-licenses/GPL-3` (same sizes). "
      "`--preset best` reads curves measured under its setting on the main profiles' calibration windows "
      "(`docs/results/<model>.best.profile.json`) and picks per keep the output-aware scorer (SnapKV or H2O) "
      "of the lower predicted loss (in brackets), both observing the model's next 32 greedy tokens (`--lookahead 32`). "
      "The change is against uniform budgets with the scorer it chose (with and without the lookahead), and "
      "against plain SnapKV uniform. Every row uses the preset's protection (`docs/results/protection.md`): "
      "stories260K --sinks 4 --recent 16 --obs-window 16, aidreams260K --sinks 0 --recent 4 --obs-window 4. "
      "The story windows here are the evaluation windows, which several revisions of the preset were scored on; "
      "the same rows on windows no revision has seen: `untouched.md` (window sets: `windows.md`).\n")
for name in ("stories260K", "aidreams260K"):
    for src, label in (("stories", "story text"), ("other", "GPL-3")):
        plain = kl(os.path.join(d, f"{name}.{src}.plain.csv"))
        oa = kl(os.path.join(d, f"{name}.{src}.oa.csv"))
        oa0 = kl(os.path.join(d, f"{name}.{src}.oa0.csv"))
        best = {k: v for (_, k), v in kl(os.path.join(d, f"{name}.{src}.best.csv")).items()}
        keeps = sorted(best)
        print(f"## {name}, {label}\n")
        print("| method | " + " | ".join(f"keep {k:g}" for k in keeps) + " |")
        print("|---|" + "---|" * len(keeps))
        cell = lambda v: f"{v[0]:.5f} +- {v[1]:.5f}"
        print("| snapkv uniform | " + " | ".join(cell(plain[("snapkv", k)]) for k in keeps) + " |")
        for sc in ("snapkv", "h2o"):
            print(f"| {sc} + output-aware, uniform | " + " | ".join(cell(oa0[(sc, k)]) for k in keeps) + " |")
            print(f"| {sc} + output-aware + lookahead 32, uniform | " + " | ".join(cell(oa[(sc, k)]) for k in keeps) + " |")
        print("| --preset best | " + " | ".join(f"{cell(best[k])} ({best[k][2]})" for k in keeps) + " |")
        print("| best vs uniform, the scorer it chose | " + " | ".join(
            f"{100 * (best[k][0] / oa[(best[k][2], k)][0] - 1):+.0f}%" for k in keeps) + " |")
        print("| best vs uniform, the scorer it chose without lookahead | " + " | ".join(
            f"{100 * (best[k][0] / oa0[(best[k][2], k)][0] - 1):+.0f}%" for k in keeps) + " |")
        print("| best vs snapkv uniform | " + " | ".join(
            f"{100 * (best[k][0] / plain[('snapkv', k)][0] - 1):+.0f}%" for k in keeps) + " |")
        print()
EOF
echo "preset-heldout: docs/results/preset-heldout.md"
