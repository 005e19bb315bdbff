"""depthkv.kvpress.DepthKVPress on the Hugging Face conversion of stories260K (and aidreams260K for the
per-head budgets): physical per-layer cache lengths, continuation logits equal to a masked full
cache, bad input, and kvpress's pipeline. Needs torch, transformers and kvpress
(python/requirements-hf.txt); skipped without them, unless DEPTHKV_REQUIRE_HF=1 (scripts/python-test.sh),
which makes a missing one an error."""

import importlib.util
import os

import numpy as np
import pytest


from conftest import need_module  # noqa: E402

torch = need_module("torch")
need_module("transformers")
need_module("kvpress")

import depthkv  # noqa: E402
from conftest import AIDREAMS_BEST, DATA, ROOT, STORIES, data_path  # noqa: E402
from depthkv.kvpress import DepthKVPress  # noqa: E402
from transformers import DynamicCache  # noqa: E402

#: the validation text (test_readme_hf.py opens it; its models fixture checked the data folder first)
TEXT = os.path.join(DATA, "text", "tinystories_valid.txt")
CONTEXT, CONTINUATION = 384, 64


def _load_peer():
    """benchmarks/kvpress_peer/run.py as a module: its llama2.c -> HF conversion and its masking patch."""
    path = os.path.join(ROOT, "benchmarks", "kvpress_peer", "run.py")
    spec = importlib.util.spec_from_file_location("kvpress_peer_run", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def peer():
    mod = _load_peer()
    mod.install_mask_patch()
    return mod


def _model_path(name):
    """The llama2.c model ``name`` of the data folder (conftest.data_path)."""
    return data_path(f"models/{name}/{name}.bin")


@pytest.fixture(scope="module")
def models(peer):
    path = _model_path("stories260K")
    return {attn: peer.to_hf(path, attn) for attn in ("sdpa", "eager")}


@pytest.fixture(scope="module")
def tokenizer(peer):
    """A Hugging Face LlamaTokenizer over the llama2.c vocabulary (merges in id order)."""
    from transformers import LlamaTokenizer
    pieces = peer.read_vocab(data_path("models/stories260K/tok512.bin"), 512)
    names = ["<unk>", "<s>", "</s>"] + [p.decode("utf-8", "replace").replace(" ", "\u2581") for p in pieces[3:]]
    vocab = {s: i for i, s in enumerate(names)}
    merges = []
    for s in names[3:]:
        if len(s) > 1 and not s.startswith("<0x"):
            split = next(((s[:i], s[i:]) for i in range(1, len(s)) if s[:i] in vocab and s[i:] in vocab), None)
            if split:
                merges.append(split)
    return LlamaTokenizer(vocab=vocab, merges=merges)


@pytest.fixture(scope="module")
def window(tokenizer):
    with open(data_path("text/tinystories_valid.txt"), encoding="utf-8") as f:
        text = f.read(20000)
    ids = [1] + tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) >= CONTEXT + CONTINUATION
    return ids[:CONTEXT], ids[CONTEXT:CONTEXT + CONTINUATION]


@pytest.fixture(scope="module")
def stories():
    return depthkv.load_profile(STORIES)


def prefill(model, ctx, press):
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model.model(input_ids=torch.tensor([ctx]), past_key_values=cache)
    return cache


def continuation(model, cache, n_ctx, cont):
    pos = torch.arange(n_ctx, n_ctx + len(cont))[None]
    with torch.no_grad():
        return model(input_ids=torch.tensor([cont]), past_key_values=cache, position_ids=pos).logits[0]


def masked_reference(peer, model, ctx, cont, kept, head_budgets):
    """The continuation on the full cache, each layer's pruned (head, slot) pairs masked with -inf
    (run.py's install_mask_patch)."""
    cache = DynamicCache()
    for layer in model.model.layers:
        layer.self_attn.masked_key_indices = None
    with torch.no_grad():
        model.model(input_ids=torch.tensor([ctx]), past_key_values=cache)
    n = len(ctx)
    for l, layer in enumerate(model.model.layers):
        idx = kept[l][0]  # [n_kv, physical]
        keep = torch.zeros(idx.shape[0], n, dtype=torch.bool)
        for h, k in enumerate(head_budgets[l]):
            keep[h, idx[h, :k]] = True
        heads, slots = torch.where(~keep)
        layer.self_attn.masked_key_indices = (torch.zeros_like(heads), heads, slots)
    try:
        return continuation(model, cache, n, cont)
    finally:
        for layer in model.model.layers:
            layer.self_attn.masked_key_indices = None


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_physical_lengths_are_the_budgets(models, window, stories, attn):
    ctx, _ = window
    press = DepthKVPress(stories, keep=0.2, policy="optimal")
    cache = prefill(models[attn], ctx, press)
    assert press.scorer == "snapkv"  # the curves of the wrapped SnapKVPress
    budgets = depthkv.allocate(stories, keep=0.2, policy="optimal", scorer="snapkv",
                               lengths=[len(ctx)] * stories.n_layers, obs_window=16).budgets.tolist()
    assert len(set(budgets)) > 1, "the test needs layers of different budgets"
    assert sum(budgets) == round(0.2 * len(ctx) * stories.n_layers)
    for l, layer in enumerate(cache.layers):
        assert layer.keys.shape[2] == budgets[l] and layer.values.shape[2] == budgets[l], l
    assert [r["physical"] for r in press.memory_report()] == budgets
    assert all(r["masked"] == 0 for r in press.memory_report())


