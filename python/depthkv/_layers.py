"""The layers of a Hugging Face decoder as depthkv prunes them, and the one pruning path that
:class:`depthkv.kvpress.DepthKVPress` and :func:`depthkv.hf.profile` share. Needs torch only.

Held tokens (the rule, as the C++ library's: budget_allocator.hpp ``window_caps``). After the
prefill of an n-token context a full-attention layer can use all n tokens; a sliding-window layer
of window w (``sliding_window`` on its attention module: Gemma 2/3, Qwen2, Mistral, ...) only its
last ``min(n, w - 1)``: the next query (position n) sees the positions ``> n - w``, every later
query fewer of the context. That is what transformers' ``DynamicSlidingWindowLayer`` holds
(``DynamicCache(config=model.config)``, the model's default cache); a plain ``DynamicCache()``
(kvpress's pipeline) holds all n tokens in such a layer, the ones before the window dead.
:func:`held` is a layer's held length: the allocator's cap of the layer (its length stays n, so a
keep ratio is of the n tokens per layer a cache without windows would hold, and a layer's curve is
over ratios of n, as the library's profiles are).

Pruning (the path). :func:`usable` cuts a layer's cache to its held tokens (drops the dead slots of
a sliding layer in a plain cache); the caller scores them ([batch, n_kv, h]); :func:`prune_layer`
keeps per KV head ``min(budget, h)`` of them, selected by the library's ranking rule
(:func:`select_slots`: a head's kept tokens in position order, then, when the heads' budgets
differ, its next-ranked tokens up to the largest budget, its masked tail), and :func:`keep_slots`
gathers them and records on the attention module what the per-layer attention mask rule
(depthkv._attention) needs for every later query: the original position of each slot (-1 for a
masked tail slot) and the context length n (the position of the first token appended after the
prefill). The next prefill through the module clears it. A layer whose budgets are all at least
its held tokens keeps every held token (and needs no scores).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence

import numpy as np
import torch

import depthkv

__all__ = ["decoder_layers", "layer_window", "layer_windows", "held", "usable", "select_slots",
           "keep_slots", "prune_layer", "LayerState", "STATE", "clear_states"]

#: the attribute of an attention module holding its :class:`LayerState`
STATE = "_depthkv_layer_state"


class LayerState(NamedTuple):
    """What the mask rule knows of a pruned layer: ``positions`` int64 [batch, n_kv, m], the original
    position of each slot the prefill left (-1: a masked tail slot), and ``n``, the context length."""
    positions: torch.Tensor
    n: int


def decoder_layers(model):
    """The decoder layers of a causal LM (``model.model.layers``, or ``.language_model.layers``)."""
    inner = model.model.language_model if hasattr(model.model, "language_model") else model.model
    return inner.layers


def layer_window(module) -> Optional[int]:
    """The sliding window of an attention module (its ``sliding_window``), or None for full attention."""
    w = getattr(module, "sliding_window", None)
    return int(w) if isinstance(w, int) and not isinstance(w, bool) and w > 0 else None


def layer_windows(model) -> List[int]:
    """Per decoder layer, its sliding window, 0 for full attention (a profile's ``layer_window``)."""
    return [layer_window(layer.self_attn) or 0 for layer in decoder_layers(model)]


def held(n: int, window: Optional[int]) -> int:
    """Tokens a layer can use after an n-token prefill: n, or ``min(n, window - 1)`` for a window
    > 0 (module docstring)."""
    return int(n) if not window else min(int(n), int(window) - 1)


def usable(t: torch.Tensor, n: int, window: Optional[int]) -> torch.Tensor:
    """The held slots of a layer's keys or values [batch, n_kv, P, d] after an n-token prefill (the
    last ``held(n, window)`` of its P slots; P is n, or fewer for a sliding-window cache layer)."""
    h = held(n, window)
    if t.shape[2] < h:
        raise ValueError(f"the layer holds {t.shape[2]} slots, fewer than its {h} held tokens")
    return t if t.shape[2] == h else t[:, :, t.shape[2] - h:]


def select_slots(scores, ks: Sequence[int], protection: Sequence[int]) -> torch.Tensor:
    """int64 [n_kv, max(ks)]: per KV head its ``ks[h]`` kept slots (ascending, :func:`depthkv.select_keep`),
    then its next-ranked slots up to ``max(ks)`` (the masked tail).

    :param scores: float [n_kv, h] (torch or numpy), every ``ks[h] <= h``
    """
    s = scores.detach().to(torch.float32).cpu().contiguous().numpy() if isinstance(scores, torch.Tensor) \
        else np.ascontiguousarray(scores, dtype=np.float32)
    ks = [int(k) for k in ks]
    if len(set(ks)) == 1:
        return torch.from_numpy(depthkv.select_keep(s, ks[0], protection).astype(np.int64))
    physical = max(ks)
    kept = depthkv.select_keep(s, ks, protection)
    top = depthkv.select_keep(s, physical, protection)
    rows = []
    for h, row in enumerate(kept):
        tail = np.setdiff1d(top[h], row)[: physical - len(row)]
        rows.append(np.concatenate([row, tail]))
    return torch.from_numpy(np.stack(rows).astype(np.int64))


def keep_slots(module, keys: torch.Tensor, values: torch.Tensor, n: int, idx: torch.Tensor,
               lengths: Optional[Sequence[int]] = None):
    """Keeps, per KV head, the slots ``idx`` of the layer's held keys and values (module docstring).

    :param keys, values: the held slots [batch, n_kv, h, d] (:func:`usable`); slot j is position n - h + j
    :param idx: int64 [batch, n_kv, m]: per head the slots kept, in the order they are stored
    :param lengths: per KV head, how many of its first slots stay visible (None: all m)
    :return: (keys, values) [batch, n_kv, m, d], contiguous
    """
    h, m = keys.shape[2], idx.shape[-1]
    idx = idx.to(keys.device)
    positions = idx + (int(n) - h)
    tails = lengths is not None and min(int(k) for k in lengths) < m
    if tails:
        tail = torch.arange(m, device=idx.device)[None, :] >= torch.as_tensor(
            [int(k) for k in lengths], device=idx.device)[:, None]
        positions = positions.masked_fill(tail[None], -1)
    setattr(module, STATE, LayerState(positions, int(n)))
    if not tails and m == h and bool((idx == torch.arange(h, device=idx.device)).all()):
        return keys.contiguous(), values.contiguous()  # every held slot (a sliced view: copied)
    gather = idx.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
    return keys.gather(2, gather).contiguous(), values.gather(2, gather).contiguous()


def prune_layer(module, keys: torch.Tensor, values: torch.Tensor, n: int, budgets: Sequence[int],
                scores: Optional[torch.Tensor], protection: Sequence[int]):
    """The pruning path (module docstring): each KV head h of the layer keeps ``budgets[h]`` of its
    held tokens (at most all of them), chosen by ``scores``; the cache keeps ``max(budgets)`` slots
    per head, a head's slots beyond its budget masked.

    :param keys, values: the layer's held slots [batch, n_kv, h, d] after an n-token prefill (:func:`usable`)
    :param budgets: per KV head (one int for every head)
    :param scores: float [batch, n_kv, h]; not read (may be None) when every budget is >= h
    :param protection: (n_sink, n_recent) the selection keeps always
    :return: (keys, values, slots): the pruned keys and values [batch, n_kv, m, d] and the kept slots
        int64 [batch, n_kv, m] (indices into the held slots; position = slot + n - h)
    """
    bsz, n_kv, h = keys.shape[:3]
    ks = [min(int(k), h) for k in (budgets if np.ndim(budgets) else [budgets] * n_kv)]
    if min(ks) >= h:
        idx = torch.arange(h).expand(bsz, n_kv, h)
    else:
        idx = torch.stack([select_slots(scores[b], ks, protection) for b in range(bsz)])
    k, v = keep_slots(module, keys, values, n, idx, ks if max(ks) > min(ks) else None)
    return k, v, idx


def clear_states(model) -> None:
    """Forgets every layer's :class:`LayerState` (the mask rule treats the cache as unpruned)."""
    for layer in decoder_layers(model):
        setattr(layer.self_attn, STATE, None)
