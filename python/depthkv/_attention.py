"""Per-layer attention masks for Hugging Face caches whose layers hold different tokens (the rule:
depthkv.kvpress's module docstring, "Attention with per-layer lengths"), shared by
:class:`depthkv.kvpress.DepthKVPress` and :func:`depthkv.hf.profile`. Needs torch and transformers
only (not kvpress).

The rule. At a call with q new tokens at positions t (the call's ``position_ids``; without them,
numbered on from the layer's past) on a layer whose keys are P past slots and the q new ones, the
query at position t sees past slot s iff the slot's original position p_s is >= 0 (not a masked
head tail), p_s <= t and, for a sliding-window layer of window w (depthkv._layers.layer_window),
p_s > t - w. The past slots' positions come from the layer's :class:`depthkv._layers.LayerState`
(set by the pruning path, depthkv._layers.keep_slots: the positions the prefill kept, then the
tokens appended since, n, n+1, ...; a sliding-window cache layer keeps the last of them), or, for a
layer without one, are the P positions just before the new tokens (an unpruned cache). The new
tokens among themselves: causal and (sliding) within the window, by their positions (not the mask
transformers built: it numbers the new tokens from one layer's length, which need not be this
layer's; so padding is not supported). The mask is boolean, or of the dtype of transformers' float
mask. A call is left as it is when it is a prefill (a query as long as its keys; it also clears the
layer's state), and for a layer without state when the mask transformers built has the layer's
width (the layer is in step with the one the mask was built for), or when there is no mask and no
past slot can be outside the layer's window. The state lives on the attention module, so a cache is
continued right after its own prefill (another prefill through the model replaces the state).
"""

from __future__ import annotations

import sys
from typing import Optional

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from depthkv import Error
from depthkv._layers import STATE, decoder_layers, layer_window

__all__ = ["install_attention", "layer_mask", "WRAPPED", "UNWRAPPED_OK"]

#: attention implementations whose calls depthkv wraps (per-layer masks)
WRAPPED = ("sdpa", "eager")
#: implementations that take each layer's key length as it is (no mask to rebuild)
UNWRAPPED_OK = ("flash_attention_2", "flash_attention_3")
_MARK = "_depthkv_wrapped"


def _query_positions(position_ids, q: int) -> Optional[torch.Tensor]:
    """int64 [batch or 1, q]: the positions of the call's new tokens, or None when not given."""
    if not isinstance(position_ids, torch.Tensor) or position_ids.shape[-1] < q:
        return None
    t = position_ids[..., -q:]
    while t.dim() > 2:  # e.g. multimodal RoPE's [3, batch, q]: the first (temporal) row
        t = t[0]
    return t.reshape(-1, q).long()


def _past_positions(state, past: int, t0: int, device) -> torch.Tensor:
    """int64 [batch or 1, n_kv or 1, past]: the original positions of the layer's past slots (-1: masked)."""
    if state is None:
        base = max(t0, past)
        return torch.arange(base - past, base, device=device)[None, None]
    kept = state.positions.to(device)
    m = kept.shape[-1]
    appended = t0 - state.n if m + t0 - state.n >= past else past - m  # else: numbered on from the past
    appended = max(appended, 0)
    new = torch.arange(state.n, state.n + appended, device=device).expand(kept.shape[0], kept.shape[1], appended)
    return torch.cat([kept, new], dim=-1)[..., -past:]


def layer_mask(module, query, key, attention_mask, position_ids=None):
    """The mask of one layer's attention call under the module docstring's rule, or None to leave
    the call as it is. query [B, H, q, d], key [B, n_kv, P + q, d]; ``position_ids`` those of the call."""
    q, k_len = query.shape[2], key.shape[2]
    if q == k_len:  # a prefill: the state of an earlier cache is void
        setattr(module, STATE, None)
        return None
    state = getattr(module, STATE, None)
    window = layer_window(module)
    past = k_len - q
    if state is None and (attention_mask.shape[-1] == k_len if attention_mask is not None
                          else window is None or past + q <= window):
        return None
    dev = query.device
    t = _query_positions(position_ids, q)
    if t is None:
        t0 = past if state is None else state.n + max(0, past - state.positions.shape[-1])
        t = torch.arange(t0, t0 + q, device=dev)[None]
    t = t.to(dev)
    tq = t[:, None, :, None]  # [b, 1, q, 1]
    p = _past_positions(state, past, int(t[0, 0]), dev)[:, :, None, :]  # [b, n_kv, 1, past]
    visible = (p >= 0) & (p <= tq)
    if window is not None:
        visible = visible & (p > tq - window)
    if visible.shape[1] > 1:
        visible = visible.repeat_interleave(query.shape[1] // visible.shape[1], dim=1)  # [b, H, q, past]
    tk = t[:, None, None, :]  # the new tokens among themselves: causal (and in the window)
    new = tk <= tq
    if window is not None:
        new = new & (tk > tq - window)
    b, h = max(new.shape[0], visible.shape[0]), visible.shape[1]
    mask = torch.cat([visible.expand(b, h, q, past), new.expand(b, h, q, q)], dim=-1)
    if attention_mask is None or attention_mask.dtype == torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=attention_mask.dtype, device=dev).masked_fill(
        ~mask, torch.finfo(attention_mask.dtype).min)


def _wrap(func):
    if getattr(func, _MARK, False):
        return func

    def wrapper(module, query, key, value, attention_mask, *args, **kwargs):
        mask = layer_mask(module, query, key, attention_mask, kwargs.get("position_ids"))
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
    for layer in decoder_layers(model):
        modeling = sys.modules.get(type(layer.self_attn).__module__)
        if modeling is not None and hasattr(modeling, "eager_attention_forward"):
            modeling.eager_attention_forward = _wrap(modeling.eager_attention_forward)