def test_continuation_equals_masked_full_cache(peer, models, window, stories):
    ctx, cont = window
    press = DepthKVPress(stories, keep=0.2, policy="optimal")
    logits = continuation(models["sdpa"], prefill(models["sdpa"], ctx, press), len(ctx), cont)
    heads = [r["budgets"] for r in press.memory_report()]
    ref = masked_reference(peer, models["sdpa"], ctx, cont, press.kept, heads)
    full = continuation(models["sdpa"], prefill(models["sdpa"], ctx, DepthKVPress(stories, keep=1.0)), len(ctx), cont)
    assert torch.allclose(logits, ref, atol=1e-4, rtol=0), float((logits - ref).abs().max())
    assert not torch.allclose(logits, full, atol=1e-2), "pruning must change the logits"
    # eager, with its own mask rewriting, gives the same logits
    press_e = DepthKVPress(stories, keep=0.2, policy="optimal")
    logits_e = continuation(models["eager"], prefill(models["eager"], ctx, press_e), len(ctx), cont)
    assert all(torch.equal(press.kept[l], press_e.kept[l]) for l in press.kept)
    assert torch.allclose(logits, logits_e, atol=1e-4, rtol=0), float((logits - logits_e).abs().max())


def test_kept_slots_follow_the_ranking_rule(models, window, stories):
    ctx, _ = window
    press = DepthKVPress(stories, keep=0.2, policy="optimal", protection=(4, 16))
    prefill(models["sdpa"], ctx, press)
    for l, idx in press.kept.items():
        for row in idx[0]:
            s = set(row.tolist())
            assert set(range(4)) <= s and set(range(len(ctx) - 16, len(ctx))) <= s, l
            assert row.tolist() == sorted(s)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_head_budgets_mask_the_tails(peer, attn):
    path = _model_path("aidreams260K")
    prof = depthkv.load_profile(AIDREAMS_BEST)
    model = peer.to_hf(path, attn)
    rng = np.random.default_rng(7)
    ids = [1] + rng.integers(3, model.config.vocab_size, CONTEXT + CONTINUATION - 1).tolist()
    ctx, cont = ids[:CONTEXT], ids[CONTEXT:]
    press = DepthKVPress(prof, keep=0.2, policy="head-optimal", protection=(0, 4))
    cache = prefill(model, ctx, press)
    a = depthkv.allocate(prof, keep=0.2, policy="head-optimal", scorer="snapkv", lengths=[CONTEXT] * prof.n_layers,
                         protection=(0, 4), obs_window=press.obs_window)
    report = press.memory_report()
    assert sum(r["masked"] for r in report) > 0, "the test needs heads of different budgets"
    for l, layer in enumerate(cache.layers):
        hb = a.head_budgets[l].tolist()
        assert report[l]["budgets"] == hb
        assert layer.keys.shape[2] == max(hb) == report[l]["physical"]
        assert report[l]["masked"] == sum(max(hb) - k for k in hb)
    logits = continuation(model, cache, CONTEXT, cont)
    sdpa = model if attn == "sdpa" else peer.to_hf(path, "sdpa")
    ref = masked_reference(peer, sdpa, ctx, cont, press.kept, a.head_budgets.tolist())
    assert torch.allclose(logits, ref, atol=1e-4, rtol=0), float((logits - ref).abs().max())


def test_scorer_chooses_the_curves(models, window, stories):
    ctx, _ = window
    lengths = {}
    for scorer in ("snapkv", "h2o"):
        press = DepthKVPress(stories, keep=0.2, scorer=scorer)
        cache = prefill(models["sdpa"], ctx, press)
        lengths[scorer] = [layer.keys.shape[2] for layer in cache.layers]
        assert lengths[scorer] == depthkv.allocate(stories, keep=0.2, scorer=scorer, lengths=len(ctx),
                                                   obs_window=16).budgets.tolist()
    assert lengths["snapkv"] != lengths["h2o"]


def test_bad_input(models, stories):
    for keep in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(depthkv.Error, match=r"keep must be in \(0, 1\]"):
            DepthKVPress(stories, keep=keep)
    with pytest.raises(depthkv.Error, match="unknown policy 'greedy'"):
        DepthKVPress(stories, keep=0.2, policy="greedy")
    with pytest.raises(depthkv.Error, match="ScorerPress"):
        DepthKVPress(stories, keep=0.2, press=object())
    other = depthkv.load_profile(AIDREAMS_BEST)  # 4 layers; stories260K has 5
    press = DepthKVPress(other, keep=0.2, protection=(0, 4))
    with pytest.raises(depthkv.Error, match="the profile is of another model: it has 4 layers, the model 5"):
        prefill(models["sdpa"], [1] * 64, press)


def test_pipeline_with_a_question(models, tokenizer, stories):
    from kvpress import KVPressTextGenerationPipeline
    model = models["sdpa"]
    model.generation_config.eos_token_id = 2
    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer, device="cpu")
    with open(data_path("text/tinystories_valid.txt"), encoding="utf-8") as f:
        context = f.read(1500)
    press = DepthKVPress(stories, keep=0.3, policy="optimal")
    cache = DynamicCache()
    out = pipe(context, question="Where did the girl go?", press=press, cache=cache, max_new_tokens=16)
    assert isinstance(out["answer"], str) and out["answer"].strip()
    n = len(tokenizer.encode(tokenizer.bos_token + context, add_special_tokens=False))
    budgets = depthkv.allocate(stories, keep=0.3, scorer="snapkv", lengths=[n] * stories.n_layers,
                               obs_window=16).budgets.tolist()
    assert [layer.keys.shape[2] for layer in cache.layers] == budgets
