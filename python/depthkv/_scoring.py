"""depthkv's own token scorers inside a Hugging Face attention layer's forward, for
:class:`depthkv.kvpress.DepthKVPress` with ``press="snapkv"`` (or another name of
:data:`depthkv.SCORERS`). Needs torch, transformers and kvpress.

The attention rows. At the prefill of an n-token context, the layer's queries of positions
``first .. n-1`` are computed from the layer's input (``hidden_states``, the normalized input of
the attention module) as kvpress's SnapKV computes its observation window: kvpress's
``get_prerope_query_states`` (q projection; Qwen3/Gemma3 q-norm), then RoPE with the layer's
``position_embeddings``; the probabilities are ``softmax(q k^T * scaling)`` over the n keys in
float32, causal (query i sees keys 0..i). ``first`` is n - window for "snapkv" (its observation
window), n - 1 for "tova", 0 for the cumulative scorers ("h2o", "h2o-v1", "h2o-v2", computed in
chunks of rows), and no rows for "knorm" and "keydiff". The rows are fed to one :class:`depthkv.TokenScorer`
per sequence of the batch (query heads aggregated onto their KV head by the library), whose
scores rank the slots. Llama-like attention (no logit soft-capping). For a sliding-window layer
:class:`depthkv.kvpress.DepthKVPress` passes its held tokens only (the last min(n, window - 1)
positions: their hidden states, position embeddings and keys), so the rows and keys are those
(all inside every row's window).
"""

from __future__ import annotations

from typing import Iterator, List, Tuple

import torch
from kvpress.utils import get_prerope_query_states
from transformers.models.llama.modeling_llama import repeat_kv, rotate_half

import depthkv

__all__ = ["first_row", "attention_rows", "own_scores", "held_scores"]

#: elements of one chunk of attention rows (rows x heads x keys)
_CHUNK_ELEMENTS = 1 << 24


def first_row(scorer: str, n: int, window: int) -> int:
    """The first query position the scorer observes of an n-token prefill (n: none)."""
    return {"snapkv": max(0, n - window), "snapkv-keydiff": max(0, n - window), "tova": n - 1, "knorm": n,
            "keydiff": n}.get(scorer, 0)


def attention_rows(module, hidden_states: torch.Tensor, keys: torch.Tensor, position_embeddings,
                   first: int) -> Iterator[Tuple[int, torch.Tensor]]:
    """(q_pos0, probs float32 [batch, n_heads, rows, n]) for the query positions first..n-1 of the
    prefill, in chunks (module docstring: how they are computed)."""
    bsz, n_kv, n, head_dim = keys.shape
    n_heads = module.config.num_attention_heads
    k = repeat_kv(keys, n_heads // n_kv)
    cos, sin = position_embeddings
    scale = float(getattr(module, "scaling", head_dim ** -0.5))
    step = max(1, _CHUNK_ELEMENTS // max(1, bsz * n_heads * n))
    cols = torch.arange(n, device=keys.device)[None, :]
    for a in range(first, n, step):
        b = min(n, a + step)
        q = get_prerope_query_states(module, hidden_states[:, a:b])
        c, s = cos[:, a:b].unsqueeze(1), sin[:, a:b].unsqueeze(1)
        q = q * c + rotate_half(q) * s
        w = torch.matmul(q, k.transpose(2, 3)).float() * scale
        future = cols > torch.arange(a, b, device=keys.device)[:, None]
        w = w.masked_fill(future, float("-inf"))
        yield a, torch.softmax(w, dim=-1)


def _scorers(name: str, bsz: int, module, n_kv: int, settings: dict) -> List[depthkv.TokenScorer]:
    return [depthkv.TokenScorer(name, module.config.num_attention_heads, n_kv, window=settings["window"],
                                kernel=settings["kernel"], pooling=settings["pooling"],
                                output_aware=settings["output_aware"]) for _ in range(bsz)]


def own_scores(name: str, settings: dict, module, hidden_states: torch.Tensor, keys: torch.Tensor,
               values: torch.Tensor, position_embeddings) -> torch.Tensor:
    """float32 [batch, n_kv, n] (CPU): depthkv's scorer ``name`` over the layer's attention rows.

    :param settings: the scorer's "window", "kernel", "pooling" and "output_aware"
    """
    bsz, n_kv, n, _ = keys.shape
    scorers = _scorers(name, bsz, module, n_kv, settings)
    first = first_row(name, n, settings["window"])
    if first < n:
        for q0, probs in attention_rows(module, hidden_states, keys, position_embeddings, first):
            probs = probs.detach().cpu()
            for b, sc in enumerate(scorers):
                sc.observe(probs[b], q_pos0=q0)
    need_values = name in ("h2o-v1", "h2o-v2") or settings["output_aware"]
    wo = module.o_proj.weight.detach().float().cpu() if settings["output_aware"] else None
    out = []
    for b, sc in enumerate(scorers):
        k = keys[b].detach().float().cpu() if name in depthkv.KEY_READERS else None
        v = values[b].detach().float().cpu() if need_values else None
        out.append(torch.from_numpy(sc.scores(n, keys=k, values=v, wo=wo)))
    return torch.stack(out)


def held_scores(name: str, settings: dict, module, hidden_states: torch.Tensor, keys: torch.Tensor,
                values: torch.Tensor, position_embeddings) -> torch.Tensor:
    """:func:`own_scores` over a layer's held tokens after an n-token prefill: ``keys`` and ``values``
    hold the last h of the n positions (h < n: a sliding-window layer, module docstring), whose
    hidden states and position embeddings are taken; float32 [batch, n_kv, h] (CPU). The one
    scoring path of :class:`depthkv.kvpress.DepthKVPress` and :func:`depthkv.hf.profile`."""
    n, h = hidden_states.shape[1], keys.shape[2]
    if h < n:
        hidden_states = hidden_states[:, n - h:]
        position_embeddings = tuple(x[:, n - h:] for x in position_embeddings)
    return own_scores(name, settings, module, hidden_states, keys, values, position_embeddings)
