"""depthkv's CUDA kernels on torch CUDA tensors: token scores from attention probabilities, the
batched top-k eviction and the paged compaction (include/depthkv/cuda/*.cuh, where the formulas
and contracts are), run on the tensors' device and torch's current stream, with no copy of the
tensors. The extension (``depthkv._cuda``) is built by ``pip install .`` when a CUDA compiler is
found; it links the CUDA runtime statically and needs only the driver.

>>> import torch, depthkv.cuda as dc
>>> dc.is_available()
True
>>> s = dc.snapkv_scores(probs, n_kv_heads=8)          # probs: [32, window, n] on the GPU
>>> r = dc.evict(keys, values, s, keep=410, protection=(4, 16))  # keys/values: [8, n, 128]
>>> r.keys.shape, r.n_kept                              # [8, 410, 128], per-head kept counts

Every function checks its arrays (CUDA device, one device for all, dtype, shape, C-contiguity)
and raises :class:`depthkv.Error` before launching anything. A NaN, infinite or negative
probability, and a NaN score, are found by the kernels and raise :class:`depthkv.Error` after a
synchronisation (``check=False`` skips the check and the synchronisation); the outputs are then
not used and in-place arguments are restored, so a failed call changes nothing. The ranking rule
is the CPU evictor's (:func:`depthkv.select_keep`): protected sinks and recent window always kept,
the others by score descending, then position ascending.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import numpy as np

from ._core import Error

try:
    from . import _cuda
except ImportError:  # built without a CUDA compiler
    _cuda = None

__all__ = ["built", "is_available", "h2o_accumulate", "snapkv_scores", "evict", "EvictResult", "paged_compact"]

#: ScoreStatus / EvictStatus / PagedCompactStatus bits (include/depthkv/cuda/*.cuh).
_BAD_PROBABILITY = 1
_NAN_SCORE = 1
_BAD_ROW = 4
_POOLING = {"none": 0, "max": 1, "avg": 2}


def built() -> bool:
    """Whether this installation has the CUDA extension (a CUDA compiler was found at build time)."""
    return _cuda is not None


def is_available() -> bool:
    """Whether the CUDA kernels can run here: the extension is built and a CUDA device is visible."""
    return _cuda is not None and _cuda.device_count() > 0


def _torch():
    if _cuda is None:
        raise Error("depthkv.cuda: this depthkv was built without CUDA (no CUDA compiler at pip install time)")
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is how CUDA tensors arrive
        raise Error("depthkv.cuda: needs torch for its CUDA tensors") from e
    return torch


def _stream(t) -> int:
    torch = _torch()
    if not isinstance(t, torch.Tensor) or not t.is_cuda:
        return 0  # the binding's checks name the argument that is not in CUDA memory
    return int(torch.cuda.current_stream(t.device).cuda_stream)


def _status(like):
    return _torch().zeros(1, dtype=_torch().int32, device=like.device if hasattr(like, "device") else "cpu")


def _bytes(n: int, like):
    return _torch().empty(max(int(n), 1), dtype=_torch().uint8, device=like.device if hasattr(like, "device") else "cpu")


def h2o_accumulate(probs, scores, n_kv_heads: int, *, check: bool = True):
    """H2O: ``scores[h, j] += sum`` of slot j's probabilities over query head group h and the
    queries of ``probs`` (``depthkv::cuda::AccumulateH2O``; bit-identical to
    :class:`depthkv.TokenScorer` ``"h2o"`` fed the same rows).

    :param probs: CUDA float32/float16/bfloat16 tensor [n_heads, n_queries, n], C-contiguous
    :param scores: CUDA float32 tensor [n_kv_heads, >= n], accumulated in place
    :return: ``scores``
    :raises Error: on a bad device, dtype, shape or layout; on a NaN, infinite or negative
        probability (with ``check``; ``scores`` is restored)
    """
    torch = _torch()
    saved = scores.clone() if check and isinstance(scores, torch.Tensor) else None
    status = _status(probs)
    _cuda.h2o_accumulate(probs, scores, int(n_kv_heads), status, _stream(probs))
    if check and int(status.item()) & _BAD_PROBABILITY:
        scores.copy_(saved)
        raise Error("cuda.h2o_accumulate: probs contain a NaN, infinite or negative probability")
    return scores


def snapkv_scores(probs, n_kv_heads: int, *, kernel: int = 7, pooling: str = "max", check: bool = True):
    """SnapKV: per KV head, the window queries' probabilities summed over the group's query heads
    and the queries, then pooled along the slots (``depthkv::cuda::SnapKVScores``; bit-identical
    to :class:`depthkv.TokenScorer` ``"snapkv"`` over the same window rows).

    :param probs: CUDA float32/float16/bfloat16 tensor [n_heads, window, n], C-contiguous
    :param kernel: pooling width (odd); :param pooling: "max", "avg" or "none"
    :return: float32 CUDA tensor [n_kv_heads, n]
    :raises Error: on a bad device, dtype, shape, layout, kernel or pooling; on a NaN, infinite or
        negative probability (with ``check``)
    """
    torch = _torch()
    if pooling not in _POOLING:
        raise Error(f"cuda.snapkv_scores: pooling must be 'none', 'max' or 'avg', got {pooling!r}")
    n = int(probs.shape[-1]) if getattr(probs, "ndim", 0) == 3 else 0
    device = probs.device if isinstance(probs, torch.Tensor) else "cpu"
    scores = torch.empty((max(int(n_kv_heads), 0), n), dtype=torch.float32, device=device)
    ws = _bytes(_cuda.snapkv_workspace_bytes(max(int(n_kv_heads), 0), n, _POOLING[pooling]), probs)
    status = _status(probs)
    _cuda.snapkv_scores(probs, scores, int(n_kv_heads), int(kernel), _POOLING[pooling], ws, status, _stream(probs))
    if check and int(status.item()) & _BAD_PROBABILITY:
        raise Error("cuda.snapkv_scores: probs contain a NaN, infinite or negative probability")
    return scores


class EvictResult(NamedTuple):
    """What :func:`evict` returns: row r keeps ``n_kept[r]`` tokens, ``keys[r, :n_kept[r]]`` (and
    values, kept slots) in ascending slot order; entries past ``n_kept[r]`` are unspecified."""

    keys: object        #: [..., capacity, head_dim], the source dtype
    values: object      #: [..., capacity, head_dim]
    kept_slots: object  #: int32 [..., capacity], the kept source slots
    n_kept: np.ndarray  #: int32 [rows], min(keep, n) per row


def evict(keys, values, scores, keep, *, protection: Sequence[int] = (0, 0), capacity: Optional[int] = None,
          check: bool = True) -> EvictResult:
    """Top-k eviction of every row, out of place, in one launch (``depthkv::cuda::Evict``): row r
    (any leading dimensions of ``keys``: e.g. [layers, kv_heads]) keeps ``keep[r]`` of its n
    tokens (protected ones included; keep >= n keeps all) by the CPU evictor's rule.

    :param keys, values: CUDA float32/float16/bfloat16 tensors [..., n, head_dim], C-contiguous
    :param scores: CUDA float32/float16/bfloat16 tensor [..., n], C-contiguous
    :param keep: one count for every row, or one per row (shape ``keys.shape[:-2]``)
    :param protection: (n_sink, n_recent)
    :param capacity: slots of the outputs (default: the largest kept count)
    :return: :class:`EvictResult`
    :raises Error: on a bad device, dtype, shape or layout, a keep below the protected count or
        above ``capacity``, NaN scores (with ``check``); the inputs are never modified
    """
    torch = _torch()
    n_sink, n_recent = (int(x) for x in protection)
    lead = tuple(keys.shape[:-2]) if getattr(keys, "ndim", 0) >= 2 else ()
    rows = int(np.prod(lead)) if lead else 1
    ks = np.ascontiguousarray(np.broadcast_to(np.asarray(keep, dtype=np.int64), lead).reshape(-1))
    if ks.size and (ks.min() < 0 or ks.max() > np.iinfo(np.int32).max):
        raise Error(f"cuda.evict: keep counts must lie in [0, 2^31 - 1], got {ks.min()}..{ks.max()}")
    ks = ks.astype(np.int32)
    n = int(keys.shape[-2]) if lead or getattr(keys, "ndim", 0) >= 2 else 0
    cap = int(capacity) if capacity is not None else int(min(ks.max(initial=0), n))
    device = keys.device if isinstance(keys, torch.Tensor) else "cpu"
    d = int(keys.shape[-1]) if getattr(keys, "ndim", 0) >= 2 else 0
    k_out = torch.empty(lead + (cap, d), dtype=keys.dtype, device=device)
    v_out = torch.empty(lead + (cap, d), dtype=keys.dtype, device=device)
    slots = torch.empty(lead + (cap,), dtype=torch.int32, device=device)
    ws = _bytes(_cuda.evict_workspace_bytes(rows, n), keys)
    rows_buf = _bytes(rows * _cuda.evict_row_bytes(), keys)
    status = _status(keys)
    n_kept = _cuda.evict(keys, values, scores, ks, k_out, v_out, slots, n_sink, n_recent, rows_buf, ws, status,
                         _stream(keys))
    if check and int(status.item()) & _NAN_SCORE:
        raise Error("cuda.evict: scores contain NaN")
    return EvictResult(k_out, v_out, slots, n_kept)


def _check_paged_inputs(torch, tables, kept, n, n_kept, num_blocks: int, block_size: int) -> None:
    """Table entries inside the pool and kept slots strictly ascending in [0, n) (checked on the
    device before the in-place move, so that no head is half moved)."""
    used = (torch.as_tensor(n, device=tables.device).clamp(min=0) + block_size - 1) // block_size
    cols = torch.arange(tables.shape[1], device=tables.device)
    in_use = cols[None, :] < used[:, None]
    bad_table = in_use & ((tables < 0) | (tables >= num_blocks))
    kc = torch.arange(kept.shape[1], device=kept.device)
    live = kc[None, :] < torch.as_tensor(n_kept, device=kept.device)[:, None]
    n_dev = torch.as_tensor(n, device=kept.device)[:, None]
    bad_kept = live & ((kept < 0) | (kept >= n_dev))
    rising = kept[:, 1:] > kept[:, :-1]
    bad_order = live[:, 1:] & ~rising
    if bool(bad_table.any() | bad_kept.any() | bad_order.any()):
        raise Error("cuda.paged_compact: a table entry lies outside the pool, or kept slots are not strictly "
                    "ascending in [0, n)")


def paged_compact(k_blocks, v_blocks, tables, kept, n, n_kept, *, layout: str = "nhd", head_in_block=None,
                  positions=None, check: bool = True) -> None:
    """Moves each head's kept slots to its first slots, in place, inside a paged pool
    (``depthkv::cuda::PagedCompact``; the bytes ``depthkv::PagedLayer::compact`` writes on the CPU).
    Slot s of head h lives in block ``tables[h, s // block_size]``, in-block slot
    ``s % block_size``, head ``head_in_block[h]`` of the block. Freed blocks (past
    ``ceil(n_kept / block_size)``) are the caller's to return to its pool.

    :param k_blocks, v_blocks: CUDA tensors, NHD [blocks, block_size, kv_heads, head_dim] or HND
        [blocks, kv_heads, block_size, head_dim] (``layout``)
    :param tables: CUDA int32 [heads, table_len]; :param kept: CUDA int32 [heads, >= max n_kept]
    :param n, n_kept: host ints per head (tokens held, survivors)
    :param head_in_block: host ints per head (default: 0 for every head)
    :param positions: optional CUDA int32 [heads, >= max n], compacted likewise
    :raises Error: on bad shapes, dtypes or devices, counts, table entries or kept lists; nothing is moved then
    """
    torch = _torch()
    if layout not in ("nhd", "hnd"):
        raise Error(f"cuda.paged_compact: layout must be 'nhd' or 'hnd', got {layout!r}")
    n = np.ascontiguousarray(np.asarray(n, dtype=np.int32).reshape(-1))
    n_kept = np.ascontiguousarray(np.asarray(n_kept, dtype=np.int32).reshape(-1))
    hib = np.zeros_like(n) if head_in_block is None else np.asarray(head_in_block, dtype=np.int32).reshape(-1)
    hib = np.ascontiguousarray(hib)
    if check and isinstance(tables, torch.Tensor) and tables.is_cuda and isinstance(kept, torch.Tensor) \
            and getattr(k_blocks, "ndim", 0) == 4 and tables.ndim == 2 and kept.ndim == 2 \
            and tables.shape[0] == n.size == kept.shape[0] == n_kept.size:
        bs = int(k_blocks.shape[2 if layout == "hnd" else 1])
        _check_paged_inputs(torch, tables, kept, n, n_kept, int(k_blocks.shape[0]), bs)
    heads_buf = _bytes(n.size * _cuda.paged_head_bytes(), k_blocks)
    status = _status(k_blocks)
    _cuda.paged_compact(k_blocks, v_blocks, layout == "hnd", tables, kept, n, n_kept, hib, positions, heads_buf,
                        status, _stream(k_blocks))
    if check and int(status.item()) & _BAD_ROW:  # pragma: no cover - the device checks above come first
        raise Error("cuda.paged_compact: a head was skipped (bad counts, table entries or kept slots)")
