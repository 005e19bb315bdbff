"""depthkv.TokenScorer (the library's scorers over attention arrays) and depthkv.keep_tokens, against
numpy references of the formulas in include/depthkv/token_scorer.hpp, and their input checks."""

import numpy as np
import pytest

import depthkv

H, HKV, NQ, N = 4, 2, 5, 9  # query heads, KV heads (groups of 2), observed queries, slots


def probs(seed=0, h=H, nq=NQ, n=N):
    """Random rows that sum to 1 (attention probabilities), float32 [h, nq, n]."""
    p = np.random.default_rng(seed).random((h, nq, n)).astype(np.float32)
    return p / p.sum(-1, keepdims=True)


def group_sum(x):
    """[H, ...] -> [HKV, ...]: the sum over each KV head's query heads."""
    return x.reshape(HKV, H // HKV, *x.shape[1:]).sum(1)


def test_h2o_is_the_column_sum():
    p = np.zeros((2, 2, 3), np.float32)  # 2 query heads on 1 KV head, by hand
    p[0] = [[1, 0, 0], [0.5, 0.5, 0]]
    p[1] = [[0.25, 0.75, 0], [0, 0, 1]]
    s = depthkv.TokenScorer("h2o", 2, 1)
    s.observe(p)
    assert s.scores().tolist() == [[1.75, 1.25, 1.0]]
    p = probs()
    s = depthkv.TokenScorer("h2o", H, HKV)
    s.observe(p)
    np.testing.assert_allclose(s.scores(), group_sum(p.sum(1)), rtol=1e-6)
    assert s.scores().dtype == np.float32 and s.scores().shape == (HKV, N)


def test_observing_in_chunks_equals_at_once():
    p = probs(1)
    a = depthkv.TokenScorer("h2o", H, HKV)
    a.observe(p)
    b = depthkv.TokenScorer("h2o", H, HKV)
    b.observe(np.ascontiguousarray(p[:, :2]), q_pos0=0)
    b.observe(p[:, 2:], q_pos0=2)  # a strided view: rows and heads may be strided
    for q in range(H):  # per query head, 2-D
        c = depthkv.TokenScorer("h2o", H, HKV) if q == 0 else c
        c.observe(p[q], q_pos0=0, q_head=q)
    np.testing.assert_allclose(a.scores(), b.scores(), rtol=1e-6)  # float sums in another order
    np.testing.assert_array_equal(a.scores(), c.scores())


def pool(u, kernel, how):
    """SnapKV's pooling along the slots (token_scorer.hpp): max clipped at the edges, avg with zero padding."""
    r = kernel // 2
    out = np.zeros_like(u)
    for j in range(u.shape[-1]):
        win = u[..., max(0, j - r):j + r + 1]
        out[..., j] = win.max(-1) if how == "max" else win.sum(-1) / kernel if how == "avg" else u[..., j]
    return out


@pytest.mark.parametrize("pooling", ["max", "avg", "none"])
def test_snapkv_pools_the_window_sums(pooling):
    p = probs(2)
    s = depthkv.TokenScorer("snapkv", H, HKV, window=2, kernel=3, pooling=pooling)
    s.observe(p)
    u = group_sum(p[:, -2:].sum(1))  # the last 2 positions
    np.testing.assert_allclose(s.scores(), pool(u, 3, pooling), rtol=1e-6)
    s.reset()
    s.observe(p[:, -2:], q_pos0=NQ - 2)  # only the window: the same scores
    np.testing.assert_allclose(s.scores(), pool(u, 3, pooling), rtol=1e-6)


def test_tova_and_value_and_key_scorers():
    p = probs(3)
    rng = np.random.default_rng(4)
    k = rng.standard_normal((HKV, N, 8)).astype(np.float32)
    v = rng.standard_normal((HKV, N, 8)).astype(np.float32)
    t = depthkv.TokenScorer("tova", H, HKV)
    t.observe(p)
    np.testing.assert_allclose(t.scores(), group_sum(p[:, -1]), rtol=1e-6)
    for name, norm in (("h2o-v1", 1), ("h2o-v2", 2)):
        s = depthkv.TokenScorer(name, H, HKV)
        s.observe(p)
        ref = np.linalg.norm(v, ord=norm, axis=-1) * group_sum(p.sum(1))
        np.testing.assert_allclose(s.scores(values=v), ref, rtol=1e-5)
        with pytest.raises(depthkv.Error, match=f"scorer {name} reads the values"):
            s.scores()
    kn = depthkv.TokenScorer("knorm", H, HKV)
    np.testing.assert_allclose(kn.scores(keys=k), -np.linalg.norm(k, axis=-1), rtol=1e-6)
    with pytest.raises(depthkv.Error, match="knorm reads the keys"):
        kn.scores(N)
    # keydiff: -cos(K_j, mean of the unit keys), as kvpress's KeyDiffPress
    kd = depthkv.TokenScorer("keydiff", H, HKV)
    unit = k / np.linalg.norm(k, axis=-1, keepdims=True)
    anchor = unit.mean(axis=1, keepdims=True)
    ref = -(unit * anchor).sum(-1) / np.linalg.norm(anchor, axis=-1)
    np.testing.assert_allclose(kd.scores(keys=k), ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(depthkv.Error, match="keydiff reads the keys"):
        kd.scores(N)


def test_output_aware_rescales_by_the_value_contribution():
    p = probs(5)
    rng = np.random.default_rng(6)
    hd, dim = 4, 6
    v = rng.standard_normal((HKV, N, hd)).astype(np.float32)
    wo = rng.standard_normal((dim, H * hd)).astype(np.float32)
    s = depthkv.TokenScorer("h2o", H, HKV, output_aware=True)
    s.observe(p)
    g = H // HKV
    norms = np.zeros((HKV, N))
    for h in range(HKV):
        for q in range(h * g, (h + 1) * g):
            norms[h] += np.abs(v[h] @ wo[:, q * hd:(q + 1) * hd].T).sum(-1) / g
    ref = (group_sum(p.sum(1)) + 1e-4) * norms
    np.testing.assert_allclose(s.scores(values=v, wo=wo), ref, rtol=1e-5)
    with pytest.raises(depthkv.Error, match="output projection"):
        s.scores(values=v)


def test_sizes_per_head_and_unobserved_slots():
    p = probs(7)
    s = depthkv.TokenScorer("h2o", H, HKV)
    s.observe(p)
    wide = s.scores(N + 3)  # slots past the observed ones score 0
    assert wide.shape == (HKV, N + 3) and (wide[:, N:] == 0).all()
    rows = s.scores([N, N + 1])
    assert isinstance(rows, list) and [len(r) for r in rows] == [N, N + 1]
    with pytest.raises(depthkv.Error, match="observed"):
        s.scores(N - 1)
    assert s.observed_size(0) == N
    s.reset()
    assert s.observed_size(0) == 0 and s.scores().shape == (HKV, 0)


def test_bad_input_raises_and_leaves_the_scorer_unchanged():
    p = probs(8)
    s = depthkv.TokenScorer("h2o", H, HKV)
    s.observe(p)
    before = s.scores()
    bad = p.copy()
    bad[3, 1, 2] = np.nan  # the last head: the earlier heads must not have been added
    with pytest.raises(depthkv.Error, match="probability nan is not finite"):
        s.observe(bad, q_pos0=NQ)
    bad[3, 1, 2] = -0.5
    with pytest.raises(depthkv.Error, match="not finite and >= 0"):
        s.observe(bad, q_pos0=NQ)
    with pytest.raises(depthkv.Error, match="float32, got float64"):
        s.observe(p.astype(np.float64), q_pos0=NQ)
    with pytest.raises(depthkv.Error, match=r"3 dimensions \[n_heads, n_queries, n_keys\], got 2"):
        s.observe(p[0], q_pos0=NQ)
    with pytest.raises(depthkv.Error, match="probs has 2 query heads, the scorer 4"):
        s.observe(p[:2], q_pos0=NQ)
    with pytest.raises(depthkv.Error, match="contiguous in its last dimension"):
        s.observe(p[:, :, ::2], q_pos0=NQ)
    with pytest.raises(depthkv.Error, match="precedes the last observed position"):
        s.observe(p, q_pos0=0)
    with pytest.raises(depthkv.Error, match="must be an array"):
        s.observe(p.tolist(), q_pos0=NQ)
    with pytest.raises(depthkv.Error, match="q_head 9 outside"):
        s.observe(p[0], q_pos0=NQ, q_head=9)
    np.testing.assert_array_equal(s.scores(), before)
    with pytest.raises(depthkv.Error, match="keys/values have 3 KV heads, the scorer 2"):
        s.scores(keys=np.zeros((3, N, 4), np.float32))
    with pytest.raises(depthkv.Error, match="keys and values must have the same shape"):
        s.scores(keys=np.zeros((2, N, 4), np.float32), values=np.zeros((2, N, 5), np.float32))


def test_bad_settings():
    with pytest.raises(depthkv.Error, match="unknown scorer kind 'snap'"):
        depthkv.TokenScorer("snap", H, HKV)
    with pytest.raises(depthkv.Error, match="positive multiple of n_kv_heads"):
        depthkv.TokenScorer("h2o", 3, 2)
    with pytest.raises(depthkv.Error, match="kernel must be odd"):
        depthkv.TokenScorer("snapkv", H, HKV, kernel=4)
    with pytest.raises(depthkv.Error, match="unknown pooling"):
        depthkv.TokenScorer("snapkv", H, HKV, pooling="mean")
    with pytest.raises(depthkv.Error, match="output-aware scoring applies to h2o, snapkv and tova, not knorm"):
        depthkv.TokenScorer("knorm", H, HKV, output_aware=True)
    s = depthkv.TokenScorer("snapkv", H, HKV, window=8, kernel=5, pooling="avg")
    assert (s.scorer, s.window, s.kernel, s.pooling, s.n_heads, s.n_kv_heads) == ("snapkv", 8, 5, "avg", H, HKV)


def test_torch_tensors_are_read_in_place():
    torch = pytest.importorskip("torch")
    p = probs(9)
    a = depthkv.TokenScorer("h2o", H, HKV)
    a.observe(p)
    b = depthkv.TokenScorer("h2o", H, HKV)
    b.observe(torch.from_numpy(p).requires_grad_())  # detached, not copied
    np.testing.assert_array_equal(a.scores(), b.scores())


def test_keep_tokens():
    assert depthkv.keep_tokens(0.2, 384, (4, 16)) == 77  # round(76.8)
    assert depthkv.keep_tokens(0.05, 384, (4, 16)) == 20  # round(19.2) = 19 < the 20 protected
    assert depthkv.keep_tokens(1.0, 384) == 384 and depthkv.keep_tokens(0.5, 10, (8, 8)) == 10
    with pytest.raises(depthkv.Error, match="keep ratio must be >= 0"):
        depthkv.keep_tokens(-0.1, 10)


def _rows(rng, h, q, n):
    p = rng.random((h, q, n)).astype(np.float32)
    return p / p.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("kind", ["snapkv", "h2o"])
def test_context_weight_adds_the_context_window(kind):
    """The preset's combined scores: the lookahead's scores plus w * (L / C) times the context
    window's SnapKV scores, per KV head (checked against two separate scorers)."""
    rng = np.random.default_rng(7)
    ctx, look = _rows(rng, 4, 6, 10), _rows(rng, 4, 2, 10)
    w = 0.5
    comb = depthkv.TokenScorer(kind, 4, 2, window=3, lookahead=2, context_weight=w)
    assert comb.context_weight == w
    comb.observe(ctx, 0)
    comb.begin_lookahead()
    comb.observe(look, 6)
    only_look = depthkv.TokenScorer(kind, 4, 2, window=3, lookahead=2)
    only_look.observe(look, 6)
    window = depthkv.TokenScorer("snapkv", 4, 2, window=3)
    window.observe(ctx, 0)
    l, c = only_look.scores(10).astype(np.float64), window.scores(10).astype(np.float64)
    expect = l + w * (l.sum(axis=1, keepdims=True) / c.sum(axis=1, keepdims=True)) * c
    np.testing.assert_allclose(comb.scores(10), expect, rtol=1e-6)
    assert not np.allclose(comb.scores(10), l, rtol=1e-3)  # the context part counts


def test_context_weight_needs_a_lookahead_and_a_finite_weight():
    with pytest.raises(depthkv.Error, match="needs a lookahead"):
        depthkv.TokenScorer("snapkv", 4, 2, context_weight=0.25)
    with pytest.raises(depthkv.Error, match="context_weight"):
        depthkv.TokenScorer("snapkv", 4, 2, lookahead=4, context_weight=-1.0)
