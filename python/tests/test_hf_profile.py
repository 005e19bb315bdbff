"""depthkv.hf.profile on the Hugging Face conversion of stories260K against `depthkv profile` on the
same token windows (layer and head curves, same scorer, protection and ratios), activation reuse,
the written profile, and bad input. Needs torch and transformers (python/requirements-hf.txt) and the
depthkv program ($DEPTHKV_CLI)."""

import json
import os

import numpy as np
import pytest

from test_kvpress import _load_peer, _model_path

from conftest import need_module  # noqa: E402
torch = need_module("torch")
need_module("transformers")

import depthkv  # noqa: E402
import depthkv.hf  # noqa: E402
from conftest import STORIES, data_path, run_cli  # noqa: E402

#: a short run: one window after the committed profile's 24 calibration windows, two ratios
SKIP, RATIOS = 24, (0.1, 0.3)
#: relative tolerance per point of the KL curves (the issue's 2%)
REL = 0.02


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(2)
    return _load_peer().to_hf(_model_path("stories260K"), "sdpa")


@pytest.fixture(scope="module")
def cli_run(cli, tmp_path_factory):
    """`depthkv profile` (snapkv, layer and head curves) and `depthkv eval --windows-out` on window SKIP."""
    d = tmp_path_factory.mktemp("hfprof")
    bin_path = _model_path("stories260K")
    common = ["--model", bin_path, "--text", data_path("text/tinystories_valid.txt"), "--windows", "1",
              "--skip", str(SKIP), "--threads", "2"]
    # the engine's OpenMP regions spin while they wait by default, which on a busy machine (CI) makes
    # the profile run ~10x slower; the results do not depend on it
    old = os.environ.get("OMP_WAIT_POLICY")
    os.environ["OMP_WAIT_POLICY"] = "passive"
    try:
        rc, _, err = run_cli(cli, "eval", *common, "--profile", STORIES, "--windows-out", str(d / "w.json"))
        assert rc == 0, err
        rc, _, err = run_cli(cli, "profile", *common, "--scorers", "snapkv", "--ratios", ",".join(map(str, RATIOS)),
                             "--head-curves", "-o", str(d / "cli.json"))
        assert rc == 0, err
    finally:
        if old is None:
            del os.environ["OMP_WAIT_POLICY"]
        else:
            os.environ["OMP_WAIT_POLICY"] = old
    return str(d / "w.json"), depthkv.load_profile(d / "cli.json")


