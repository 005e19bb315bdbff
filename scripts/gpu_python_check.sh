#!/usr/bin/env bash
# The Python package's CUDA path on a GPU machine (a step of scripts/gpu_check.sh): installs the
# wheel built beside the GPU programs (DIR/depthkv-*.whl, from scripts/build_gpu_binaries.sh with
# WHEEL_PYTHON set) into a temporary folder and runs python/tests/test_cuda.py with python3 (under
# pytest when it is installed, else alone). Prints "SKIP: <why>" and exits 77 when it cannot run:
# no wheel, no torch with CUDA, or a wheel for another Python version. Exit 0 when every test passed.
#
# Usage: scripts/gpu_python_check.sh DIR
set -u
cd "$(dirname "$0")/.." || exit 2
DIR=${1:?usage: gpu_python_check.sh DIR}
PY=${PYTHON:-python3}
skip() { echo "SKIP: $*"; exit 77; }
command -v "$PY" >/dev/null || skip "no $PY"
WHEEL=$(ls "$DIR"/depthkv-*.whl 2>/dev/null | head -1)
[ -n "$WHEEL" ] || skip "no depthkv wheel in $DIR (build it with WHEEL_PYTHON=... scripts/build_gpu_binaries.sh)"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
  skip "no torch with a CUDA device for $PY"
"$PY" -c 'import numpy' 2>/dev/null || skip "no numpy for $PY"
TAG=$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
case $(basename "$WHEEL") in
  *-"$TAG"-*) ;;
  *) skip "the wheel $(basename "$WHEEL") is not for this Python ($TAG)" ;;
esac
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
"$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$WHEEL" "$SITE" || exit 1
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
cd "$SITE" || exit 2  # import the wheel's depthkv, not the checkout's python/ folder
if "$PY" -c 'import pytest' 2>/dev/null; then
  "$PY" -m pytest -q -p no:cacheprovider -rs "$OLDPWD/python/tests/test_cuda.py" && echo "PASS test_cuda.py (pytest)"
else
  "$PY" "$OLDPWD/python/tests/test_cuda.py"
fi
