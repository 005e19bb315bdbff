"""depthkv.cuda: the CUDA kernels on torch CUDA tensors.

Without a GPU (CI): the extension is built when nvcc was found (DEPTHKV_REQUIRE_CUDA_BUILD=1, set
by scripts/python-test.sh when nvcc is on PATH), and every argument check raises depthkv.Error
before anything is launched. On a GPU (scripts/gpu_check.sh runs this file): scores, eviction and
paged compaction against the CPU library (TokenScorer, select_keep) and a numpy reference, and bad
input (NaN scores, bad tables) that raises and leaves everything unchanged.

Runs under pytest, or alone (``python3 test_cuda.py``: every test function, skips reported), so a
GPU machine without pytest can run it.
"""

import os

import numpy as np

try:
    import pytest
except ImportError:  # run alone on a GPU machine without pytest
    pytest = None

import depthkv
import depthkv.cuda as dc

try:
    import torch
except ImportError:
    torch = None


#: run alone (python3 test_cuda.py): skips are reported by the runner at the end, not by pytest
STANDALONE = __name__ == "__main__"


class Skip(Exception):
    pass


def skip(msg):
    if pytest is not None and not STANDALONE:
        pytest.skip(msg)
    raise Skip(msg)


def need_torch():
    if torch is None:
        skip("torch is not installed")
    if not dc.built():
        skip("depthkv was built without CUDA")


def need_gpu():
    need_torch()
    if not (dc.is_available() and torch.cuda.is_available()):
        skip("no CUDA device")


def raises(fn, match):
    try:
        fn()
    except depthkv.Error as e:
        assert match in str(e), f"message {str(e)!r} lacks {match!r}"
        return
    raise AssertionError(f"no depthkv.Error (expected one with {match!r})")


# ---- without a GPU ---------------------------------------------------------------------------

def test_extension_built_where_nvcc_was_found():
    if os.environ.get("DEPTHKV_REQUIRE_CUDA_BUILD") != "1":
        skip("DEPTHKV_REQUIRE_CUDA_BUILD is not 1")
    assert dc.built(), "nvcc was on PATH at pip install time, but depthkv._cuda is missing"


def test_is_available_matches_torch():
    need_torch()
    assert dc.is_available() == (torch.cuda.device_count() > 0)


def test_host_tensors_are_refused_before_any_launch():
    need_torch()
    k = torch.zeros(2, 8, 4)
    raises(lambda: dc.evict(k, k, torch.zeros(2, 8), 4), "keys must be in CUDA memory")
    raises(lambda: dc.snapkv_scores(torch.zeros(2, 3, 8), 1), "probs must be in CUDA memory")
    raises(lambda: dc.h2o_accumulate(torch.zeros(2, 3, 8), torch.zeros(1, 8), 1), "probs must be in CUDA memory")
    blocks = torch.zeros(2, 4, 1, 4)
    ints = torch.zeros(1, 2, dtype=torch.int32)
    raises(lambda: dc.paged_compact(blocks, blocks, ints, ints, [3], [2]), "k_blocks must be in CUDA memory")


def test_bad_options_are_refused():
    need_torch()
    raises(lambda: dc.snapkv_scores(torch.zeros(2, 3, 8), 1, pooling="median"), "pooling must be")
    blocks = torch.zeros(2, 4, 1, 4)
    ints = torch.zeros(1, 2, dtype=torch.int32)
    raises(lambda: dc.paged_compact(blocks, blocks, ints, ints, [3], [2], layout="xyz"), "layout must be")
    raises(lambda: dc.evict(torch.zeros(2, 8, 4), torch.zeros(2, 8, 4), torch.zeros(2, 8), -1), "keep counts")


# ---- on a GPU --------------------------------------------------------------------------------

def random_probs(gen, h, q, n, dtype):
    p = torch.rand(h, q, n, generator=gen, dtype=torch.float32)
    p = p / p.sum(-1, keepdim=True)
    return p.to(dtype)


def test_scores_equal_the_cpu_scorer():
    need_gpu()
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        probs = random_probs(gen, 8, 5, 300, dtype)
        host = probs.float().numpy()  # the CPU scorer reads float32: the same values
        s = torch.zeros(4, 300, device="cuda")
        dc.h2o_accumulate(probs.cuda(), s, 4)
        ref = depthkv.TokenScorer("h2o", 8, 4)
        ref.observe(host)
        np.testing.assert_array_equal(s.cpu().numpy(), ref.scores())
        for pooling in ("max", "avg", "none"):
            g = dc.snapkv_scores(probs.cuda(), 4, kernel=7, pooling=pooling)
            ref = depthkv.TokenScorer("snapkv", 8, 4, window=5, kernel=7, pooling=pooling)
            ref.observe(host)
            np.testing.assert_array_equal(g.cpu().numpy(), ref.scores(300), err_msg=f"{dtype} {pooling}")


def test_bad_probabilities_raise_and_leave_scores_unchanged():
    need_gpu()
    probs = torch.full((2, 3, 16), 0.1, device="cuda")
    probs[1, 2, 5] = float("nan")
    s = torch.ones(1, 16, device="cuda")
    raises(lambda: dc.h2o_accumulate(probs, s, 1), "NaN, infinite or negative")
    assert torch.equal(s, torch.ones(1, 16, device="cuda"))
    raises(lambda: dc.snapkv_scores(probs, 1), "NaN, infinite or negative")


