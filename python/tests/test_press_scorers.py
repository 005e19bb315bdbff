"""DepthKVPress with depthkv's own scorers by name (press="snapkv", "h2o", "tova", "knorm", "keydiff") on the
Hugging Face conversion of stories260K: physical per-layer lengths equal to the budgets, the kept
slots equal depthkv.select_keep over the scores the press ranked, and those scores equal the
library's scorer fed with the eager attention probabilities. Needs torch, transformers and kvpress,
as test_kvpress.py."""

import numpy as np
import pytest

from test_kvpress import models, peer, prefill, stories, tokenizer, window  # noqa: F401 (fixtures)

from conftest import need_module  # noqa: E402
torch = need_module("torch")

import depthkv  # noqa: E402
from depthkv.kvpress import DepthKVPress  # noqa: E402


def eager_scores(model, ctx, name, window_size, n_kv):
    """Per layer float32 [n_kv, n]: the library's scorer over the attention probabilities eager
    attention returns for the whole context (an independent path to the same rows)."""
    with torch.no_grad():
        out = model.model(input_ids=torch.tensor([ctx]), output_attentions=True)
    n, res = len(ctx), []
    for probs in out.attentions:
        sc = depthkv.TokenScorer(name, probs.shape[1], n_kv, window=window_size, kernel=7)
        first = {"snapkv": n - window_size, "tova": n - 1}.get(name, 0)
        sc.observe(probs[0, :, first:, :].float().contiguous(), q_pos0=first)
        res.append(sc.scores(n))
    return res


@pytest.mark.parametrize("name", ["snapkv", "h2o", "tova", "knorm", "keydiff", "snapkv-keydiff"])
def test_by_name_press_keeps_the_budgets_by_the_library_rule(models, window, stories, name):  # noqa: F811
    ctx, _ = window
    press = DepthKVPress(stories, keep=0.2, policy="optimal", press=name)
    cache = prefill(models["sdpa"], ctx, press)
    curves = name if name in stories.scorers else None
    assert press.scorer == curves and press.obs_window == 16
    budgets = depthkv.allocate(stories, keep=0.2, policy="optimal", scorer=curves, lengths=len(ctx),
                               obs_window=16).budgets.tolist()
    assert len(set(budgets)) > 1
    assert [layer.keys.shape[2] for layer in cache.layers] == budgets
    assert [layer.values.shape[2] for layer in cache.layers] == budgets
    for l, b in enumerate(budgets):
        s = press.scores[l][0].numpy()
        assert s.shape == (models["sdpa"].config.num_key_value_heads, len(ctx))
        want = depthkv.select_keep(np.ascontiguousarray(s), b, (4, 16))
        assert np.array_equal(press.kept[l][0].numpy(), want), l


@pytest.mark.parametrize("name", ["snapkv", "h2o", "tova"])
def test_by_name_scores_equal_the_scorer_on_eager_attention(models, window, stories, name):  # noqa: F811
    ctx, _ = window
    press = DepthKVPress(stories, keep=0.2, press=name)
    prefill(models["sdpa"], ctx, press)
    ref = eager_scores(models["eager"], ctx, name, 16, models["sdpa"].config.num_key_value_heads)
    for l, r in enumerate(ref):
        got = press.scores[l][0].numpy()
        np.testing.assert_allclose(got, r, rtol=1e-4, atol=1e-5 * float(np.abs(r).max()), err_msg=f"layer {l}")


def test_by_name_kept_tokens_are_the_cache(models, window, stories):  # noqa: F811
    """The cache holds the full run's keys at the kept slots (RoPE of their original positions)."""
    ctx, _ = window
    model = models["sdpa"]
    full = prefill(model, ctx, DepthKVPress(stories, keep=1.0, press="h2o"))
    press = DepthKVPress(stories, keep=0.3, press="h2o")
    cache = prefill(model, ctx, press)
    for l, layer in enumerate(cache.layers):
        idx = press.kept[l][0]
        want = torch.stack([full.layers[l].keys[0, h, idx[h]] for h in range(idx.shape[0])])
        assert torch.allclose(layer.keys[0], want, atol=1e-6), l


def test_by_name_bad_input(stories):  # noqa: F811
    with pytest.raises(depthkv.Error, match="unknown scorer 'snap'"):
        DepthKVPress(stories, keep=0.2, press="snap")
    with pytest.raises(depthkv.Error, match="ScorerPress or a depthkv scorer name"):
        DepthKVPress(stories, keep=0.2, press=3)
