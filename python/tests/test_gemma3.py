"""depthkv.hf.profile and depthkv.kvpress.DepthKVPress on a tiny random Gemma 3
(``transformers.Gemma3TextConfig``: 4 layers, sliding window 16 in layers 0, 1 and 3, full
attention in layer 2; random weights, no files), with a 40-token context, longer than the window.
The profile records the windows and prunes a sliding layer among its last 15 tokens (the ones it
can still use); the press caps a sliding layer's budget there and its cache after the prefill is
its budget, in transformers' sliding-window cache and in a plain DynamicCache; the continuation and
a greedy generation past the window equal the full cache with the pruned tokens masked; the press
runs in kvpress's pipeline. Needs torch, transformers and kvpress (python/requirements-hf.txt)."""

import contextlib
import json

import pytest



from conftest import need_module  # noqa: E402
torch = need_module("torch")
need_module("transformers")
need_module("kvpress")

import depthkv  # noqa: E402
import depthkv.hf  # noqa: E402
from depthkv.kvpress import DepthKVPress  # noqa: E402
from transformers import DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig  # noqa: E402
from transformers.cache_utils import DynamicSlidingWindowLayer  # noqa: E402
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402

WINDOW, N, T, VOCAB = 16, 40, 16, 96
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
#: tokens each layer holds after the N-token prefill: min(N, WINDOW - 1) for a sliding layer
HELD = [15, 15, 40, 15]
WINDOWS = [16, 16, 0, 16]
PROT, RATIOS = (2, 4), (0.25, 0.5)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=WINDOW,
                           layer_types=LAYER_TYPES, max_position_embeddings=128, initializer_range=0.2,
                           attn_implementation="sdpa")
    return Gemma3ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def ids():
    g = torch.Generator().manual_seed(1)
    return [2] + torch.randint(3, VOCAB, (N + T - 1,), generator=g).tolist()


@pytest.fixture(scope="module")
def profiled(model, ids):
    """The profile of one window and, per pruned run, (layer, held slots, budgets, kept slots) as the
    profile's pruning path saw them."""
    runs = []
    real = depthkv.hf.prune_layer

    def spy(module, keys, values, n, budgets, scores, protection):
        k, v, idx = real(module, keys, values, n, budgets, scores, protection)
        runs.append((module.layer_idx, keys.shape[2], list(budgets), idx[0].clone()))
        return k, v, idx
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(depthkv.hf, "prune_layer", spy)
        prof = depthkv.hf.profile(model, None, [(ids[:N], ids[N:])], keep_ratios=RATIOS, protection=PROT,
                                  window=8, kernel=3)
    return prof, runs


@contextlib.contextmanager
def masked(kept):
    """sdpa attention over a full cache with, per layer l, KV head h, the context positions not in
    kept[l][h] hidden (kept: per layer int [n_kv, k] of positions < N)."""
    inner = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def attend(module, query, key, value, attention_mask, *args, **kwargs):
        k_len, heads = key.shape[2], query.shape[1]
        hide = torch.zeros(key.shape[1], k_len, dtype=torch.bool)
        hide[:, :N] = True
        hide.scatter_(1, kept[module.layer_idx], False)
        visible = (~hide).repeat_interleave(heads // key.shape[1], dim=0)[None, :, None, :]
        if attention_mask is None:
            assert query.shape[2] == 1
            attention_mask = visible
        elif attention_mask.dtype == torch.bool:
            attention_mask = attention_mask & visible
        else:
            attention_mask = attention_mask.masked_fill(~visible, torch.finfo(attention_mask.dtype).min)
        kwargs.pop("is_causal", None)
        return inner(module, query, key, value, attention_mask, *args, **kwargs)
    ALL_ATTENTION_FUNCTIONS["sdpa"] = attend
    try:
        yield
    finally:
        ALL_ATTENTION_FUNCTIONS["sdpa"] = inner


def _prefill(model, ids, press, cache):
    with torch.no_grad(), (press(model) if press is not None else contextlib.nullcontext()):
        model.model(input_ids=torch.tensor([ids[:N]]), past_key_values=cache)
    return cache


def _continue(model, cache, tokens, pos0):
    pos = torch.arange(pos0, pos0 + len(tokens))[None]
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens]), past_key_values=cache, position_ids=pos).logits[0]


def _reference(model, ids, kept):
    """The continuation's logits on the full cache, the tokens not kept masked."""
    cache = _prefill(model, ids, None, DynamicCache())
    with masked(kept):
        return _continue(model, cache, ids[N:], N)


def _caches(model):
    return {"plain": DynamicCache(), "model's": DynamicCache(config=model.config)}


def _budgets(prof, keep, **kw):
    return depthkv.allocate(prof, keep=keep, lengths=[N] * 4, protection=PROT, **kw).budgets.tolist()


