"""depthkv.Engine: depthkv's engine and its prefill-evict-decode driver (PrunedGeneration) from
Python. Greedy tokens equal llama2.c's reference text and ``depthkv generate -t 0`` (no spec, an
explicit spec, the "best" preset with its per-input rule; stories260K, and SmolLM2 when
scripts/get-models.sh fetched it); a pruned run's budgets are depthkv.allocate's; every bad input
raises depthkv.Error naming what was wrong. Data: $DEPTHKV_DATA_DIR, else the shared/ folder beside
the checkout; real models: $DEPTHKV_MODEL_DIR, else ~/.cache/depthkv/models."""

import os
import re
import shutil
import threading

import pytest

import depthkv
from conftest import AIDREAMS_BEST, DATA, MODEL_DIR, ROOT, STORIES, data_path, model_path, run_cli

STORIES_DIR = os.path.join(DATA, "models", "stories260K")
STORIES_BIN = os.path.join(STORIES_DIR, "stories260K.bin")
STORIES_BEST = os.path.join(ROOT, "docs", "results", "stories260K.best.profile.json")
TEXT = os.path.join(DATA, "text", "tinystories_valid.txt")
SMOL = os.path.join(MODEL_DIR, "SmolLM2-135M-Instruct.Q4_1.gguf")
SMOL_PROFILE = os.path.join(ROOT, "docs", "results", "smollm2.profile.json")

pytestmark = pytest.mark.skipif(not hasattr(depthkv._core, "Engine"),
                                reason="depthkv was built without its engine (no PCRE2)")


@pytest.fixture(scope="module")
def stories():
    return depthkv.Engine(data_path("models/stories260K/stories260K.bin"), n_threads=1)


@pytest.fixture(scope="module")
def prompt_text():
    """About 300 tokens of stories (stories260K; about 130 on SmolLM2) (the first paragraphs of the validation text)."""
    with open(data_path("text/tinystories_valid.txt"), encoding="utf-8") as f:
        text = f.read(2000)
    return text[:text.index("Roxy tried")].strip()


def _cli_text(engine, ids, tokens):
    """What `depthkv generate` prints for a prompt ``ids`` followed by ``tokens``: every token but
    the first as it follows the one before, then a newline."""
    full = ids + tokens
    return engine.detokenize(full)[len(engine.detokenize(full[:1])):] + "\n"


def _cli_generate(cli, model, prompt, n_positions, *flags):
    """(stdout, the budgets and bytes of the "kv cache: ... per-layer tokens" line or None)."""
    rc, out, err = run_cli(cli, "generate", "--model", model, "--prompt", prompt, "-t", "0", "-n", str(n_positions),
                           *flags)
    assert rc == 0, err
    m = re.search(r"per-layer tokens ([\d ]+) of \d+; (\d+) of (\d+) bytes", err)
    pruned = None if m is None else ([int(x) for x in m.group(1).split()], int(m.group(2)), int(m.group(3)))
    return out, pruned, err


# ---- (1) the full cache: llama2.c's reference, the CLI, a keep ratio of 1 ----------------------

def test_greedy_from_bos_equals_llama2c_reference(stories):
    with open(os.path.join(STORIES_DIR, "expected_greedy_t0_n200.txt"), encoding="utf-8") as f:
        expected = f.read()
    g = stories.generate([stories.bos_id], 200)  # run.c -t 0 -n 200: 200 positions from BOS
    assert len(g.tokens) == 200
    assert stories.detokenize([stories.bos_id] + g.tokens) + "\n" == expected
    assert g.report["pruned"] is False and g.report["spec"] is None and g.report["budgets"] == []
    assert g.report["tokens_seen"] == 200  # the last token is returned, not fed


def test_no_spec_equals_the_cli_and_keep_one(stories, cli, prompt_text):
    ids = stories.tokenize(prompt_text)
    assert ids[0] == stories.bos_id and 200 <= len(ids) <= 400
    n = 40
    g = stories.generate(ids, n)
    assert len(g.tokens) == n
    out, pruned, _ = _cli_generate(cli, STORIES_BIN, prompt_text, len(ids) + n - 1)
    assert pruned is None
    assert out == _cli_text(stories, ids, g.tokens)
    # a spec that keeps everything runs the same tokens and evicts nothing
    keep1 = stories.generate(ids, n, spec={"sinks": 4, "recent": 16, "obs_window": 16, "kernel": 7,
                                           "pooling": "max", "scorer": "snapkv", "budget": {"keep": 1.0}})
    assert keep1.tokens == g.tokens
    assert keep1.report["pruned"] is False
    assert keep1.report["cache_bytes"] == g.report["cache_bytes"] > 0
    # on a float32 cache, with another prefill chunk and threads: the same greedy text here
    f32 = depthkv.Engine(STORIES_BIN, kv_type="f32", chunk=7, n_threads=2)
    assert (f32.kv_type, f32.chunk, f32.n_threads) == ("f32", 7, 2)
    g32 = f32.generate(ids, n)
    assert g32.tokens == g.tokens
    assert g32.report["cache_bytes"] == 2 * g.report["cache_bytes"]


