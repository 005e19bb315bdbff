#!/usr/bin/env bash
# Renders every gnuplot script of docs/results/ to PNG (pngcairo, same size, same text mode) for
# looking at the plots before committing them: each .gp is run with its svg terminal and output
# replaced, from the folder it is meant to run in (the repository root, or docs/results for
# kvpress_peer.gp, which names its files without a folder).
# Usage: scripts/plots-png.sh [out dir, default /tmp/depthkv-plots]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/depthkv-plots}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
for gp in docs/results/*.gp; do
  base=$(basename "$gp"); base=${base%.gp}; base=${base%.svg}
  dir=.
  grep -q "^set output 'docs/results/\|^set output \"docs/results/" "$gp" || dir=docs/results
  sed -e "s|^set terminal svg \(.*\)|set terminal pngcairo \1|" -e "s| dynamic||" \
      -e "s|^set output .*|set output '$OUT/$base.png'|" "$gp" > "$OUT/$base.png.gp"
  (cd "$dir" && gnuplot "$OUT/$base.png.gp")
  echo "plots-png: $OUT/$base.png"
done