def test_evict_equals_select_keep_and_gathers_the_rows():
    need_gpu()
    gen = torch.Generator().manual_seed(2)
    layers, heads, n, d = 3, 4, 700, 16
    keep = np.array([[40, 100, 699, 800], [20, 20, 300, 64], [700, 50, 21, 33]])
    for kv_dtype, score_dtype in ((torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16),
                                  (torch.float32, torch.float16)):
        keys = torch.randn(layers, heads, n, d, generator=gen).to(kv_dtype)
        values = torch.randn(layers, heads, n, d, generator=gen).to(kv_dtype)
        scores = torch.randint(0, 50, (layers, heads, n), generator=gen).to(score_dtype)  # many ties
        r = dc.evict(keys.cuda(), values.cuda(), scores.cuda(), keep, protection=(4, 16))
        assert r.n_kept.tolist() == np.minimum(keep, n).reshape(-1).tolist()
        for li in range(layers):
            for h in range(heads):
                kept = depthkv.select_keep(scores[li, h], int(keep[li, h]), (4, 16))
                m = len(kept)
                assert r.kept_slots[li, h, :m].cpu().numpy().tolist() == kept.tolist()
                idx = torch.as_tensor(kept, dtype=torch.long)
                assert torch.equal(r.keys[li, h, :m].cpu(), keys[li, h, idx])
                assert torch.equal(r.values[li, h, :m].cpu(), values[li, h, idx])


def test_evict_refuses_bad_input_and_changes_nothing():
    need_gpu()
    keys = torch.randn(2, 64, 8, device="cuda")
    values = torch.randn(2, 64, 8, device="cuda")
    scores = torch.rand(2, 64, device="cuda")
    before = (keys.clone(), values.clone(), scores.clone())
    raises(lambda: dc.evict(keys, values, scores, [10, 3], protection=(4, 4)), "protected")
    raises(lambda: dc.evict(keys, values[:, :, :4].contiguous(), scores, 10), "values must have keys' shape")
    raises(lambda: dc.evict(keys, values, scores.t().contiguous().t(), 10), "C-contiguous")
    raises(lambda: dc.evict(keys, values, scores.double(), 10), "float32, float16 or bfloat16")
    raises(lambda: dc.evict(keys, values, scores, 40, capacity=20), "exceed the output capacity")
    bad = scores.clone()
    bad[1, 7] = float("nan")
    raises(lambda: dc.evict(keys, values, bad, 10), "NaN")
    for a, b in zip((keys, values, scores), before):
        assert torch.equal(a, b)


def paged_reference(pool, tables, kept, n_kept, block_size, hib):
    out = pool.clone()
    for h in range(tables.shape[0]):
        for i in range(int(n_kept[h])):
            s = int(kept[h, i])
            src = pool[tables[h, s // block_size], s % block_size, hib[h]]
            out[tables[h, i // block_size], i % block_size, hib[h]] = src
    return out


def test_paged_compact_equals_the_reference_and_refuses_bad_tables():
    need_gpu()
    gen = torch.Generator().manual_seed(3)
    num_blocks, bs, kvh, d = 12, 4, 2, 8
    kb = torch.randn(num_blocks, bs, kvh, d, generator=gen)
    vb = torch.randn(num_blocks, bs, kvh, d, generator=gen)
    tables = torch.tensor([[3, 7, 1, 0], [5, 2, 9, 11]], dtype=torch.int32)
    n, n_kept, hib = [14, 16], [6, 9], [0, 1]
    kept = torch.tensor([[0, 2, 3, 8, 11, 13, 0, 0, 0], [1, 2, 4, 5, 6, 9, 12, 14, 15]], dtype=torch.int32)
    k_ref = paged_reference(kb, tables, kept, n_kept, bs, hib)
    v_ref = paged_reference(vb, tables, kept, n_kept, bs, hib)
    kd, vd = kb.cuda(), vb.cuda()
    dc.paged_compact(kd, vd, tables.cuda(), kept.cuda(), n, n_kept, head_in_block=hib)
    assert torch.equal(kd.cpu(), k_ref) and torch.equal(vd.cpu(), v_ref)
    kd, vd = kb.cuda(), vb.cuda()
    bad = kept.clone()
    bad[1, 3] = bad[1, 2]  # not strictly ascending
    raises(lambda: dc.paged_compact(kd, vd, tables.cuda(), bad.cuda(), n, n_kept, head_in_block=hib), "ascending")
    assert torch.equal(kd.cpu(), kb)
    bad_tables = tables.clone()
    bad_tables[0, 1] = num_blocks
    raises(lambda: dc.paged_compact(kd, vd, bad_tables.cuda(), kept.cuda(), n, n_kept, head_in_block=hib), "outside")
    assert torch.equal(kd.cpu(), kb) and torch.equal(vd.cpu(), vb)


if __name__ == "__main__":
    failed = 0
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print(f"PASS {name}")
            except Skip as e:
                print(f"SKIP {name}: {e}")
            except Exception as e:  # noqa: BLE001 - report every failure
                failed += 1
                print(f"FAIL {name}: {type(e).__name__}: {e}")
    print(f"{'FAIL' if failed else 'PASS'} test_cuda.py: {failed} failed")
    raise SystemExit(1 if failed else 0)
