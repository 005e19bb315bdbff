"""40 seeded cases of fuzz/python_sweep.py (the Python API under bad input, #45 item 2): no crash, no
hang, and no wrong / refused-valid / partial outcome outside the bugs the sweep records
(python_sweep.KNOWN); the classifier can fail (its synthetic cases); and each recorded bug still
reproduces (a strict xfail: once one is fixed, remove its KNOWN entry).

Needs torch, transformers and kvpress (python/requirements-hf.txt) and the stories260K model of the
data folder; skipped without them, unless DEPTHKV_REQUIRE_HF=1, which makes a missing one an error."""

import importlib.util
import os
import sys

import numpy as np
import pytest


from conftest import need_module  # noqa: E402

torch = need_module("torch")
need_module("transformers")
need_module("kvpress")

import depthkv  # noqa: E402
from conftest import ROOT, data_path  # noqa: E402

#: the sweep's seed and case count here (the full run: 1,000 cases, fuzz/results/python_sweep.md)
SEED, CASES = int(os.environ.get("DEPTHKV_SWEEP_SEED", "45")), 40


@pytest.fixture(scope="module")
def sweep():
    data_path("models/stories260K/stories260K.bin")  # fails (or skips) with the data rule's message
    path = os.path.join(ROOT, "fuzz", "python_sweep.py")
    spec = importlib.util.spec_from_file_location("python_sweep", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["python_sweep"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_forty_cases(sweep):
    results = sweep.sweep(SEED, list(range(CASES)), jobs=2, timeout=60, progress=False)
    assert len(results) == CASES
    classes = {x["cls"] for x in results}
    assert "build-error" not in classes, [x for x in results if x["cls"] == "build-error"]
    assert not classes & {"crash", "hang"}, [x for x in results if x["cls"] in ("crash", "hang")]
    new = [x for x in results if x["cls"] in sweep.BAD and not x.get("known")]
    assert not new, "\n".join(f"#{x['index']} {x.get('entry')}/{x.get('mutation')}: {x['cls']}: {x.get('why')} "
                              f"(replay: python fuzz/python_sweep.py --seed {SEED} --replay {x['index']})" for x in new)
    # the sample reaches the valid controls and the refusals, not only one of them
    assert {"clean", "success"} <= classes


def test_classifier_can_fail(sweep):
    """Synthetic cases: an accepted bad input, a refused valid one, a failed property, an unnamed
    message, a foreign exception, a changed object, an abort and a sleep are each classified so."""
    assert sweep.self_check(timeout=10, jobs=2) == []


def _press_partial():
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    import depthkv.hf
    from depthkv.kvpress import DepthKVPress
    torch.manual_seed(0)
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=512, head_dim=16)
    model = LlamaForCausalLM(cfg).eval()
    prof = depthkv.hf.profile(model, None, [(list(range(1, 65)), [2, 3, 4, 5])], keep_ratios=(0.2, 0.5, 0.8),
                              protection=(2, 6))
    press, cache = DepthKVPress(prof, 0.5, protection=(2, 6)), DynamicCache()
    with pytest.raises(depthkv.Error):
        with torch.no_grad(), press(model):
            model.model(input_ids=torch.tensor([[1, 2, 3]]), past_key_values=cache)
    assert cache.get_seq_length() == 0, "the refused prefill left the cache partly filled"


def _raises_named(fn, *words):
    try:
        fn()
    except depthkv.Error as e:
        assert any(w in str(e) for w in words), str(e)
        return
    raise AssertionError("accepted")


KNOWN_BUGS = {}

#: bugs the sweep found and that are fixed: their reproducers must keep passing
FIXED_BUGS = {
    "B1": lambda: _raises_named(lambda: depthkv.TokenScorer("h2o", n_heads=2**31, n_kv_heads=1), "n_heads"),
    "B3": lambda: depthkv.select_keep(np.ones((0, 5), np.float32), 1),
    "B4": lambda: _raises_named(lambda: depthkv.TokenScorer("knorm", 2, 1).scores(
        keys=np.full((1, 3, 4), np.nan, np.float32)), "NaN", "nan", "finite"),
    "B8": lambda: _raises_named(lambda: depthkv.TokenScorer("knorm", 2, 1).scores(
        keys=torch.ones(1, 3, 4, device="meta")), "device 'meta'"),
    "B2": lambda: _raises_named(lambda: depthkv.allocate(os.path.join(ROOT, "docs", "results",
                                                                      "stories260K.profile.json"), 0.3), "profile"),
    "B5": _press_partial,
    "B6": lambda: _raises_named(lambda: __import__("depthkv.kvpress", fromlist=["DepthKVPress"]).DepthKVPress(
        depthkv.load_profile(os.path.join(ROOT, "docs", "results", "stories260K.profile.json")), 0.3, protection=4),
        "protection"),
}


@pytest.mark.parametrize("bug", sorted(FIXED_BUGS))
def test_fixed_bug_stays_fixed(sweep, bug):
    FIXED_BUGS[bug]()


@pytest.mark.parametrize("bug", sorted(KNOWN_BUGS))
@pytest.mark.xfail(strict=True, reason="a bug the sweep found (python_sweep.KNOWN); fixed: remove its entry")
def test_known_bug_fixed(sweep, bug):
    KNOWN_BUGS[bug]()
