"""depthkv budgets inside kvpress: :class:`DepthKVPress`, a kvpress press whose per-layer (and per-head)
token budgets come from a depthkv profile, with physically smaller per-layer caches.

>>> import depthkv
>>> from depthkv.kvpress import DepthKVPress
>>> press = DepthKVPress(depthkv.load_profile("model.profile.json"), keep=0.2)   # kvpress's SnapKV scores
>>> cache = transformers.DynamicCache()
>>> with press(model):
...     model.model(input_ids=context_ids, past_key_values=cache)     # prefill: each layer keeps its budget
>>> n = context_ids.shape[1]
>>> pos = torch.arange(n, n + cont_ids.shape[1])[None]
>>> model(input_ids=cont_ids, past_key_values=cache, position_ids=pos)   # continue on the pruned cache

Or ``KVPressTextGenerationPipeline(...)(context, question=..., press=press)``.

Budgets. At the prefill of an n-token context, ``depthkv.allocate(profile, keep=keep, policy=policy,
lengths=[n] * n_layers, scorer=..., protection=protection, obs_window=...)`` gives the budget of every
layer (and of every KV head for the head policies); their sum is exact. The curves read are those of
``scorer``, by default the depthkv scorer matching the wrapped press (``KVPRESS_SCORERS``: "snapkv"
for SnapKVPress) when the profile has them. The wrapped kvpress scorer press
(``press``, default kvpress's ``SnapKVPress`` with the profile's observation window and kernel)
scores the tokens of each layer per KV head; :func:`depthkv.select_keep` picks the kept tokens by
the C++ library's ranking rule: the first n_sink and last n_recent tokens always, then the best
scores (ties: the earlier position), so protection is the library's, inside the budget.

Physical sizes. After the prefill, layer l of the ``DynamicCache`` holds exactly ``budget[l]``
keys and values per KV head (the kept tokens in position order, RoPE already applied at their
original positions). No fake keys.

Attention with per-layer lengths (the rule). transformers builds one attention mask per forward
call from layer 0's cache length (``create_causal_mask`` -> ``get_mask_sizes`` of layer 0), and numbers
the new tokens from layer 0's length when no ``cache_position`` / ``position_ids`` are given. Layers of
other lengths would get a mask of the wrong width (eager: a shape error; sdpa: an error or a wrong
alignment). depthkv wraps the sdpa attention function (transformers' attention interface) and the
model's eager attention function, so that a layer whose keys are P past slots + q new tokens gets:
every past slot visible (except masked head tails, below), and for the new tokens the last q
columns of the mask transformers built (the causal relation among the new tokens). The wrapper
changes nothing when the mask already has the layer's width and no head tail is masked, and for
prefills. Padding inside the compressed context is not supported (batches of equal-length rows, as
kvpress's pipeline). Pass ``position_ids`` (the original positions: n, n+1, ...) to the calls after
the prefill, as kvpress's pipeline does: transformers' default would number them from layer 0's
physical length. flash_attention_2/3 align the causal mask to the end of each layer's keys by
themselves and need no wrapper (layer policies only; not tested on CPU).

Per-head budgets (policy "head-optimal"). Within layer l the physical length is the largest head
budget ``max_h budget[l][h]``; head h holds its ``budget[l][h]`` kept tokens first (position order),
then its next-ranked tokens up to the physical length, and those tail slots
``[budget[l][h], max)`` are masked (-inf / False) for every later query of that head. The mask state
lives on the attention modules, as kvpress's head-wise presses keep theirs: the next prefill through
the model (a query as long as its keys) clears it. :meth:`DepthKVPress.memory_report` tells per layer
the physical length and the masked (head, slot) count.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from kvpress.presses.base_press import BasePress
from kvpress.presses.scorer_press import ScorerPress
from kvpress.presses.snapkv_press import SnapKVPress

import depthkv
from depthkv import Error
from depthkv._attention import _STATE, WRAPPED, _layers, install_attention, layer_mask  # noqa: F401

__all__ = ["DepthKVPress", "install_attention"]

#: policies with per-head budgets
HEAD_POLICIES = ("head-optimal",)

#: kvpress scorer press class -> the depthkv scorer whose curves match it
KVPRESS_SCORERS = {"SnapKVPress": "snapkv", "ObservedAttentionPress": "h2o", "TOVAPress": "tova",
                   "KnormPress": "knorm"}


def _curves_for(press, profile) -> Optional[str]:
    """The profile's scorer matching the kvpress press (KVPRESS_SCORERS), else None (the profile's first)."""
    name = KVPRESS_SCORERS.get(type(press).__name__)
    return name if name in profile.scorers else None


def _default_press(profile) -> ScorerPress:
    sel = profile.selection or {}
    return SnapKVPress(window_size=int(sel.get("obs_window", 64)), kernel_size=int(sel.get("kernel", 5)))


class DepthKVPress(BasePress):
    """A kvpress press keeping depthkv's per-layer (per-head) budgets, physically (module docstring).

    :param profile: a :class:`depthkv.Profile` or the path of a profile file
    :param keep: global keep ratio in (0, 1]
    :param policy: a depthkv allocation policy (:data:`depthkv.POLICIES`)
    :param press: the kvpress ScorerPress whose ``score`` ranks the tokens (default SnapKVPress with the
        profile's obs_window and kernel); its compression_ratio is not used
    :param scorer: whose curves of the profile the allocator reads (default: the depthkv scorer matching
        ``press`` when the profile has its curves, e.g. "snapkv" for SnapKVPress; else the profile's first)
    :param protection: (n_sink, n_recent) kept in every head, inside the budget
    :param min_tokens: the allocator's safeguard floor (-1 automatic, 0 off, N tokens per layer)
    :raises Error: on a keep outside (0, 1], an unknown policy, a press that is no ScorerPress, or a
        request the allocator refuses for the profile's own context length
    """

    def __init__(self, profile, keep: float, policy: str = "optimal", press: Optional[ScorerPress] = None,
                 scorer: Optional[str] = None, protection: Sequence[int] = depthkv.DEFAULT_PROTECTION,
                 min_tokens: int = -1):
        if not isinstance(profile, depthkv.Profile):
            profile = depthkv.load_profile(profile)
        if not isinstance(keep, (int, float)) or not 0.0 < float(keep) <= 1.0:
            raise Error(f"DepthKVPress: keep must be in (0, 1], got {keep!r}")
        if policy not in depthkv.POLICIES:
            raise Error(f"DepthKVPress: unknown policy {policy!r} (one of {', '.join(depthkv.POLICIES)})")
        if press is None:
            press = _default_press(profile)
        if not isinstance(press, ScorerPress):
            raise Error(f"DepthKVPress: press must be a kvpress ScorerPress, got {type(press).__name__}")
        self.profile, self.keep, self.policy, self.press = profile, float(keep), policy, press
        self.scorer = scorer if scorer is not None else _curves_for(press, profile)
        self.protection, self.min_tokens = tuple(int(x) for x in protection), int(min_tokens)
        self.obs_window = int(getattr(press, "window_size", depthkv.DEFAULT_OBS_WINDOW))
        self._allocations: Dict[int, depthkv.Allocation] = {}
        self._report: Dict[int, dict] = {}
        #: per layer, the kept slots of the last prefill: int64 [batch, n_kv, physical] (a head's first
        #: budget slots are its kept tokens, the rest its masked tail)
        self.kept: Dict[int, torch.Tensor] = {}
        self.allocation(None)  # validates the request on the profile's context length

    @property
    def compression_ratio(self) -> float:
        """1 - keep (kvpress's name)."""
        return 1.0 - self.keep

    @property
    def per_head(self) -> bool:
        return self.policy in HEAD_POLICIES

    def allocation(self, n: Optional[int]) -> depthkv.Allocation:
        """The budgets for an n-token context (None: the profile's context length), cached per n."""
        if n not in self._allocations:
            lengths = None if n is None else [int(n)] * self.profile.n_layers
            self._allocations[n] = depthkv.allocate(
                self.profile, keep=self.keep, policy=self.policy, scorer=self.scorer, lengths=lengths,
                protection=self.protection, obs_window=self.obs_window, min_tokens=self.min_tokens)
        return self._allocations[n]

    def post_init_from_model(self, model) -> None:
        n_layers = len(_layers(model))
        if n_layers != self.profile.n_layers:
            raise Error(f"DepthKVPress: the profile has {self.profile.n_layers} layers, the model {n_layers} "
                        f"(profile of {self.profile.model.get('file', '?')})")
        n_kv = model.config.num_key_value_heads
        if self.per_head:
            a = self.allocation(None)
            if a.head_budgets is None or a.head_budgets.shape[1] != n_kv:
                raise Error(f"DepthKVPress: the profile's head curves are not for {n_kv} KV heads")
        if self.per_head and model.config._attn_implementation not in WRAPPED:
            raise Error("DepthKVPress: per-head budgets need sdpa or eager attention")
        install_attention(model)
        self.press.post_init_from_model(model)

    def _head_budgets(self, layer: int, n: int, n_kv: int) -> List[int]:
        a = self.allocation(n)
        if a.head_budgets is not None:
            ks = [int(x) for x in a.head_budgets[layer]]
            if len(ks) != n_kv:
                raise Error(f"DepthKVPress: {len(ks)} head budgets for {n_kv} KV heads in layer {layer}")
        else:
            ks = [int(a.budgets[layer])] * n_kv
        return [min(k, n) for k in ks]

    def _select(self, scores: torch.Tensor, ks: List[int], physical: int) -> torch.Tensor:
        """int64 [n_kv, physical]: per head its kept slots (ascending), then its next-ranked slots."""
        s = scores.detach().to(torch.float32).cpu().contiguous().numpy()
        if len(set(ks)) == 1:
            return torch.from_numpy(depthkv.select_keep(s, ks[0], self.protection).astype(np.int64))
        kept = depthkv.select_keep(s, ks, self.protection)
        top = depthkv.select_keep(s, physical, self.protection)
        rows = []
        for h, row in enumerate(kept):
            tail = np.setdiff1d(top[h], row)[: physical - len(row)]
            rows.append(np.concatenate([row, tail]))
        return torch.from_numpy(np.stack(rows).astype(np.int64))

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        layer = module.layer_idx
        bsz, n_kv, n, head_dim = keys.shape
        if layer == 0:
            self._report, self.kept = {}, {}
        ks = self._head_budgets(layer, n, n_kv)
        physical = max(ks)
        self._report[layer] = {"layer": layer, "length": n, "budgets": ks, "physical": physical,
                               "masked": sum(physical - k for k in ks)}
        setattr(module, _STATE, None)
        if min(ks) >= n:
            self.kept[layer] = torch.arange(n).expand(bsz, n_kv, n)
            return keys, values
        scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs)
        idx = torch.stack([self._select(scores[b], ks, physical) for b in range(bsz)]).to(keys.device)
        self.kept[layer] = idx
        if physical > min(ks):
            setattr(module, _STATE, (torch.tensor(ks), physical))
        gather = idx.unsqueeze(-1).expand(-1, -1, -1, head_dim)
        return keys.gather(2, gather).contiguous(), values.gather(2, gather).contiguous()

    def memory_report(self) -> List[dict]:
        """Per layer of the last prefill: {"layer", "length" (context tokens), "budgets" (per KV head),
        "physical" (the cache tensors' length), "masked" (masked (head, slot) pairs per sequence)}."""
        return [self._report[k] for k in sorted(self._report)]