def test_engine_properties(stories):
    assert (stories.n_layers, stories.n_heads, stories.n_kv_heads, stories.vocab_size, stories.seq_len) == \
        (5, 8, 4, 512, 512)
    assert stories.layer_window == [0] * 5
    assert stories.format == "llama2.c" and stories.kv_type == "f16"
    assert stories.tokenizer_source.endswith("tok512.bin")
    assert stories.tokenize("Once upon a time", bos=False) == stories.tokenize("Once upon a time")[1:]
    assert stories.detokenize(stories.tokenize("Once upon a time")) == "Once upon a time"
    gguf = depthkv.Engine(data_path("models/stories260K/stories260K.gguf"))
    assert gguf.format == "gguf" and gguf.tokenize("Once upon a time") == stories.tokenize("Once upon a time")


# ---- (2) a pruned run: depthkv.allocate's budgets, fewer bytes ----------------------------------

def test_pruned_budgets_are_allocates(stories, prompt_text):
    prof = depthkv.load_profile(STORIES)
    ids = stories.tokenize(prompt_text)
    n = 24
    full = stories.generate(ids, n)
    spec = {"sinks": 4, "recent": 16, "obs_window": 16, "kernel": 7, "pooling": "max", "scorer": "snapkv",
            "policy": "optimal", "budget": {"keep": 0.3}}
    g = stories.generate(ids, n, spec=spec, profile=prof)
    r = g.report
    a = depthkv.allocate(prof, keep=0.3, policy="optimal", scorer="snapkv", lengths=len(ids))
    assert r["pruned"] is True and r["raised_to_protection"] is False
    assert r["budgets"] == a.budgets.tolist()
    assert sum(r["budgets"]) == a.total
    assert len(set(r["budgets"])) > 1  # the profile's curves moved tokens between layers
    assert r["lengths"] == [len(ids)] * 5
    assert r["spec"]["policy"] == "optimal" and r["spec"]["scorer"] == "snapkv"
    assert 0 < r["bytes_after"] < r["bytes_before"]
    per_token = stories.n_layers * stories.n_kv_heads * stories.head_dim * 2 * 2  # K and V, F16
    assert r["bytes_before"] == len(ids) * per_token  # the prompt's full cache
    assert full.report["cache_bytes"] == (len(ids) + n - 1) * per_token
    # decoding appended n - 1 tokens to every layer after the eviction
    assert r["cache_lengths"] == [b + n - 1 for b in r["budgets"]]
    assert r["cache_bytes"] < full.report["cache_bytes"]
    assert len(g.tokens) == n
    # uniform budgets (no profile needed) differ from optimal's, same total
    u = stories.generate(ids, n, spec=dict(spec, policy="uniform"))
    assert sum(u.report["budgets"]) == a.total and max(u.report["budgets"]) - min(u.report["budgets"]) <= 1
    assert u.tokens != g.tokens or u.report["budgets"] != r["budgets"]


def test_a_schedule_bounds_the_cache(stories, prompt_text):
    ids = stories.tokenize(prompt_text)
    spec = {"sinks": 4, "recent": 16, "obs_window": 16, "kernel": 7, "pooling": "max", "scorer": "h2o",
            "budget": {"tokens": 300}, "schedule": {"mode": "chunked", "chunk": 32, "interval": 8}}
    g = stories.generate(ids, 40, spec=spec)
    r = g.report
    assert r["evictions"] >= 4 and r["pruned"] is False
    assert sum(r["budgets"]) <= 300
    per_token = stories.n_layers * stories.n_kv_heads * stories.head_dim * 2 * 2  # K and V, F16
    assert r["peak_bytes"] <= (300 + 5 * 32) * per_token  # the budget plus one chunk per layer
    assert r["peak_bytes"] < (len(ids) + 39) * per_token