def test_profile_has_a_row_per_layer_and_records_the_windows(model, profiled):
    prof, _ = profiled
    assert prof.n_layers == 4 and list(prof.keep_ratios) == list(RATIOS)
    curves = prof.curves("snapkv")
    assert curves.shape == (4, 2) and (curves >= 0).all() and (curves > 0).any()
    assert depthkv.hf.profile_windows(prof) == WINDOWS == depthkv.hf.layer_windows(model)
    assert json.loads(prof.to_json())["kv_shape"] == {"n_kv_heads": 2, "head_dim": 8}
    # the allocator caps the sliding layers at their window: keep 0.5 of 4 x 40 tokens
    budgets = _budgets(prof, 0.5)
    assert sum(budgets) == 80 and all(b <= h for b, h in zip(budgets, HELD)) and budgets[2] >= 80 - 45


def test_profile_prunes_a_sliding_layer_among_its_held_tokens(model, ids, profiled):
    prof, runs = profiled
    assert [(layer, h) for layer, h, _, _ in runs] == [(l, HELD[l]) for l in range(4) for _ in RATIOS]
    for i, (layer, h, budgets, idx) in enumerate(runs):
        k = depthkv.keep_tokens(RATIOS[i % len(RATIOS)], N, PROT)  # 10, 20: ratios of the context
        assert budgets == [k, k] and idx.shape == (2, min(k, h)) and int(idx.max()) < h
    kl = prof.curves("snapkv", metric="kl")
    # at ratio 0.5 (20 tokens) a sliding layer keeps its 15 held tokens: the model's own outputs
    assert kl[[0, 1, 3], 1].max() < 1e-9 and kl[2, 1] > 1e-4
    # the profile's run of sliding layer 1 at ratio 0.25 is the full cache with the other tokens masked
    layer, h, _, idx = runs[2]
    kept = [torch.arange(N).expand(2, N)] * 4
    kept[layer] = idx + (N - h)
    full = _continue(model, _prefill(model, ids, None, DynamicCache()), ids[N:], N).double().log_softmax(-1)
    ref = _reference(model, ids, kept).double().log_softmax(-1)
    ref_kl = float((full.exp() * (full - ref)).sum(-1).mean())
    assert ref_kl > 1e-4 and kl[layer, 0] == pytest.approx(ref_kl, rel=1e-3)


@pytest.mark.parametrize("cache_kind", ["plain", "model's"])
def test_cache_lengths_are_the_budgets(model, ids, profiled, cache_kind):
    prof, _ = profiled
    press = DepthKVPress(prof, keep=0.5, protection=PROT)
    cache = _prefill(model, ids, press, _caches(model)[cache_kind])
    budgets = _budgets(prof, 0.5)
    assert [layer.keys.shape[2] for layer in cache.layers] == budgets
    assert [r["length"] for r in press.memory_report()] == HELD
    assert [r["window"] for r in press.memory_report()] == WINDOWS
    for l in (0, 1, 3):  # a sliding layer keeps tokens of its window only
        assert int(press.kept[l].min()) >= N - HELD[l]
    if cache_kind == "model's":
        assert isinstance(cache.layers[0], DynamicSlidingWindowLayer)


def test_a_sliding_layer_within_its_budget_is_left_alone(model, ids, profiled):
    prof, _ = profiled
    press = DepthKVPress(prof, keep=0.45, policy="uniform", protection=PROT)  # 72 tokens: 15 + 15 + 27 + 15
    cache = _prefill(model, ids, press, DynamicCache())
    assert [layer.keys.shape[2] for layer in cache.layers] == [15, 15, 27, 15] == _budgets(prof, 0.45, policy="uniform")
    for l in (0, 1, 3):
        assert press.kept[l][0, 0].tolist() == list(range(N - 15, N)) and l not in press.scores
    assert 2 in press.scores


def test_a_keep_above_what_the_layers_hold_keeps_it_all(model, ids, profiled):
    prof, _ = profiled
    # 96 tokens asked, the layers can hold 85: the allocator clamps the budget to its caps
    assert _budgets(prof, 0.6) == HELD
    press = DepthKVPress(prof, keep=0.6, protection=PROT)
    cache = _prefill(model, ids, press, DynamicCache(config=model.config))
    assert [layer.keys.shape[2] for layer in cache.layers] == HELD


def test_the_windows_of_the_profile_and_of_the_model(model, ids, profiled):
    prof, _ = profiled
    none = depthkv.hf.with_windows(prof, [0, 0, 0, 0])  # as an older profile: no windows recorded
    assert depthkv.hf.profile_windows(none) is None
    press = DepthKVPress(none, keep=0.5, protection=PROT)
    cache = _prefill(model, ids, press, DynamicCache())  # capped by the model's windows
    assert [layer.keys.shape[2] for layer in cache.layers] == _budgets(prof, 0.5)
    other = depthkv.hf.with_windows(prof, [8, 8, 0, 8])
    with pytest.raises(depthkv.Error, match="sliding windows are \\[8, 8, 0, 8\\], the model's \\[16, 16, 0, 16\\]"):
        with DepthKVPress(other, keep=0.5, protection=PROT)(model):
            pass


