"""Fixtures of the depthkv Python tests: the repository's committed profiles and the depthkv
command-line program (for the identity checks against ``depthkv allocate --json``)."""

import glob
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