def test_a_suffix_follows_the_pruning_unpruned(stories, prompt_text):
    """suffix_ids (a question after a compressed context): on the full cache the same tokens as one
    prompt; on a pruned cache the suffix is appended after the eviction and kept whole."""
    ids = stories.tokenize(prompt_text)
    ctx, question = ids[:-12], ids[-12:]
    n = 16
    assert stories.generate(ctx, n, suffix_ids=question).tokens == stories.generate(ids, n).tokens
    spec = {"sinks": 4, "recent": 16, "obs_window": 16, "kernel": 7, "pooling": "max", "scorer": "snapkv",
            "budget": {"keep": 0.3}}
    g = stories.generate(ctx, n, spec=spec, suffix_ids=question)
    r = g.report
    assert r["lengths"] == [len(ctx)] * stories.n_layers  # the context alone was pruned
    assert r["cache_lengths"] == [b + len(question) + n - 1 for b in r["budgets"]]
    whole = stories.generate(ids, n, spec=spec)  # the question inside the compressed prompt
    assert whole.report["lengths"] == [len(ids)] * stories.n_layers
    with pytest.raises(depthkv.Error, match=re.escape("suffix_ids: token 600 at position 1 is outside the vocabulary")):
        stories.generate(ctx, n, suffix_ids=[1, 600])
    with pytest.raises(depthkv.Error, match="suffix included"):
        stories.generate(ctx, 512 - len(ctx), suffix_ids=question)


def test_generate_many_equals_generate_run_by_run(stories, prompt_text):
    """One shared prefill for the oneshot runs (full, plain, optimal, the preset with its rule,
    span pooling), its own prefill for a chunked run: every run's tokens and report equal
    generate's, the suffix following each pruning."""
    prof = depthkv.load_profile(STORIES)
    best = depthkv.load_profile(STORIES_BEST)
    ids = stories.tokenize(prompt_text)
    ctx, question = ids[:-12], ids[-12:]
    base = {"sinks": 4, "recent": 16, "obs_window": 16, "kernel": 7, "pooling": "max", "scorer": "snapkv"}
    runs = [{}, {"spec": dict(base, budget={"keep": 0.3})},
            {"spec": dict(base, policy="optimal", budget={"keep": 0.2}), "profile": prof},
            {"spec": depthkv.preset("best", best, keep=0.3, lengths=len(ctx)), "profile": best, "preset": "best"},
            {"spec": dict(base, budget={"keep": 0.3}, span_pooling=True)},
            {"spec": dict(base, budget={"tokens": 100}, schedule={"mode": "chunked", "chunk": 64, "interval": 64})}]
    n = 20
    many = stories.generate_many(ctx, n, runs, suffix_ids=question)
    assert len(many) == len(runs)
    for run, got in zip(runs, many):
        want = stories.generate(ctx, n, suffix_ids=question, **run)
        assert got.tokens == want.tokens
        for key in ("spec", "pruned", "budgets", "head_budgets", "lengths", "bytes_before", "bytes_after",
                    "rule_ran", "trusted", "context_nll", "lookahead", "evictions", "cache_lengths", "cache_bytes"):
            assert got.report[key] == want.report[key], key
    assert many[3].report["rule_ran"] and many[3].report["lookahead"] > 0
    assert len({tuple(g.tokens) for g in many}) > 2  # the methods differ
    with pytest.raises(depthkv.Error, match="run 1 has unknown keys"):
        stories.generate_many(ids, 4, [{}, {"spec": None, "budget": 0.3}])
    with pytest.raises(depthkv.Error, match="run 0 must be a dict"):
        stories.generate_many(ids, 4, [("spec",)])
    with pytest.raises(depthkv.Error, match="runs must be a list"):
        stories.generate_many(ids, 4, {"spec": None})
    with pytest.raises(depthkv.Error, match="keep ratio"):  # a bad run is refused before any prefill
        stories.generate_many(ids, 4, [{}, {"spec": dict(base, budget={"keep": 1.5})}])
    with pytest.raises(depthkv.Error, match="preset 'best' runs its per-input rule on its spec"):
        stories.generate_many(ids, 4, [{"preset": "best"}])
    assert stories.generate_many(ids, 4, []) == []


def test_concurrent_generations_equal_sequential_ones(stories, prompt_text):
    ids = stories.tokenize(prompt_text)
    spec = {"sinks": 4, "recent": 16, "obs_window": 16, "kernel": 7, "pooling": "max", "scorer": "h2o",
            "budget": {"keep": 0.4}}
    want = [stories.generate(ids, 30).tokens, stories.generate(ids, 30, spec=spec).tokens]
    assert want[0] != want[1]  # the pruned cache changes the text
    got = [None] * 4

    def run(i):
        got[i] = stories.generate(ids, 30, spec=spec if i % 2 else None).tokens

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [want[0], want[1], want[0], want[1]]


