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
layer (and of every KV head for the head policies); their sum is exact (keep of n tokens per layer;
a sliding-window layer capped at what it holds, below). The curves read are those of
``scorer``, by default the depthkv scorer matching the wrapped press (``KVPRESS_SCORERS``: "snapkv"
for SnapKVPress) when the profile has them. The wrapped kvpress scorer press
(``press``, default kvpress's ``SnapKVPress`` with the profile's observation window and kernel)
scores the tokens of each layer per KV head; :func:`depthkv.select_keep` picks the kept tokens by
the C++ library's ranking rule: the first n_sink and last n_recent tokens always, then the best
scores (ties: the earlier position), so protection is the library's, inside the budget
(``select_protection=(0, 0)`` ranks by the press's scores alone, as kvpress keeps tokens).

depthkv's own scorers. ``press="snapkv"`` (or "h2o", "h2o-v1", "h2o-v2", "tova", "knorm", "keydiff":
:data:`depthkv.SCORERS`) ranks the tokens by the library's :class:`depthkv.TokenScorer` over the
attention rows of the layer's prefill (depthkv._scoring: the observation window's queries against
the keys, computed as kvpress's SnapKV computes them; all rows for the H2O scorers, the last one
for TOVA), with the profile's selection (obs_window, kernel, pooling, output_aware; its lookahead
is not applied). The scores of the last prefill are kept in ``scores`` ([batch, n_kv, held] per
layer, of its held tokens).

Model identity (the rule). When the press is applied to a model, the profile must be of that model
(:func:`depthkv.hf.check_profile_model`): the same number of layers and, for head curves, of KV
heads, always, and the same sliding windows when the profile records them; and, for a profile made
by :func:`depthkv.hf.profile` (it records a hash of the HF config and weights), the same hash, unless
``check_model=False``. Profiles made by ``depthkv profile`` from a GGUF / llama2.c file record that
file's hash, which an HF model cannot reproduce: only their structure is checked. The hash is
computed once per model and press.

Physical sizes. After the prefill, layer l of the ``DynamicCache`` holds exactly ``budget[l]``
keys and values per KV head (the kept tokens in position order, RoPE already applied at their
original positions). No fake keys.

