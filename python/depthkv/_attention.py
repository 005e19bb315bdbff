"""Per-layer attention masks for Hugging Face caches whose layers hold different lengths (the rule:
depthkv.kvpress's module docstring, "Attention with per-layer lengths"), shared by
:class:`depthkv.kvpress.DepthKVPress` and :func:`depthkv.hf.profile`. Needs torch and transformers
only (not kvpress).

A module whose attribute ``_depthkv_head_tails`` is ``(lengths, physical)`` (int tensor [n_kv_heads],
int) hides, for every later query of KV head h, its slots ``[lengths[h], physical)``; the next
prefill through the module clears it.
"""

from __future__ import annotations

import sys

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from depthkv import Error

__all__ = ["install_attention", "layer_mask", "WRAPPED", "UNWRAPPED_OK"]

#: attention implementations whose calls depthkv wraps (per-layer masks)
WRAPPED = ("sdpa", "eager")
#: implementations that take each layer's key length as it is (no mask to rebuild)
UNWRAPPED_OK = ("flash_attention_2", "flash_attention_3")
_MARK = "_depthkv_wrapped"
_STATE = "_depthkv_head_tails"


def _past_visible(module, query, key, past: int) -> torch.Tensor:
    """bool [1, 1 or H, 1, past]: which past slots the layer's queries may see (head tails hidden)."""
    state = getattr(module, _STATE, None)
    if state is None:
        return torch.ones(1, 1, 1, past, dtype=torch.bool, device=query.device)
    lengths, physical = state
    slots = torch.arange(past, device=query.device)[None, :]
    lengths = lengths.to(query.device)[:, None]
    hidden = (slots >= lengths) & (slots < physical)  # [n_kv, past]
    hidden = hidden.repeat_interleave(query.shape[1] // key.shape[1], dim=0)  # [H, past]
    return (~hidden)[None, :, None, :]


def layer_mask(module, query, key, attention_mask):
    """The mask of one layer's attention call under the module docstring's rule, or None to leave
    the call as it is. query [B, H, q, d], key [B, n_kv, P + q, d]."""
    q, k_len = query.shape[2], key.shape[2]
    if q == k_len:  # a prefill: head tails of an earlier cache are void
        setattr(module, _STATE, None)
        return None
    has_tails = getattr(module, _STATE, None) is not None
    if not has_tails and (attention_mask is None or attention_mask.shape[-1] == k_len):
        return None
    past = k_len - q
    if attention_mask is None:  # sdpa's causal skip: the new tokens are causal among themselves
        new = torch.ones(q, q, dtype=torch.bool, device=query.device).tril()[None, None]
    else:
        new = attention_mask[..., -q:]
    visible = _past_visible(module, query, key, past)
    if new.dtype == torch.bool:
        past_part = visible
    else:
        past_part = torch.zeros(visible.shape, dtype=new.dtype, device=new.device)
        past_part = past_part.masked_fill(~visible, torch.finfo(new.dtype).min)
    b, h = max(new.shape[0], 1), max(new.shape[1], past_part.shape[1])
    return torch.cat([past_part.expand(b, h, q, past), new.expand(b, h, q, q)], dim=-1)


def _wrap(func):
    if getattr(func, _MARK, False):
        return func

    def wrapper(module, query, key, value, attention_mask, *args, **kwargs):
        mask = layer_mask(module, query, key, attention_mask)
        if mask is not None:
            attention_mask = mask
            kwargs.pop("is_causal", None)
        return func(module, query, key, value, attention_mask, *args, **kwargs)

    setattr(wrapper, _MARK, True)
    wrapper.__wrapped__ = func
    return wrapper


def install_attention(model, who: str = "DepthKVPress") -> None:
    """Wraps transformers' sdpa attention function (process-wide) and the eager attention function
    of ``model``'s modeling module with the per-layer mask rule (idempotent; neutral for caches of
    equal layer lengths). DepthKVPress calls it when it is applied to a model.

    :raises Error: when the model's attention implementation is neither sdpa, eager nor flash attention
    """
    impl = model.config._attn_implementation
    if impl not in WRAPPED + UNWRAPPED_OK:
        raise Error(f"{who}: attention implementation {impl!r} is not supported "
                    f"(use one of {', '.join(WRAPPED + UNWRAPPED_OK)})")
    ALL_ATTENTION_FUNCTIONS["sdpa"] = _wrap(ALL_ATTENTION_FUNCTIONS["sdpa"])
    for layer in _layers(model):
        modeling = sys.modules.get(type(layer.self_attn).__module__)
        if modeling is not None and hasattr(modeling, "eager_attention_forward"):
            modeling.eager_attention_forward = _wrap(modeling.eager_attention_forward)


def _layers(model):
    inner = model.model.language_model if hasattr(model.model, "language_model") else model.model
    return inner.layers
