"""A profile of another model is refused (depthkv.hf.check_profile_model, used by DepthKVPress and
depthkv.hf.evaluate): a stories260K profile on the aidreams260K model (and the reverse), a
depthkv.hf profile on a model whose weights differ, and the check_model=False opt-out. Needs
torch, transformers and kvpress, as test_kvpress.py."""

import copy

import pytest

from test_kvpress import _model_path, models, peer, prefill, stories  # noqa: F401 (fixtures)

from conftest import need_module  # noqa: E402
torch = need_module("torch")

import depthkv  # noqa: E402
import depthkv.hf  # noqa: E402
from conftest import AIDREAMS_BEST  # noqa: E402
from depthkv.kvpress import DepthKVPress  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

CTX = [1] + list(range(5, 100))
CONT = list(range(100, 116))


@pytest.fixture(scope="module")
def aidreams(peer):  # noqa: F811
    return peer.to_hf(_model_path("aidreams260K"), "sdpa")


@pytest.fixture(scope="module")
def hf_profile(models):  # noqa: F811
    """A depthkv.hf profile of the stories260K conversion (one short window, one ratio)."""
    return depthkv.hf.profile(models["sdpa"], None, [(CTX, CONT)], keep_ratios=(0.5,), scorer="snapkv",
                              name="stories260K-hf")


def test_a_stories_profile_on_aidreams_raises(aidreams, stories):  # noqa: F811
    with pytest.raises(depthkv.Error, match="the profile is of another model: it has 5 layers, the model 4 "
                                            r"\(profile of stories260K.bin\)"):
        prefill(aidreams, CTX, DepthKVPress(stories, keep=0.2))
    with pytest.raises(depthkv.Error, match="it has 5 layers, the model 4"):  # no opt-out from the structure
        prefill(aidreams, CTX, DepthKVPress(stories, keep=0.2, check_model=False))
    with pytest.raises(depthkv.Error, match="the profile is of another model"):
        depthkv.hf.evaluate(aidreams, None, [(CTX, CONT)], DepthKVPress(stories, keep=0.2), (0.2,))


def test_the_right_profiles_apply(aidreams, models, stories):  # noqa: F811
    best = depthkv.load_profile(AIDREAMS_BEST)  # layer and head curves of aidreams260K
    cache = prefill(aidreams, CTX, DepthKVPress(best, keep=0.3, policy="head-optimal", protection=(0, 4)))
    assert len(cache.layers) == 4
    cache = prefill(models["sdpa"], CTX, DepthKVPress(stories, keep=0.3))
    assert len(cache.layers) == 5
    with pytest.raises(depthkv.Error, match="it has 4 layers, the model 5"):
        prefill(models["sdpa"], CTX, DepthKVPress(best, keep=0.3))


def test_a_hf_profile_checks_the_weights(models, hf_profile, tmp_path):  # noqa: F811
    model = models["sdpa"]
    assert hf_profile.model["header_hash"] == depthkv.hf.model_identity(model)[2]
    depthkv.hf.check_profile_model(hf_profile, model)
    cache = prefill(model, CTX, DepthKVPress(hf_profile, keep=0.5))
    assert len(cache.layers) == 5
    model.save_pretrained(tmp_path / "m")  # fills in config fields (architectures, dtype)
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "m", attn_implementation="eager")
    depthkv.hf.check_profile_model(hf_profile, again)  # the same model, saved and loaded
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.model.layers[2].self_attn.v_proj.weight[0, 0] += 0.5
    with pytest.raises(depthkv.Error, match=r"it records stories260K-hf \(blake2b64:[0-9a-f]{16}\), the model "
                                            r"hashes to blake2b64:[0-9a-f]{16} .*check_model=False"):
        prefill(other, CTX, DepthKVPress(hf_profile, keep=0.5))
    cache = prefill(other, CTX, DepthKVPress(hf_profile, keep=0.5, check_model=False))
    assert len(cache.layers) == 5
    r = depthkv.hf.evaluate(other, None, [(CTX, CONT)], DepthKVPress(hf_profile, keep=0.5, check_model=False), (0.5,))
    assert r["kl"][0] > 0