# ---- (3) the CLI and Python run the same driver ----------------------------------------------

def test_preset_best_equals_the_cli(stories, cli, prompt_text):
    prof = depthkv.load_profile(STORIES_BEST)
    ids = stories.tokenize(prompt_text)
    n = 24
    spec = depthkv.preset("best", prof, keep=0.3, lengths=len(ids))
    g = stories.generate(ids, n, spec=spec, profile=prof, preset="best")
    r = g.report
    assert r["rule_ran"] is True and r["pruned"] is True and r["lookahead"] == spec["lookahead"] > 0
    out, pruned, err = _cli_generate(cli, STORIES_BIN, prompt_text, len(ids) + n - 1, "--keep", "0.3", "--preset",
                                     "best", "--profile", STORIES_BEST)
    assert out == _cli_text(stories, ids, g.tokens)
    assert pruned == (r["budgets"], r["bytes_after"], r["bytes_before"])
    verdict = "the preset's spec" if r["trusted"] else "its fallback"
    assert verdict in err and f"last {r['nll_tokens']} tokens" in err
    # without the rule's name the spec is served as given (a trusted prompt: the same budgets)
    plain = stories.generate(ids, n, spec=spec, profile=prof)
    assert plain.report["rule_ran"] is False
    if r["trusted"]:
        assert plain.tokens == g.tokens


def test_smollm2_spec_equals_the_cli(cli, prompt_text):
    """SmolLM2-135M (GGUF, byte-level BPE, 30 layers, GQA 9/3): an optimal snapkv spec at keep 0.3."""
    engine = depthkv.Engine(model_path("SmolLM2-135M-Instruct.Q4_1.gguf"))
    prof = depthkv.load_profile(SMOL_PROFILE)
    prompt = prompt_text
    ids = engine.tokenize(prompt)
    n = 8
    spec = dict(prof.selection, scorer="snapkv", policy="optimal", budget={"keep": 0.3})
    g = engine.generate(ids, n, spec=spec, profile=prof)
    r = g.report
    assert r["pruned"] and not r["raised_to_protection"] and len(g.tokens) >= 1
    a = depthkv.allocate(prof, keep=0.3, policy="optimal", scorer="snapkv", lengths=len(ids))
    assert r["budgets"] == a.budgets.tolist()
    out, pruned, err = _cli_generate(cli, SMOL, prompt, len(ids) + n - 1, "--keep", "0.3", "--policy", "optimal",
                                     "--scorer", "snapkv", "--profile", SMOL_PROFILE)
    assert out == _cli_text(engine, ids, g.tokens)
    assert pruned == (r["budgets"], r["bytes_after"], r["bytes_before"])


# ---- (4) bad inputs raise depthkv.Error --------------------------------------------------------

def test_bad_models_raise(tmp_path):
    with pytest.raises(depthkv.Error, match="cannot open model file '.*no-such.bin'"):
        depthkv.Engine(tmp_path / "no-such.bin")
    with pytest.raises(depthkv.Error, match="is a directory, not a model file"):
        depthkv.Engine(tmp_path)
    with pytest.raises(depthkv.Error, match="is not a model file of a known format"):
        depthkv.Engine(data_path("models/stories260K/tok512.bin"))
    with pytest.raises(depthkv.Error, match="n_threads must be in \\[0, 1024\\]"):
        depthkv.Engine(STORIES_BIN, n_threads=-1)
    with pytest.raises(depthkv.Error, match="chunk must be >= 1, got 0"):
        depthkv.Engine(STORIES_BIN, chunk=0)
    with pytest.raises(depthkv.Error, match="KV type must be f16 or f32, got 'f8'"):
        depthkv.Engine(STORIES_BIN, kv_type="f8")
    # a llama2.c model without tok512.bin beside it: no tokenizer, generation still runs
    lone = tmp_path / "stories260K.bin"
    shutil.copy(STORIES_BIN, lone)
    e = depthkv.Engine(lone)
    assert e.tokenizer_source is None and e.bos_id is None
    with pytest.raises(depthkv.Error, match="has no tokenizer"):
        e.tokenize("Once upon a time")
    assert len(e.generate([1, 403, 407], 3).tokens) == 3
    e2 = depthkv.Engine(lone, tokenizer=os.path.join(STORIES_DIR, "tok512.bin"))
    assert e2.tokenize("Once") == depthkv.Engine(STORIES_BIN).tokenize("Once")