@pytest.mark.parametrize("cache_kind", ["plain", "model's"])
def test_continuation_equals_the_masked_full_cache(model, ids, profiled, cache_kind):
    prof, _ = profiled
    press = DepthKVPress(prof, keep=0.5, protection=PROT)
    logits = _continue(model, _prefill(model, ids, press, _caches(model)[cache_kind]), ids[N:], N)
    kept = [press.kept[l][0] for l in range(4)]
    ref = _reference(model, ids, kept)
    full = _continue(model, _prefill(model, ids, None, DynamicCache()), ids[N:], N)
    assert float((ref - full).abs().max()) > 1e-2  # the pruning matters
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("scorer", ["snapkv", "h2o"])
def test_depthkv_scorers_rank_the_held_tokens(model, ids, profiled, scorer):
    prof, _ = profiled
    press = DepthKVPress(prof, keep=0.5, press=scorer, scorer="snapkv", protection=PROT)
    logits = _continue(model, _prefill(model, ids, press, DynamicCache()), ids[N:], N)
    assert [tuple(press.scores[l].shape) for l in sorted(press.scores)] == [(1, 2, HELD[l]) for l in sorted(press.scores)]
    assert sorted(press.scores) == [l for l, b in enumerate(_budgets(prof, 0.5)) if b < HELD[l]]
    torch.testing.assert_close(logits, _reference(model, ids, [press.kept[l][0] for l in range(4)]), atol=1e-4,
                               rtol=1e-4)


@pytest.mark.parametrize("cache_kind", ["plain", "model's"])
def test_keep_one_changes_nothing(model, ids, profiled, cache_kind):
    prof, _ = profiled
    press = DepthKVPress(prof, keep=1.0, protection=PROT)
    logits = _continue(model, _prefill(model, ids, press, _caches(model)[cache_kind]), ids[N:], N)
    full = _continue(model, _prefill(model, ids, None, _caches(model)[cache_kind]), ids[N:], N)
    torch.testing.assert_close(logits, full, atol=1e-5, rtol=1e-5)


def _greedy(model, cache, first, steps, kept=None):
    """Greedy decoding of ``steps`` tokens after the context, ``first`` fed at position N: (tokens,
    per step the logits); the most slots a sliding layer held."""
    tokens, logits, most = [first], [], 0
    for step in range(steps):
        with masked(kept) if kept is not None else contextlib.nullcontext():
            out = _continue(model, cache, tokens[-1:], N + step)[-1]
        logits.append(out)
        tokens.append(int(out.argmax()))
        most = max(most, max(cache.layers[l].keys.shape[2] for l in (0, 1, 3)))
    return tokens, torch.stack(logits), most


def test_generation_past_the_window_equals_the_masked_full_cache(model, ids, profiled):
    """Greedy decoding of 24 tokens (the kept context leaves the sliding window) on the press's
    caches and on the masked full cache: the same tokens and logits; the sliding layers of
    transformers' sliding cache never hold more than 15 slots. (The mask state lives on the
    attention modules: each cache is prefilled right before it is decoded.)"""
    prof, _ = profiled
    press = DepthKVPress(prof, keep=0.5, protection=PROT)
    _prefill(model, ids, press, DynamicCache())
    kept = [press.kept[l][0] for l in range(4)]
    ref_tokens, ref_logits, _ = _greedy(model, _prefill(model, ids, None, DynamicCache()), ids[N], 24, kept)
    for kind, cache in _caches(model).items():
        tokens, logits, most = _greedy(model, _prefill(model, ids, press, cache), ids[N], 24)
        torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
        assert tokens == ref_tokens
        kept_sliding = max(press.memory_report()[l]["physical"] for l in (0, 1, 3))
        assert most == (WINDOW - 1 if kind == "model's" else kept_sliding + 24)  # a plain cache grows


def _word_tokenizer():
    """A word-level tokenizer: <unk> 0, <eos> 1, <bos> 2, then the words w3 .. w95."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast
    vocab = {"<unk>": 0, "<eos>": 1, "<bos>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")


def test_kvpress_pipeline(model, ids, profiled):
    from kvpress import KVPressTextGenerationPipeline
    prof, _ = profiled
    tokenizer = _word_tokenizer()
    model.generation_config.eos_token_id = 1
    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer, device="cpu")
    context = "".join(f" w{i}" for i in ids[1:N])  # the pipeline puts the BOS first: N tokens
    press = DepthKVPress(prof, keep=0.5, protection=PROT)
    cache = DynamicCache()
    assert tokenizer.encode(tokenizer.bos_token + context, add_special_tokens=False) == ids[:N]
    out = pipe(context, questions=["w5 w6 w7", "w8 w9"], press=press, cache=cache, max_new_tokens=24)
    assert len(out["answers"]) == 2 and all(isinstance(a, str) for a in out["answers"]) and out["answers"][0]
    assert [layer.keys.shape[2] for layer in cache.layers] == _budgets(prof, 0.5)