Sliding-window layers (Gemma 3, ...: an attention module with ``sliding_window``; the rule of
depthkv._layers, the C++ library's ``window_caps``). After an n-token prefill a sliding layer of
window w can only use its last ``min(n, w - 1)`` tokens (:meth:`DepthKVPress.held`). The allocator
caps the layer there (by the windows the profile records, ``layer_window``, or the model's when it
records none), so its budget never exceeds its window and the tokens it cannot use go to the
layers that can; a keep ratio whose budget exceeds what the layers hold altogether keeps
everything they hold (the allocator would refuse it). The press scores and keeps tokens among the
held ones only, and a layer whose budget is at least that keeps them all (unscored). In the model's
own cache (``DynamicCache(config=model.config)``, whose sliding layers are transformers'
``DynamicSlidingWindowLayer``) such a layer holds exactly that; in a plain ``DynamicCache()``
(kvpress's pipeline) it holds all n, and the press drops the slots before the window. Every later
query of a sliding layer sees the kept tokens inside its own window only (by their original
positions, the mask rule below). A sliding layer's curves are over ratios of n with its window
applied, as :func:`depthkv.hf.profile` and ``depthkv profile`` measure them.

Attention with per-layer lengths (the rule; depthkv._attention). transformers builds one attention
mask per forward call and kind of layer from one layer's cache (``create_causal_mask`` ->
``get_mask_sizes`` of the first full / sliding layer), and numbers the new tokens from layer 0's
length when no ``cache_position`` / ``position_ids`` are given. Layers of other lengths would get a
mask of the wrong width or alignment (eager: a shape error; sdpa: an error or wrong attention).
depthkv wraps the sdpa attention function (transformers' attention interface) and the model's eager
attention function, so that a pruned layer whose keys are P past slots + q new tokens gets: every
past slot visible whose original position the query may see (not a masked head tail, below; for a
sliding-window layer, inside the query's window), and the new tokens causal among themselves (and
inside the window). The wrapper changes nothing for prefills, and for a layer the press did not
prune when the mask already has its width. Padding inside the compressed context is not supported
(batches of equal-length rows, as kvpress's pipeline). Pass ``position_ids`` (the original
positions: n, n+1, ...) to the calls after the prefill, as kvpress's pipeline does: transformers'
default would number them from layer 0's physical length. flash_attention_2/3 align the causal
mask to the end of each layer's keys by themselves and need no wrapper (layer policies only; not
tested on CPU; their sliding window counts slots, not positions).

Per-head budgets (policy "head-optimal"). Within layer l the physical length is the largest head
budget ``max_h budget[l][h]``; head h holds its ``budget[l][h]`` kept tokens first (position order),
then its next-ranked tokens up to the physical length, and those tail slots
``[budget[l][h], max)`` are masked (-inf / False) for every later query of that head. The mask state
lives on the attention modules, as kvpress's head-wise presses keep theirs: the next prefill through
the model (a query as long as its keys) clears it. :meth:`DepthKVPress.memory_report` tells per layer
the physical length and the masked (head, slot) count.
"""

from __future__ import annotations

import math
import weakref
from typing import Dict, List, Optional, Sequence, Union

import torch
from kvpress.presses.base_press import BasePress
from kvpress.presses.scorer_press import ScorerPress
from kvpress.presses.snapkv_press import SnapKVPress

import depthkv
from depthkv import Error
from depthkv._attention import WRAPPED, install_attention, layer_mask  # noqa: F401
from depthkv._layers import STATE, decoder_layers, held, layer_window, layer_windows, prune_layer, usable
from depthkv._scoring import held_scores
from depthkv.hf import check_profile_model, profile_windows, with_windows

__all__ = ["DepthKVPress", "install_attention"]

#: policies with per-head budgets
HEAD_POLICIES = ("head-optimal",)

#: kvpress scorer press class -> the depthkv scorer whose curves match it
KVPRESS_SCORERS = {"SnapKVPress": "snapkv", "ObservedAttentionPress": "h2o", "TOVAPress": "tova",
                   "KnormPress": "knorm", "KeyDiffPress": "keydiff"}


def _curves_for(press, profile) -> Optional[str]:
    """The profile's scorer matching the press (a depthkv scorer name, or a kvpress press through
    KVPRESS_SCORERS), else None (the profile's first)."""
    name = press if isinstance(press, str) else KVPRESS_SCORERS.get(type(press).__name__)
    return name if name in profile.scorers else None


def _own_settings(name: str, profile) -> dict:
    """The settings of depthkv's scorer ``name``: the profile's selection (obs_window, kernel,
    pooling, output_aware), else the library's defaults; checked by the library."""
    if name not in depthkv.SCORERS:
        raise Error(f"DepthKVPress: unknown scorer {name!r} (one of {', '.join(depthkv.SCORERS)}, or a kvpress "
                    "ScorerPress)")
    sel = profile.selection or {}
    s = {"window": int(sel.get("obs_window", depthkv.DEFAULT_OBS_WINDOW)),
         "kernel": int(sel.get("kernel", depthkv.DEFAULT_KERNEL)), "pooling": str(sel.get("pooling", "max")),
         "output_aware": bool(sel.get("output_aware", False)) and name in ("h2o", "snapkv", "tova")}
    depthkv.TokenScorer(name, 1, 1, window=s["window"], kernel=s["kernel"], pooling=s["pooling"],
                        output_aware=s["output_aware"])
    return s


def _default_press(profile) -> ScorerPress:
    sel = profile.selection or {}
    return SnapKVPress(window_size=int(sel.get("obs_window", 64)), kernel_size=int(sel.get("kernel", 5)))


class DepthKVPress(BasePress):
    """A kvpress press keeping depthkv's per-layer (per-head) budgets, physically (module docstring).

    :param profile: a :class:`depthkv.Profile` or the path of a profile file
    :param keep: global keep ratio in (0, 1]
    :param policy: a depthkv allocation policy (:data:`depthkv.POLICIES`)
    :param press: what ranks the tokens: a kvpress ScorerPress (its ``score``; default SnapKVPress with
        the profile's obs_window and kernel; its compression_ratio is not used), or the name of one of
        depthkv's own scorers (:data:`depthkv.SCORERS`: "snapkv", "h2o", "tova", ...) over the layer's
        attention rows (module docstring, "depthkv's own scorers")
    :param scorer: whose curves of the profile the allocator reads (default: the depthkv scorer matching
        ``press`` when the profile has its curves, e.g. "snapkv" for SnapKVPress or "snapkv"; else the
        profile's first)
    :param protection: (n_sink, n_recent) the allocator counts every head to keep, and (unless
        ``select_protection`` is given) the selection keeps, inside the budget
    :param min_tokens: the allocator's safeguard floor (-1 automatic, 0 off, N tokens per layer)
    :param check_model: compare the HF model hash a profile of :func:`depthkv.hf.profile` records with
        the model's (:func:`depthkv.hf.check_profile_model`; layer and KV-head counts are always checked)
    :param select_protection: (n_sink, n_recent) the selection forces into the kept set (default:
        ``protection``); (0, 0) ranks by the press's scores alone, as kvpress's presses keep tokens
        (kvpress's SnapKV protects its observation window by its scores)
    :raises Error: on a keep outside (0, 1], an unknown policy, a press that is neither a ScorerPress
        nor a scorer name, or a request the allocator refuses for the profile's own context length;
        when applied to a model (``with press(model)``), on a profile of another model
    """

    def __init__(self, profile, keep: float, policy: str = "optimal", press: Union[ScorerPress, str, None] = None,
                 scorer: Optional[str] = None, protection: Sequence[int] = depthkv.DEFAULT_PROTECTION,
                 min_tokens: int = -1, check_model: bool = True,
                 select_protection: Optional[Sequence[int]] = None):
        if not isinstance(profile, depthkv.Profile):
            profile = depthkv.load_profile(profile)
        if not isinstance(keep, (int, float)) or not 0.0 < float(keep) <= 1.0:
            raise Error(f"DepthKVPress: keep must be in (0, 1], got {keep!r}")
        if policy not in depthkv.POLICIES:
            raise Error(f"DepthKVPress: unknown policy {policy!r} (one of {', '.join(depthkv.POLICIES)})")
        if press is None:
            press = _default_press(profile)
        if isinstance(press, str):
            self.own = _own_settings(press, profile)
        elif isinstance(press, ScorerPress):
            self.own = None
        else:
            raise Error(f"DepthKVPress: press must be a kvpress ScorerPress or a depthkv scorer name, "
                        f"got {type(press).__name__}")
        self.profile, self.keep, self.policy, self.press = profile, float(keep), policy, press
        self.scorer = scorer if scorer is not None else _curves_for(press, profile)
        self.protection, self.min_tokens = depthkv._protection(protection), int(min_tokens)
        self.select_protection = depthkv._protection(protection if select_protection is None else select_protection)
        if min(self.select_protection) < 0:
            raise Error(f"DepthKVPress: select_protection must be >= 0, got {self.select_protection}")
        self.check_model = bool(check_model)
        self.obs_window = int(self.own["window"] if self.own else getattr(press, "window_size",
                                                                            depthkv.DEFAULT_OBS_WINDOW))
        self._allocations: Dict[Optional[int], depthkv.Allocation] = {}
        self._report: Dict[int, dict] = {}
        self._checked: Dict[int, bool] = {}
        #: per decoder layer, its sliding window (0: global): the model's once the press is applied to
        #: one, before that the profile's (None: none recorded)
        self.windows: Optional[List[int]] = profile_windows(profile)
        #: the profile the allocator reads: ``profile``, with the model's windows when it lacks them
        self._alloc_profile = profile
        #: per layer, the original positions of the slots the last prefill kept: int64 [batch, n_kv,
        #: physical] (a head's first budget slots are its kept tokens, the rest its masked tail)
        self.kept: Dict[int, torch.Tensor] = {}
        #: per layer, the scores the last prefill ranked: float32 [batch, n_kv, held] (CPU), of the
        #: layer's held tokens (positions n - held .. n - 1)
        self.scores: Dict[int, torch.Tensor] = {}
        self.allocation(None)  # validates the request on the profile's context length

    def with_keep(self, keep: float) -> "DepthKVPress":
        """The same press (profile, policy, scorer press, protection) at another keep ratio."""
        other = DepthKVPress(self.profile, keep, self.policy, self.press, self.scorer, self.protection,
                             self.min_tokens, self.check_model, self.select_protection)
        other._checked = self._checked
        other.windows, other._alloc_profile = self.windows, self._alloc_profile
        return other

    @property
    def compression_ratio(self) -> float:
        """1 - keep (kvpress's name)."""
        return 1.0 - self.keep

    @property
    def per_head(self) -> bool:
        return self.policy in HEAD_POLICIES

    def held(self, n: int) -> List[int]:
        """The tokens every layer holds after an n-token prefill (module docstring, "Sliding-window
        layers"): n, or min(n, window - 1) for a sliding-window layer (the windows of the model the
        press was applied to, else those the profile records)."""
        return [held(n, w) for w in (self.windows or [0] * self.profile.n_layers)]

    def allocation(self, n: Optional[int]) -> depthkv.Allocation:
        """The budgets for an n-token context (None: the profile's context length), cached per n:
        ``depthkv.allocate`` over lengths n per layer, the sliding-window layers capped at
        :meth:`held` (through the windows of the profile it allocates by); a keep ratio whose budget
        exceeds what the layers hold keeps everything they hold."""
        if n not in self._allocations:
            lengths = None if n is None else [int(n)] * self.profile.n_layers
            budget = {"keep": self.keep}
            length = int(n) if n is not None else int(self.profile.calibration["context"])
            if any(self.windows or []) and length > 0:
                most = sum(self.held(length))
                if math.floor(self.keep * length * self.profile.n_layers + 0.5) > most:  # the allocator's llround
                    budget = {"total_tokens": most}
            self._allocations[n] = depthkv.allocate(
                self._alloc_profile, policy=self.policy, scorer=self.scorer, lengths=lengths,
                protection=self.protection, obs_window=self.obs_window, min_tokens=self.min_tokens, **budget)
        return self._allocations[n]

    def post_init_from_model(self, model) -> None:
        self._model = weakref.ref(model)  # for a refused prefill's undo (_undo_prefill)
        if id(model) not in self._checked:
            check_profile_model(self.profile, model, "DepthKVPress", hash_check=self.check_model)
            self._checked[id(model)] = True
        windows = layer_windows(model)
        if windows != self.windows:
            self.windows, self._allocations = windows, {}
            self._alloc_profile = with_windows(self.profile, windows) if any(windows) else self.profile
        n_kv = model.config.num_key_value_heads
        if self.per_head:
            a = self.allocation(None)
            if a.head_budgets is None or a.head_budgets.shape[1] != n_kv:
                raise Error(f"DepthKVPress: the profile's head curves are not for {n_kv} KV heads")
        if self.per_head and model.config._attn_implementation not in WRAPPED:
            raise Error("DepthKVPress: per-head budgets need sdpa or eager attention")
        install_attention(model)
        if self.own is None:
            self.press.post_init_from_model(model)

    def _head_budgets(self, layer: int, n: int, n_kv: int) -> List[int]:
        a = self.allocation(n)
        if a.head_budgets is not None:
            ks = [int(x) for x in a.head_budgets[layer]]
            if len(ks) != n_kv:
                raise Error(f"DepthKVPress: {len(ks)} head budgets for {n_kv} KV heads in layer {layer}")
        else:
            ks = [int(a.budgets[layer])] * n_kv
        h = self.held(n)[layer]
        return [min(k, h) for k in ks]

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        """kvpress's hook, at the prefill of each layer: the layer's held tokens scored and pruned
        to its budgets. A refusal (a context below the protection, non-finite scores, ...) empties
        the layers this prefill already filled, up to this one, before the error propagates: the
        cache is left as before the prefill (kvpress prefills an empty cache), never part pruned."""
        try:
            return self._compress(module, hidden_states, keys, values, attentions, kwargs)
        except Exception:
            self._undo_prefill(module.layer_idx, kwargs.get("past_key_values"))
            raise

    def _undo_prefill(self, layer: int, cache) -> None:
        """Empties layers 0..layer of ``cache`` (and their mask states) and forgets the report."""
        self._report, self.kept, self.scores = {}, {}, {}
        for lay in (cache.layers[: layer + 1] if cache is not None else []):
            if getattr(lay, "is_initialized", True) and getattr(lay, "keys", None) is not None:
                lay.keys, lay.values = lay.keys[..., :0, :], lay.values[..., :0, :]
            if hasattr(lay, "cumulative_length"):
                lay.cumulative_length = 0
        for attn in self._modules_up_to(layer):
            setattr(attn, STATE, None)

    def _modules_up_to(self, layer: int) -> list:
        ref = getattr(self, "_model", None)
        model = ref() if ref is not None else None
        return [] if model is None else [lay.self_attn for lay in decoder_layers(model)[: layer + 1]]

    def _compress(self, module, hidden_states, keys, values, attentions, kwargs):
        layer = module.layer_idx
        n = hidden_states.shape[1]  # the context (kvpress compresses at the prefill)
        window = layer_window(module)
        if not self._report or layer <= max(self._report):  # a new prefill
            self._report, self.kept, self.scores = {}, {}, {}
        keys, values = usable(keys, n, window), usable(values, n, window)
        bsz, n_kv, h, _ = keys.shape
        ks = self._head_budgets(layer, n, n_kv)
        physical = max(ks)
        self._report[layer] = {"layer": layer, "length": h, "context": n, "window": window or 0, "budgets": ks,
                               "physical": physical, "masked": sum(physical - k for k in ks)}
        scores = None
        if min(ks) < h and self.own is not None:
            scores = held_scores(self.press, self.own, module, hidden_states, keys, values, kwargs["position_embeddings"])
        elif min(ks) < h:  # a kvpress press; a sliding-window layer: its held tokens are the last h
            hs, kw, att = hidden_states, kwargs, attentions
            if h < n:
                hs = hidden_states[:, n - h:]
                kw = dict(kwargs, position_embeddings=tuple(x[:, n - h:] for x in kwargs["position_embeddings"]))
                att = None if attentions is None else attentions[..., n - h:, n - h:]
            scores = self.press.score(module, hs, keys, values, att, kw)
        if scores is not None:
            self.scores[layer] = scores.detach().float().cpu()
        keys, values, idx = prune_layer(module, keys, values, n, ks, scores, self.select_protection)
        self.kept[layer] = idx + (n - h)
        return keys, values

    def memory_report(self) -> List[dict]:
        """Per layer of the last prefill: {"layer", "length" (the layer's held tokens before pruning:
        the context, or for a sliding-window layer at most window - 1), "context" (context tokens),
        "window" (sliding window, 0 for a global layer), "budgets" (per KV head), "physical" (the cache tensors'
        length), "masked" (masked (head, slot) pairs per sequence)}."""
        return [self._report[k] for k in sorted(self._report)]
