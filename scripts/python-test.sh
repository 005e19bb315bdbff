#!/bin/sh
# Builds the depthkv Python package (pip install .: scikit-build-core + nanobind over the headers)
# into a virtual environment outside the repository and runs its pytest suite (python/tests; each
# test within the time limit of pyproject.toml's pytest options, through pytest-timeout):
# the numpy tests, and the Hugging Face / kvpress tests (test_kvpress.py) with torch, transformers
# and kvpress from python/requirements-hf.txt (a few minutes to download on a fresh environment;
# DEPTHKV_HF_TESTS=0 leaves them out, and they are then skipped). The identity checks run the
# depthkv program: $DEPTHKV_CLI, else build/release/tools/depthkv (what scripts/test.sh builds),
# else it is built here (target depthkv_cli in build/python-cli). With nvcc on PATH the package
# includes its CUDA extension (depthkv._cuda), which test_cuda.py requires then. Environment: DEPTHKV_VENV
# (default /tmp/depthkv-venv; reused when it exists), JOBS (build jobs, default nproc). Each phase
# prints its wall time.
# Needs python3-venv and python3-dev (scripts/install-deps.sh) and PyPI for the build tools.
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="${DEPTHKV_VENV:-/tmp/depthkv-venv}"
JOBS="${JOBS:-$(nproc)}"
T0=$(date +%s)
phase() { echo "python-test.sh: $1 done at $(( $(date +%s) - T0 )) s"; }
case "$VENV" in
  "$ROOT" | "$ROOT"/*) echo "python-test.sh: DEPTHKV_VENV ($VENV) must be outside the repository" >&2; exit 2 ;;
esac
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "scikit-build-core>=0.10" "nanobind>=2.0" numpy pytest \
  pytest-timeout
phase "virtual environment"
if [ "${DEPTHKV_HF_TESTS:-1}" != 0 ]; then
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r python/requirements-hf.txt
  phase "Hugging Face requirements (python/requirements-hf.txt)"
fi
CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
  --no-build-isolation --force-reinstall --no-deps "$ROOT"
phase "package build"
if [ -z "${DEPTHKV_CLI:-}" ]; then
  if [ -x build/release/tools/depthkv ]; then
    DEPTHKV_CLI="$ROOT/build/release/tools/depthkv"
  else
    cmake -S . -B build/python-cli -DCMAKE_BUILD_TYPE=Release -DDEPTHKV_WERROR=ON -DDEPTHKV_ENABLE_CUDA=OFF \
      -DDEPTHKV_BUILD_TESTS=OFF -DDEPTHKV_BUILD_EXAMPLES=OFF -DDEPTHKV_BUILD_BENCHMARKS=OFF >/dev/null
    cmake --build build/python-cli --target depthkv_cli -j "$JOBS"
    DEPTHKV_CLI="$ROOT/build/python-cli/tools/depthkv"
    phase "depthkv program"
  fi
fi
# from outside the checkout, so that `import depthkv` is the installed package; with nvcc on PATH
# the package must have its CUDA extension (python/tests/test_cuda.py checks it)
command -v nvcc >/dev/null 2>&1 && export DEPTHKV_REQUIRE_CUDA_BUILD=1
cd "$VENV"
DEPTHKV_CLI="$DEPTHKV_CLI" DEPTHKV_REQUIRE_CLI=1 DEPTHKV_REQUIRE_HF="${DEPTHKV_HF_TESTS:-1}" "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$ROOT/python/tests"
phase "pytest"
echo "python-test.sh: all Python tests passed"
