"""depthkv.load_profile / save_profile and the Profile object."""

import json
import os

import numpy as np
import pytest

import depthkv
from conftest import AIDREAMS_BEST, RESULTS, STORIES


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(RESULTS) if f.endswith(".profile.json")))
def test_save_gives_the_same_bytes(tmp_path, name):
    src = os.path.join(RESULTS, name)
    out = tmp_path / "copy.profile.json"
    depthkv.save_profile(depthkv.load_profile(src), out)
    with open(src, "rb") as a:
        assert out.read_bytes() == a.read()


def test_properties_match_the_file():
    j = json.load(open(AIDREAMS_BEST))
    p = depthkv.load_profile(AIDREAMS_BEST)
    assert p.n_layers == j["n_layers"] == 4
    assert p.metric == "kl"
    assert p.keep_ratios.tolist() == j["keep_ratios"]
    assert p.scorers == sorted(j["scorers"])
    assert p.model == j["model"]
    assert p.calibration == j["calibration"]
    assert p.selection == j["calibration"]["selection"]
    for s in p.scorers:
        assert p.curves(s).tolist() == j["scorers"][s]["kl"]["mean"]
        assert p.curves(s, metric="dnll", stderr=True).tolist() == j["scorers"][s]["dnll"]["stderr"]
        H = j["scorers"][s]["heads"]["n_kv_heads"]
        assert p.has_head_curves(s) and p.n_kv_heads(s) == H
        hc = p.head_curves(s, metric="top1")
        assert hc.shape == (4, H, len(j["keep_ratios"]))
        rows = j["scorers"][s]["heads"]["top1"]["mean"]  # row l * H + h
        assert hc.reshape(4 * H, -1).tolist() == rows
        assert hc[2, 1].tolist() == rows[2 * H + 1]


def test_curves_are_read_only_views_of_the_profile():
    p = depthkv.load_profile(STORIES)
    c = p.curves("h2o")
    assert c.shape == (5, 6) and not c.flags.writeable
    assert np.shares_memory(c, p.curves("h2o"))  # no copy: both view the profile's matrix
    with pytest.raises(ValueError):
        c[0, 0] = 1.0
    del p  # the view keeps the profile alive
    assert np.isfinite(c).all() and c[0].tolist() == json.load(open(STORIES))["scorers"]["h2o"]["kl"]["mean"][0]


def test_profile_without_head_curves():
    p = depthkv.load_profile(STORIES)
    assert not p.has_head_curves("h2o") and p.n_kv_heads("h2o") is None
    assert "infonce/post_attn" in p.layer_metrics
    with pytest.raises(depthkv.Error, match="no head curves for scorer 'h2o'.*--head-curves"):
        p.head_curves("h2o")


def test_load_errors_name_the_file_and_the_problem(tmp_path):
    with pytest.raises(depthkv.Error, match="cannot open profile file '.*missing.json'"):
        depthkv.load_profile(tmp_path / "missing.json")
    with pytest.raises(depthkv.Error, match="is a directory"):
        depthkv.load_profile(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(depthkv.Error, match="not valid JSON"):
        depthkv.load_profile(bad)
    j = json.load(open(STORIES))
    j["n_layers"] = 6
    bad.write_text(json.dumps(j))
    with pytest.raises(depthkv.Error, match="bad.json"):
        depthkv.load_profile(bad)
    with pytest.raises(depthkv.Error, match="cannot write profile file"):
        depthkv.save_profile(depthkv.load_profile(STORIES), tmp_path / "no" / "such" / "dir.json")


def test_unknown_scorer_and_metric():
    p = depthkv.load_profile(STORIES)
    with pytest.raises(depthkv.Error, match="no measurements for scorer 'tova' \\(it has: h2o, snapkv\\)"):
        p.curves("tova")
    with pytest.raises(depthkv.Error, match="unknown loss metric 'nll'"):
        p.curves("h2o", metric="nll")