def test_bad_generation_inputs_raise(stories):
    ids = stories.tokenize("Once upon a time")
    cases = [
        (([], 4), "prompt_ids holds no tokens"),
        (([1, 600, 3], 4), "token 600 at position 1 is outside the vocabulary of 512"),
        (([1, -5], 4), "token -5 at position 1 is outside the vocabulary of 512"),
        (([1, 2**40], 4), "token 1099511627776 at position 1 is not a token id"),
        (([1, 2**70], 4), "token 1180591620717411303424 at position 1 is not a token id"),
        (([1, 2.5], 4), "token 2.5 at position 1 is not an integer"),
        (("Once upon a time", 4), "got text"),
        (([[1, 2]], 4), "1-D sequence"),
        ((ids, -1), "max_new_tokens must be >= 0, got -1"),
        ((ids, 512 - len(ids) + 2), f"need {512 + 1} positions, beyond the model's context of 512"),
        ((ids, 1.5), "max_new_tokens must be an integer"),
    ]
    for args, msg in cases:
        with pytest.raises(depthkv.Error, match=re.escape(msg)):
            stories.generate(*args)
    assert len(stories.generate(ids, 512 - len(ids) + 1).tokens) <= 512 - len(ids) + 1  # the longest that fits
    assert stories.generate(ids, 0).tokens == []
    with pytest.raises(depthkv.Error, match="outside the vocabulary|out of range"):
        stories.detokenize([1, 9999])


def test_bad_specs_profiles_and_presets_raise(stories):
    ids = stories.tokenize("Once upon a time there was a little girl named Lily. She loved to play.")
    base = {"sinks": 4, "recent": 16, "obs_window": 16, "kernel": 7, "pooling": "max", "scorer": "snapkv",
            "budget": {"keep": 0.3}}
    prof = depthkv.load_profile(STORIES)
    cases = [
        (dict(spec={"sinks": 4}), "bad selection settings in 'spec'"),
        (dict(spec=dict(base, scorer="nope")), "nope"),
        (dict(spec=dict(base, budget={"keep": 1.5})), "bad selection settings in 'spec'"),
        (dict(spec=dict(base, kernel=4)), "kernel"),
        (dict(spec="snapkv"), "spec must be a dict"),
        (dict(spec=dict(base, policy="optimal")), "optimal"),  # no profile: no curves
        (dict(spec=dict(base, policy="optimal"), profile=depthkv.load_profile(AIDREAMS_BEST)),
         "the profile is of another model: it has 4 layers, the model 5"),
        (dict(spec=dict(base, policy="optimal"), profile="stories260K.profile.json"), "must be a depthkv.Profile"),
        (dict(spec=base, preset="nope"), "nope"),
        (dict(preset="best"), "pass spec=depthkv.preset('best'"),
    ]
    cases.append((dict(spec=base, profile=depthkv.load_profile(SMOL_PROFILE)), "it has 30 layers, the model 5"))
    for kw, msg in cases:
        with pytest.raises(depthkv.Error, match=re.escape(msg)):
            stories.generate(ids, 4, **kw)
    # the stories260K.bin profile on the GGUF conversion of the same model: another file, refused as the CLI does
    gguf = depthkv.Engine(data_path("models/stories260K/stories260K.gguf"))
    with pytest.raises(depthkv.Error, match="the profile was measured on another model"):
        gguf.generate(ids, 4, spec=dict(base, policy="optimal"), profile=prof)
    # the engine still serves after every refusal
    assert stories.generate(ids, 4, spec=dict(base, policy="optimal"), profile=prof).report["pruned"]


def test_span_pooling_keeps_words_and_numbers_whole(stories):
    """spec span_pooling: the prompt's words and digit runs are kept or dropped whole (one per head
    may straddle the budget's edge); the report's spec says so; the CLI's --span-pooling agrees."""
    text = ("Once upon a time there was a girl named Lily. Her number was 7017563 and her friend's was 3846855. "
            "She liked to play in the park with her dog. ") * 3
    ids = stories.tokenize(text)
    spec = {"sinks": 4, "recent": 16, "obs_window": 16, "kernel": 7, "pooling": "max", "scorer": "snapkv",
            "budget": {"keep": 0.4}, "span_pooling": True}
    g = stories.generate(ids, 8, spec=spec)
    assert g.report["spec"]["span_pooling"] is True
    plain = stories.generate(ids, 8, spec=dict(spec, span_pooling=False))
    assert "span_pooling" not in plain.report["spec"]
    assert g.report["budgets"] == plain.report["budgets"]  # the same budgets, other tokens
    with pytest.raises(depthkv.Error, match="span_pooling' must be a boolean"):
        stories.generate(ids, 8, spec=dict(spec, span_pooling=1))
