"""depthkv.select_keep: the evictor's ranking rule on arrays, against hand-checked cases and a
naive reference (protected slots, then (score desc, position asc) among the others)."""

import numpy as np
import pytest

import depthkv


def reference(scores, k, prot, positions=None):
    n = len(scores)
    if k >= n:
        return list(range(n))
    lo = min(prot[0], n)
    hi = max(lo, n - min(prot[1], n))
    pos = list(range(n)) if positions is None else [int(p) for p in positions]
    middle = sorted(range(lo, hi), key=lambda i: (-float(scores[i]), pos[i], i))
    return sorted(list(range(lo)) + middle[: k - lo - (n - hi)] + list(range(hi, n)))


def test_hand_checked_cases():
    s = np.array([3, 1, 2, 5, 4, 0], dtype=np.float32)
    assert depthkv.select_keep(s, 3).tolist() == [0, 3, 4]            # the three best
    assert depthkv.select_keep(s, 3, (1, 1)).tolist() == [0, 3, 5]    # slot 0 and 5 protected, then 5.0
    assert depthkv.select_keep(s, 6).tolist() == list(range(6))        # k >= n keeps all
    assert depthkv.select_keep(s, 9).tolist() == list(range(6))
    assert depthkv.select_keep(s, 0).tolist() == []
    ties = np.array([1, 7, 7, 7, 1], dtype=np.float32)
    assert depthkv.select_keep(ties, 2).tolist() == [1, 2]             # equal scores: the earlier stays
    # positions decide ties: slot 3 has the earliest position
    assert depthkv.select_keep(ties, 2, positions=np.array([0, 9, 8, 2, 4], np.int32)).tolist() == [2, 3]
    zeros = np.array([0.0, -0.0, 0.0], dtype=np.float32)               # -0.0 == +0.0
    assert depthkv.select_keep(zeros, 1).tolist() == [0]
    inf = np.array([-np.inf, 1, np.inf, 2], dtype=np.float32)
    assert depthkv.select_keep(inf, 2).tolist() == [2, 3]


def test_matrix_and_per_head_keep():
    s = np.array([[3, 1, 2, 5, 4, 0], [0, 9, 8, 7, 6, 5]], dtype=np.float32)
    m = depthkv.select_keep(s, 3, (1, 1))
    assert m.dtype == np.int32 and m.tolist() == [[0, 3, 5], [0, 1, 5]]
    rows = depthkv.select_keep(s, [2, 4], (1, 1))
    assert [r.tolist() for r in rows] == [[0, 5], [0, 1, 2, 5]]


@pytest.mark.parametrize("seed", range(20))
def test_equals_the_naive_reference(seed):
    rng = np.random.default_rng(seed)
    heads, n = int(rng.integers(1, 5)), int(rng.integers(0, 300))
    scores = rng.integers(0, 6, size=(heads, n)).astype(np.float32)   # many ties
    prot = (int(rng.integers(0, 8)), int(rng.integers(0, 8)))
    positions = np.stack([rng.permutation(n) for _ in range(heads)]).astype(np.int32)
    k = int(rng.integers(min(n, prot[0] + prot[1]), n + 2))
    got = depthkv.select_keep(scores, k, prot, positions=positions)
    for h in range(heads):
        assert got[h].tolist() == reference(scores[h], k, prot, positions[h])
    got = depthkv.select_keep(scores, k, prot)
    for h in range(heads):
        assert got[h].tolist() == reference(scores[h], k, prot)


def test_float16_ranks_as_float32():
    rng = np.random.default_rng(7)
    s = rng.standard_normal((3, 200)).astype(np.float16)
    assert np.array_equal(depthkv.select_keep(s, 50, (4, 16)), depthkv.select_keep(s.astype(np.float32), 50, (4, 16)))


def test_arrays_are_read_in_place():
    s = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    s.setflags(write=False)                          # read-only arrays are accepted
    strided = s[::2]                                 # rows strided, each row contiguous: no copy needed
    assert not strided.flags.c_contiguous
    assert np.array_equal(depthkv.select_keep(strided, 10), depthkv.select_keep(np.ascontiguousarray(strided), 10))


@pytest.mark.parametrize("bad, message", [
    (lambda: depthkv.select_keep(np.array([1, np.nan, 2], np.float32), 2), "NaN score at slot 1"),
    (lambda: depthkv.select_keep(np.array([[1, 2, 3], [1, 2, np.nan]], np.float32), 2), "head 1: NaN score at slot 2"),
    (lambda: depthkv.select_keep(np.zeros(4), 2), "scores must be float32, float16 or bfloat16, got float64"),
    (lambda: depthkv.select_keep(np.zeros(4, np.int32), 2), "got int32"),
    (lambda: depthkv.select_keep(np.zeros((2, 8), np.float32)[:, ::2], 2), "contiguous in its last dimension"),
    (lambda: depthkv.select_keep(np.zeros((2, 2, 4), np.float32), 2), "1 or 2 dimension\\(s\\), got 3"),
    (lambda: depthkv.select_keep(np.float32(1.0), 1), "1 or 2 dimension\\(s\\), got 0"),
    (lambda: depthkv.select_keep(np.zeros(4, np.float32), 1, (1, 1)), "keep 1 < 2 protected tokens"),
    (lambda: depthkv.select_keep(np.zeros(4, np.float32), -1), "keep count must be in"),
    (lambda: depthkv.select_keep(np.zeros((2, 4), np.float32), [1, 2, 3]), "k has 3 entries for 2 heads"),
    (lambda: depthkv.select_keep(np.zeros(4, np.float32), 2, (-1, 0)), "protection must be >= 0"),
    (lambda: depthkv.select_keep(np.zeros(4, np.float32), 2, (1,)), "protection must be \\(n_sink, n_recent\\)"),
    (lambda: depthkv.select_keep(np.zeros(4, np.float32), 2, positions=np.arange(4)), "positions must be int32"),
    (lambda: depthkv.select_keep(np.zeros(4, np.float32), 2, positions=np.arange(3, dtype=np.int32)),
     "positions have shape 3, scores 4"),
    (lambda: depthkv.select_keep([1.0, 2.0], 1), "scores must be an array"),
])
def test_bad_input_raises_error(bad, message):
    with pytest.raises(depthkv.Error, match=message) as e:
        bad()
    assert isinstance(e.value, ValueError)
    assert str(e.value).startswith("select_keep: ") or "protection" in str(e.value)


class _DLPackOnly:
    """A DLPack producer that is not a numpy array (as a torch CPU tensor is)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, *args, **kwargs):
        return self._a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_producers_are_accepted():
    s = np.random.default_rng(2).standard_normal((4, 100)).astype(np.float32)
    assert np.array_equal(depthkv.select_keep(_DLPackOnly(s), 30, (4, 16)), depthkv.select_keep(s, 30, (4, 16)))
    with pytest.raises(depthkv.Error, match="got float64"):
        depthkv.select_keep(_DLPackOnly(s.astype(np.float64)), 30)