@pytest.fixture(scope="module")
def hf_run(model, cli_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("hfprof") / "hf.profile.json"
    prof = depthkv.hf.profile(model, None, cli_run[0], keep_ratios=RATIOS, scorer="snapkv", head_curves=True,
                              name="stories260K-hf", output=out)
    return prof, out


def rel_diff(a, b):
    return np.abs(a - b) / np.abs(b)


def test_curves_equal_the_cli(hf_run, cli_run):
    prof, ref = hf_run[0], cli_run[1]
    assert prof.keep_ratios.tolist() == ref.keep_ratios.tolist()
    assert prof.calibration["selection"] == ref.calibration["selection"]
    assert (prof.calibration["context"], prof.calibration["continuation"]) == (384, 128)
    layer = rel_diff(prof.curves("snapkv"), ref.curves("snapkv"))
    heads = rel_diff(prof.head_curves("snapkv"), ref.head_curves("snapkv"))
    assert layer.max() < REL, layer
    assert heads.max() < REL, heads
    assert np.array_equal(prof.curves("snapkv", "top1"), ref.curves("snapkv", "top1"))
    for policy in ("optimal", "head-optimal"):  # the same budgets from either profile
        a = depthkv.allocate(prof, keep=0.2, policy=policy, scorer="snapkv")
        b = depthkv.allocate(ref, keep=0.2, policy=policy, scorer="snapkv")
        assert a.to_dict()["total"] == b.to_dict()["total"]
        assert np.array_equal(a.budgets, b.budgets) and (a.heads is None or np.array_equal(a.heads, b.heads))


def test_written_file_loads_and_names_the_model(hf_run, model):
    prof, path = hf_run
    again = depthkv.load_profile(path)
    assert again.to_json() == prof.to_json()
    j = json.loads(prof.to_json())
    assert j["model"]["file"] == "stories260K-hf" and j["model"]["header_hash"].startswith("blake2b64:")
    ident = depthkv.hf.model_identity(model, "stories260K-hf")
    assert (ident[1], ident[2]) == (j["model"]["size"], j["model"]["header_hash"])
    with torch.no_grad():
        w = model.model.layers[0].mlp.up_proj.weight
        old = w[0, 0].item()
        w[0, 0] = old + 1.0
        try:
            assert depthkv.hf.model_identity(model, "stories260K-hf")[2] != ident[2]  # the weights are hashed
        finally:
            w[0, 0] = old
    assert depthkv.hf.model_identity(model, "stories260K-hf")[2] == ident[2]


def test_reuse_equals_full_recomputation(model, cli_run):
    kw = dict(keep_ratios=(0.1,), scorer="h2o", name="m")
    a = depthkv.hf.profile(model, None, cli_run[0], reuse=True, **kw)
    b = depthkv.hf.profile(model, None, cli_run[0], reuse=False, **kw)
    np.testing.assert_allclose(a.curves("h2o"), b.curves("h2o"), rtol=1e-6, atol=1e-12)
    assert (a.curves("h2o") > 0).all()


def test_windows_from_texts():
    def tok(text):  # a character tokenizer with BOS
        return {"input_ids": [1] + [3 + ord(c) % 50 for c in text]}
    ws = depthkv.hf.windows_from_texts(tok, ["abcdefg", "hijklmnop"], context=3, continuation=2, n_windows=2, skip=1)
    ids = [1] + [3 + ord(c) % 50 for c in "abcdefg"] + [1] + [3 + ord(c) % 50 for c in "hijklmnop"]
    assert ws == [(ids[5:8], ids[8:10]), (ids[10:13], ids[13:15])]
    with pytest.raises(depthkv.Error, match="the texts hold 18 tokens"):
        depthkv.hf.windows_from_texts(tok, ["abcdefg", "hijklmnop"], context=3, continuation=2, n_windows=4)


def test_bad_input(model):
    w = [([1] + [5] * 40, [6] * 8)]
    with pytest.raises(depthkv.Error, match="keep_ratios must be strictly ascending in \\(0, 1\\)"):
        depthkv.hf.profile(model, None, w, keep_ratios=(0.5, 1.5))
    with pytest.raises(depthkv.Error, match="unknown scorer kind 'snap'"):
        depthkv.hf.profile(model, None, w, scorer="snap")
    with pytest.raises(depthkv.Error, match="texts need a tokenizer"):
        depthkv.hf.profile(model, None, "Once upon a time")
    with pytest.raises(depthkv.Error, match="outside the vocabulary"):
        depthkv.hf.profile(model, None, [([1, 99999], [2, 3])])
    with pytest.raises(depthkv.Error, match="unknown loss metric"):
        depthkv.hf.profile(model, None, w, keep_ratios=(0.5,), metric="nll")


def test_command_line(model, cli_run, tmp_path, capsys):
    """python -m depthkv.hf profile (its main(), in this process)."""
    model.save_pretrained(tmp_path / "m")
    out = tmp_path / "cli.profile.json"
    args = ["profile", "--model", str(tmp_path / "m"), "--windows-file", cli_run[0], "--scorers", "h2o", "--device",
            "cpu", "--name", "m", "-o", str(out)]
    assert depthkv.hf.main(args + ["--ratios", "0.3"]) == 0
    cap = capsys.readouterr()
    assert "depthkv.hf.profile h2o: 5/5 runs" in cap.err and "profile written to" in cap.out
    api = depthkv.hf.profile(model, None, cli_run[0], keep_ratios=(0.3,), scorer="h2o")
    np.testing.assert_allclose(depthkv.load_profile(out).curves("h2o"), api.curves("h2o"), rtol=1e-6)
    assert depthkv.load_profile(out).model["file"] == "m"
    assert depthkv.hf.main(args + ["--ratios", "1.5"]) == 1
    assert "depthkv.hf: error: " in capsys.readouterr().err


def test_the_profile_drives_depthkv_press(hf_run, model, cli_run):
    from depthkv.kvpress import DepthKVPress
    from transformers import DynamicCache
    prof = hf_run[0]
    ctx = depthkv.hf.load_windows(cli_run[0])[0][0].context
    press = DepthKVPress(prof, keep=0.2, policy="optimal")
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model.model(input_ids=torch.tensor([ctx]), past_key_values=cache)
    budgets = depthkv.allocate(prof, keep=0.2, scorer="snapkv", lengths=len(ctx)).budgets.tolist()
    assert [layer.keys.shape[2] for layer in cache.layers] == budgets


def test_the_profile_scores_as_the_press_scores(hf_run, model, cli_run):
    """hf.profile and DepthKVPress share one scoring path (depthkv._scoring.held_scores): the scores
    hf.profile's full run ranks a layer's slots by are the press's at the same prefill."""
    from depthkv.kvpress import DepthKVPress
    from transformers import DynamicCache
    win = depthkv.hf.load_windows(cli_run[0])[0][0]
    press = DepthKVPress(hf_run[0], keep=0.2, policy="uniform", press="snapkv")  # depthkv's own SnapKV
    with torch.no_grad(), press(model):
        model.model(input_ids=torch.tensor([win.context]), past_key_values=DynamicCache())
    s = depthkv.hf._settings(model, "snapkv", RATIOS, depthkv.DEFAULT_PROTECTION, depthkv.DEFAULT_OBS_WINDOW,
                             depthkv.DEFAULT_KERNEL, "max", False, False, True, "kl")
    run = depthkv.hf._FullRun(model, win, s)
    n_layers = len(run.keys)
    assert sorted(press.scores) == list(range(n_layers))
    for layer in range(n_layers):
        assert np.array_equal(depthkv.hf._layer_scores(run, "snapkv", layer), press.scores[layer][0].numpy())
