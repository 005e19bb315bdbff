"""Fixtures of the depthkv Python tests: the repository's committed profiles, the real data of
../shared and the models of scripts/get-models.sh, and the depthkv command-line program (for the
identity checks against ``depthkv allocate --json``).

A missing data or model file FAILS the test with a message naming the path and what provides it,
unless DEPTHKV_SKIP_MISSING_DATA=1 is set, which skips the test: the rule of the C++ tests
(tests/support/test_data.hpp, tests/support/model_data.hpp)."""

import glob
import importlib
import os
import shutil
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RESULTS = os.path.join(ROOT, "docs", "results")
#: layer curves only (h2o, snapkv) and InfoNCE scores; measured with sinks=4 recent=16 obs_window=16
STORIES = os.path.join(RESULTS, "stories260K.profile.json")
#: layer and head curves (h2o, snapkv), no InfoNCE; measured with sinks=0 recent=4 obs_window=4
AIDREAMS_BEST = os.path.join(RESULTS, "aidreams260K.best.profile.json")
#: the real models and text: $DEPTHKV_DATA_DIR, else the shared/ folder beside the checkout
DATA = os.environ.get("DEPTHKV_DATA_DIR") or os.path.join(ROOT, "..", "shared")
#: the models scripts/get-models.sh fetches: $DEPTHKV_MODEL_DIR, else ~/.cache/depthkv/models
MODEL_DIR = os.environ.get("DEPTHKV_MODEL_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "depthkv", "models")


def require_file(path, what, hint):
    """``path`` when the file exists; else fails naming ``what`` and ``hint`` (what provides it), or
    with DEPTHKV_SKIP_MISSING_DATA=1 skips the test."""
    if not os.path.isfile(path):
        if os.environ.get("DEPTHKV_SKIP_MISSING_DATA") == "1":
            pytest.skip(f"{what} missing: {path}")
        pytest.fail(f"{what} missing: {path} ({hint}; DEPTHKV_SKIP_MISSING_DATA=1 skips such tests)", pytrace=False)
    return path


def data_path(rel):
    """The file ``rel`` (e.g. "models/stories260K/stories260K.bin") of the data folder, which must exist."""
    return require_file(os.path.join(DATA, rel), "real data file",
                        "put the shared/ folder beside the project or set DEPTHKV_DATA_DIR")


def model_path(name):
    """The model file ``name`` (e.g. "SmolLM2-135M-Instruct.Q4_1.gguf") of MODEL_DIR, which must exist."""
    return require_file(os.path.join(MODEL_DIR, name), "real model file", "run scripts/get-models.sh, which fetches it "
                        "into $DEPTHKV_MODEL_DIR or ~/.cache/depthkv/models")


def need_module(name):
    """The module ``name`` (torch, transformers, kvpress); the test module is skipped when it is not
    installed, unless DEPTHKV_REQUIRE_HF=1, which makes its absence an import error."""
    if os.environ.get("DEPTHKV_REQUIRE_HF") == "1":
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=f"{name} is not installed (pip install -r python/requirements-hf.txt)")


def find_cli():
    """$DEPTHKV_CLI, else the depthkv program of a build folder of this checkout (build/*/tools/depthkv)."""
    env = os.environ.get("DEPTHKV_CLI")
    if env:
        return env
    found = sorted(glob.glob(os.path.join(ROOT, "build", "*", "tools", "depthkv")), key=os.path.getmtime)
    return found[-1] if found else shutil.which("depthkv")


@pytest.fixture(scope="session")
def cli():
    path = find_cli()
    if not path or not os.access(path, os.X_OK):
        msg = ("no depthkv program: build target depthkv_cli (cmake --build build/release --target depthkv_cli) "
               "or set DEPTHKV_CLI")
        if os.environ.get("DEPTHKV_REQUIRE_CLI") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def run_cli(cli, *args):
    """Runs the program; returns (exit status, stdout, stderr)."""
    r = subprocess.run([cli, *args], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr
