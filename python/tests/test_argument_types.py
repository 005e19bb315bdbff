"""Arguments of the wrong Python type are refused with depthkv.Error naming the parameter (never a
bare TypeError/ValueError of a conversion, nor nanobind's "incompatible function arguments"): the
cases fuzz/python_sweep.py found refused by Python's own conversions."""

import os

import numpy as np
import pytest

import depthkv
from conftest import STORIES


@pytest.fixture(scope="module")
def profile():
    return depthkv.load_profile(STORIES)


@pytest.mark.parametrize("call, names", [
    (lambda p: depthkv.load_profile(None), "load_profile: path"),
    (lambda p: depthkv.load_profile({"a": 1}), "load_profile: path"),
    (lambda p: depthkv.save_profile(p, 3), "save_profile: path"),
    (lambda p: depthkv.allocate(p, keep="0.2x"), "keep must be a number"),
    (lambda p: depthkv.allocate(p, keep={}), "keep must be a number"),
    (lambda p: depthkv.allocate(p, keep=0.2, scorer=3), "allocate: scorer"),
    (lambda p: depthkv.allocate(p, keep=0.2, policy=None), "allocate: policy"),
    (lambda p: depthkv.preset("best", p, keep=0.2, kernel="x"), "preset: kernel"),
    (lambda p: depthkv.preset(7, p, keep=0.2), "preset: name"),
    (lambda p: depthkv.keep_tokens("a", 10), "keep_tokens: ratio"),
    (lambda p: depthkv.keep_tokens(0.5, "x"), "keep_tokens: n"),
    (lambda p: depthkv.select_keep({"s": 1}, 1), "scores must be an array"),
    (lambda p: depthkv.select_keep(np.array([1, "a"], dtype=object), 1), "scores must hold numbers"),
    (lambda p: depthkv.TokenScorer("h2o", 2).scores(n={}), "TokenScorer.scores: n"),
    (lambda p: depthkv.TokenScorer("h2o", 2).observe("probs"), "probs must be an array"),
    (lambda p: depthkv.Engine(5), "Engine: path"),
    (lambda p: depthkv.Engine("m.gguf", n_threads="x"), "Engine: n_threads"),
    (lambda p: depthkv.Engine("m.gguf", chunk=1.5), "Engine: chunk"),
    (lambda p: depthkv.Engine("m.gguf", kv_type=16), "Engine: kv_type"),
])
def test_wrong_types_raise_depthkv_error(profile, call, names):
    with pytest.raises(depthkv.Error, match=names):
        call(profile)


def test_paths_and_numeric_strings_still_work(profile, tmp_path):
    out = tmp_path / "p.json"
    depthkv.save_profile(profile, out)                                   # an os.PathLike
    assert depthkv.load_profile(os.fspath(out)).n_layers == profile.n_layers
    a = depthkv.allocate(profile, keep="0.2")                            # a numeric string, as float() takes it
    assert int(a.budgets.sum()) == int(depthkv.allocate(profile, keep=0.2).budgets.sum())
    assert depthkv.keep_tokens(np.float32(0.5), np.int64(100), (0, 0)) == 50
