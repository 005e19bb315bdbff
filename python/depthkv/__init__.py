"""depthkv for Python: the C++ library's profiles, allocator, presets, ranking rule and engine.

Every function calls the header-only C++ library (depthkv._core, built with nanobind); invalid
input raises :class:`depthkv.Error` (a ``ValueError``) with the C++ ``depthkv::Error`` message.

>>> import depthkv
>>> prof = depthkv.load_profile("docs/results/stories260K.profile.json")
>>> a = depthkv.allocate(prof, keep=0.2, policy="optimal", scorer="snapkv")
>>> a.budgets                       # tokens each layer keeps (numpy int32)
>>> kept = depthkv.select_keep(scores, 40, protection=(4, 16))   # scores: float32 [heads, n]
>>> sc = depthkv.TokenScorer("snapkv", n_heads=8, n_kv_heads=4)   # the library's scorers over arrays
>>> sc.observe(probs)                  # attention probabilities float32 [n_heads, n_queries, n_keys]
>>> s = sc.scores()                    # float32 [n_kv_heads, n_keys]
>>> eng = depthkv.Engine("stories260K.bin")          # depthkv's engine (GGUF or llama2.c)
>>> ids = eng.tokenize(story)                         # a story of a few hundred tokens
>>> spec = dict(prof.selection, scorer="snapkv", policy="optimal", budget={"keep": 0.3})
>>> g = eng.generate(ids, 32, spec=spec, profile=prof)   # on the library's driver, as depthkv generate
>>> g.tokens, g.report["budgets"]                     # greedy tokens on the pruned cache, per-layer budgets
"""

from __future__ import annotations

import json
import operator
import os
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core
from ._core import Error, Profile

__all__ = [
    "Error",
    "Profile",
    "Allocation",
    "Spec",
    "POLICIES",
    "PRESETS",
    "DEFAULT_PROTECTION",
    "load_profile",
    "save_profile",
    "allocate",
    "preset",
    "select_keep",
    "keep_tokens",
    "TokenScorer",
    "SCORERS",
    "KEY_SCORERS",
    "KEY_READERS",
    "Engine",
    "Generation",
]

#: Every allocation policy name (the layer policies, then "head-optimal").
POLICIES: List[str] = list(_core.POLICIES)
#: The preset names.
PRESETS: List[str] = list(_core.PRESETS)
#: (n_sink, n_recent) of ``depthkv allocate`` when no --sinks/--recent is given.
DEFAULT_PROTECTION: Tuple[int, int] = (4, 16)
#: The observation window of ``depthkv allocate`` when no --obs-window is given (pyramid's window).
DEFAULT_OBS_WINDOW = 16
#: The SnapKV pooling kernel of ``depthkv allocate`` when no --kernel is given.
DEFAULT_KERNEL = 7
#: The built-in token scorers (include/depthkv/token_scorer.hpp).
SCORERS: List[str] = ["h2o", "h2o-v1", "h2o-v2", "snapkv", "tova", "knorm", "keydiff", "snapkv-keydiff"]
#: The scorers that read the keys only and observe no attention.
KEY_SCORERS: Tuple[str, ...] = ("knorm", "keydiff")
#: The scorers that read the keys (``TokenScorer.scores(n, keys=...)``): the key-only ones and
#: "snapkv-keydiff", which observes attention too.
KEY_READERS: Tuple[str, ...] = KEY_SCORERS + ("snapkv-keydiff",)

PathLike = Union[str, "os.PathLike[str]"]


def load_profile(path: PathLike) -> Profile:
    """Reads a profile file written by ``depthkv profile`` (or :func:`save_profile`).

    :raises Error: naming the file and what is wrong (missing, invalid JSON, schema errors)
    """
    return _core.load_profile(_path(path, "load_profile: path"))


def save_profile(profile: Profile, path: PathLike) -> None:
    """Writes ``profile`` as the CLI does (pretty-printed JSON; loading it back gives the same bytes).

    :raises Error: when the file cannot be written
    """
    _core.save_profile(_profile_arg(profile, "save_profile"), _path(path, "save_profile: path"))


class Allocation:
    """The budgets of one request (the C++ ``depthkv::Allocation``).

    Attributes:
        budgets: int32 [n_layers], tokens each layer keeps (head-optimal: the mean of its heads, rounded)
        head_budgets: int32 [n_layers, n_kv_heads] for head-optimal, else None
        total: the tokens kept over all layers (and heads)
        predicted_loss: the predicted total loss on the convexified curves (None when the policy reads no curves)
        policy, scorer: what allocated
        lengths: int32 [n_layers], tokens each layer (each of its heads) held
        tiers: the request's tiers (0: no limit)
        tier: int32 [n_layers], each layer's tier when tiers > 0 (tier 0: the layers of the smallest
            unrestricted optimal budgets), else None
    """

    def __init__(self, d: dict, keep: Optional[float], total_tokens: Optional[int]):
        self.policy: str = d["policy"]
        self.scorer: str = d["scorer"]
        self.budgets: np.ndarray = d["budgets"]
        self.head_budgets: Optional[np.ndarray] = d["head_budgets"]
        self.total: int = d["total"]
        self.predicted_loss: Optional[float] = d["predicted_loss"]
        self.lengths: np.ndarray = d["lengths"]
        self.tiers: int = d["tiers"]
        self.tier: Optional[np.ndarray] = d["tier"]
        self.keep = keep
        self.total_tokens = total_tokens

    @property
    def layers(self) -> np.ndarray:
        """Alias of ``budgets`` (the C++ field's name)."""
        return self.budgets

    @property
    def heads(self) -> Optional[np.ndarray]:
        """Alias of ``head_budgets`` (the C++ field's name)."""
        return self.head_budgets

    def to_dict(self) -> dict:
        """The object ``depthkv allocate --json`` prints for the same request (keep ratio, equal lengths)."""
        if self.keep is None or len(set(self.lengths.tolist())) > 1:
            raise Error("to_dict: the CLI's form needs a keep ratio and equal lengths")
        d = {"policy": self.policy, "scorer": self.scorer, "keep": self.keep, "length": int(self.lengths[0])}
        if self.head_budgets is not None:
            d.update(n_kv_heads=int(self.head_budgets.shape[1]), head_budgets=self.head_budgets.tolist())
        else:
            d["budgets"] = self.budgets.tolist()
        d["total"] = self.total
        if self.predicted_loss is not None:
            d["predicted_loss"] = self.predicted_loss
        if self.tiers > 0:
            d.update(tiers=self.tiers, tier=self.tier.tolist())
        return d

    def __repr__(self) -> str:
        return (f"Allocation(policy={self.policy!r}, scorer={self.scorer!r}, budgets={self.budgets.tolist()}, "
                f"total={self.total}, predicted_loss={self.predicted_loss})")


def _protection(protection: Sequence[int]) -> Tuple[int, int]:
    try:
        n_sink, n_recent = protection
        int(n_sink), int(n_recent)
    except (TypeError, ValueError):
        raise Error(f"protection must be (n_sink, n_recent), got {protection!r}") from None
    return _int32(n_sink, "protection n_sink"), _int32(n_recent, "protection n_recent")


def _profile_arg(profile, where: str) -> Profile:
    """``profile`` when it is a :class:`Profile`; else an Error (a path: load it first)."""
    if not isinstance(profile, Profile):
        hint = " (a path: depthkv.load_profile(path))" if isinstance(profile, (str, bytes, os.PathLike)) else ""
        raise Error(f"{where}: profile must be a depthkv.Profile{hint}, got {type(profile).__name__}")
    return profile


def _lengths(lengths, n_layers: int) -> Optional[List[int]]:
    if lengths is None:
        return None
    if np.ndim(lengths) == 0:
        return [_int32(lengths, "lengths")] * n_layers
    return [_int32(x, "lengths") for x in lengths]


def _budget(keep: Optional[float], total_tokens: Optional[int]) -> Tuple[Optional[float], Optional[int]]:
    if keep is not None and total_tokens is not None:
        raise Error("give exactly one of keep and total_tokens")
    if keep is None and total_tokens is None:
        keep = 0.2
    if total_tokens is not None:
        total_tokens = _int64(total_tokens, "total_tokens must be an integer, got {value!r}",
                              "total_tokens {value} is out of range")
    return (None if keep is None else _number(keep, "keep")), total_tokens


def allocate(profile: Profile, keep: Optional[float] = None, *, total_tokens: Optional[int] = None,
             policy: str = "optimal", scorer: Optional[str] = None, lengths=None,
             protection: Sequence[int] = DEFAULT_PROTECTION, obs_window: int = DEFAULT_OBS_WINDOW,
             min_tokens: int = -1, tiers: int = 0) -> Allocation:
    """Per-layer (and for "head-optimal" per-head) budgets: ``depthkv::allocate`` over the profile.

    The same request as ``depthkv allocate --profile F --keep K --policy P --scorer S --json``,
    with the same defaults, gives the same budgets.

    :param keep: global keep ratio in (0, 1] (default 0.2 when total_tokens is not given)
    :param total_tokens: or: the tokens kept over all layers
    :param policy: one of :data:`POLICIES`
    :param scorer: whose curves to use (default: the profile's first, as the CLI)
    :param lengths: tokens per layer (a list of n_layers, or one int; default: the profile's context length)
    :param protection: (n_sink, n_recent) every head keeps, inside the budget
    :param obs_window: the scorer's observation window (pyramid's window)
    :param min_tokens: the safeguard floor: -1 automatic, 0 off, N tokens per layer
    :param tiers: "optimal" only: the budgets in at most this many tiers, each tier's layers within
        one token of each other, the total exact (``BudgetRequest::tiers``, budget_allocator.hpp
        "Tiers"; ``depthkv allocate --tiers``); 0: no limit
    :raises Error: on an invalid request, a policy whose curves the profile lacks, an infeasible budget,
        negative tiers or tiers with another policy
    """
    keep, total_tokens = _budget(keep, total_tokens)
    n_sink, n_recent = _protection(protection)
    _profile_arg(profile, "allocate")
    d = _core.allocate(profile, _text(policy, "allocate: policy"), _text(scorer or "", "allocate: scorer"), keep, total_tokens, _lengths(lengths, profile.n_layers),
                       n_sink, n_recent, _int32(obs_window, "allocate: obs_window"),
                       _int32(min_tokens, "allocate: min_tokens"), _int32(tiers, "allocate: tiers"))
    return Allocation(d, keep, total_tokens)


class Spec(dict):
    """A ``depthkv::PruneSpec`` as a dict (the keys of ``prune_spec_to_json``: sinks, recent,
    obs_window, kernel, pooling, output_aware, head_alloc, head_alpha, lookahead, context_weight
    (when not 0), span_pooling (when true: :meth:`Engine.generate` pools the scores over the
    prompt's words and digit runs), scorer, policy, budget, schedule, safeguard). ``predicted`` maps each scorer the preset considered to its
    predicted loss."""

    predicted: Dict[str, float]


def preset(name: str, profile: Profile, keep: Optional[float] = None, *, total_tokens: Optional[int] = None,
           lengths=None, protection: Sequence[int] = DEFAULT_PROTECTION, obs_window: int = DEFAULT_OBS_WINDOW,
           kernel: int = DEFAULT_KERNEL, min_tokens: int = -1, lookahead: Optional[int] = None) -> Spec:
    """The recommended spec of preset ``name`` (one of :data:`PRESETS`) for one request:
    ``depthkv::preset`` (include/depthkv/preset.hpp), the scorer chosen by the lowest predicted loss
    of the profile's head curves.

    :raises Error: on an unknown preset, a profile without the candidates' head curves, or an infeasible request
    """
    keep, total_tokens = _budget(keep, total_tokens)
    n_sink, n_recent = _protection(protection)
    _profile_arg(profile, "preset")
    spec, predicted = _core.preset(_text(name, "preset: name"), profile, keep, total_tokens,
                                   _lengths(lengths, profile.n_layers), n_sink, n_recent,
                                   _int32(obs_window, "preset: obs_window"), _int32(kernel, "preset: kernel"),
                                   _int32(min_tokens, "preset: min_tokens"),
                                   None if lookahead is None else _int32(lookahead, "preset: lookahead"))
    out = Spec(spec)
    out.predicted = dict(predicted)
    return out


def select_keep(scores, k, protection: Sequence[int] = (0, 0), positions=None):
    """The kept slots (ascending) of each row by the evictor's rule: the protected slots (first
    n_sink, last n_recent) always, then the best others by (score descending, position ascending)
    until k; k >= n keeps all. NaN scores are refused.

    :param scores: float32, float16 or bfloat16 array [n] or [heads, n] on the CPU (numpy, or a
        torch tensor through DLPack), read in place; its last dimension must be contiguous
    :param k: tokens to keep per row (protected ones included), one int or one per head
    :param protection: (n_sink, n_recent)
    :param positions: optional int32 original positions [n] or [heads, n] (ties: the earlier stays)
    :return: int32 [kept] for [n] scores; int32 [heads, kept] for one k; a list of int32 arrays for one k per head
    :raises Error: on a bad shape, dtype, device or layout, NaN scores, or k below the protected count
    """
    if isinstance(scores, (list, tuple)):
        raise Error("select_keep: scores must be an array (numpy.asarray(scores, dtype=numpy.float32))")
    if isinstance(positions, (list, tuple)):
        positions = np.asarray(positions, dtype=np.int32)
    per_head = np.ndim(k) > 0
    ks = [_int32(x, "select_keep: k") for x in (np.ravel(k) if per_head else [k])]
    n_sink, n_recent = _protection(protection)
    scores = _host_array(scores, "scores", "select_keep")
    if positions is not None:
        positions = _host_array(positions, "positions", "select_keep")
    rows, matrix = _core.select_keep(scores, ks, n_sink, n_recent, positions)
    if not matrix:
        return rows[0]
    if per_head:
        return rows
    n = len(rows[0]) if rows else 0
    return np.stack(rows) if rows else np.zeros((0, n), dtype=np.int32)


def keep_tokens(ratio: float, n: int, protection: Sequence[int] = DEFAULT_PROTECTION) -> int:
    """Tokens a row of ``n`` keeps at keep ratio ``ratio`` (``depthkv::keep_tokens``, what the
    profiler prunes a layer to): ``round(ratio * n)``, at least the protected count (n_sink +
    n_recent, capped at n), at most n; ratio >= 1 keeps all.

    :raises Error: on a negative or NaN ratio, or n < 0
    """
    n_sink, n_recent = _protection(protection)
    return _core.keep_tokens(_number(ratio, "keep_tokens: ratio"), _int32(n, "keep_tokens: n"), n_sink, n_recent)


def _host_array(x, what: str, where: str = "TokenScorer"):
    """A torch tensor detached (DLPack refuses tensors that require grad); lists and tensors off
    the CPU refused."""
    if isinstance(x, (list, tuple)):
        raise Error(f"{where}: {what} must be an array (numpy.asarray({what}, dtype=numpy.float32)), not a list")
    if not (isinstance(x, (np.ndarray, np.generic)) or hasattr(x, "__dlpack__")):
        raise Error(f"{where}: {what} must be an array (numpy, or a torch tensor), got {type(x).__name__}")
    if isinstance(x, (np.ndarray, np.generic)) and x.dtype.kind not in "biuf":
        raise Error(f"{where}: {what} must hold numbers (float32, float16, bfloat16 or int32), got dtype {x.dtype}")
    device = getattr(getattr(x, "device", None), "type", "cpu")
    if device != "cpu":
        raise Error(f"{where}: {what} must be in host (CPU) memory, got a tensor on device {device!r} (.cpu() first)")
    return x.detach() if hasattr(x, "detach") else x


def _int32(value, what: str) -> int:
    """``value`` as a 32-bit int (the C++ parameter's range); else an Error naming ``what``."""
    v = _int64(value, f"{what} must be an integer, got {{value!r}}", f"{what} {{value}} is out of range")
    if not -2**31 <= v < 2**31:
        raise Error(f"{what} {v} is out of range (at most {2**31 - 1})")
    return v


def _number(value, what: str) -> float:
    """``value`` as a float (a real number or a numeric string, as ``float()`` takes it); else an
    Error naming ``what``."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise Error(f"{what} must be a number, got {value!r}") from None


def _text(value, what: str) -> str:
    """``value`` if it is a str; else an Error naming ``what``."""
    if not isinstance(value, str):
        raise Error(f"{what} must be a str, got {type(value).__name__}")
    return value


def _path(value, what: str) -> str:
    """``value`` as a file path (a str or an os.PathLike); else an Error naming ``what``."""
    try:
        return os.fspath(value)
    except TypeError:
        raise Error(f"{what} must be a file path (str or os.PathLike), got {type(value).__name__}") from None


class TokenScorer:
    """The library's token scorer of one layer (``depthkv::TokenScorer``, include/depthkv/token_scorer.hpp,
    where the formulas are), fed with attention probabilities as arrays and read in place.

    >>> sc = depthkv.TokenScorer("h2o", n_heads=8, n_kv_heads=4)
    >>> sc.observe(attn[0])           # float32 [n_heads, n_queries, n_keys]: positions 0, 1, ...
    >>> sc.scores()                    # float32 [n_kv_heads, n_keys]: s_j = sum over queries and the group's heads

    Scorers (:data:`SCORERS`): "h2o" (cumulative attention), "h2o-v1"/"h2o-v2" (times ||V_j||_1 / _2:
    pass ``values``), "snapkv" (the last ``window`` observed positions' attention, pooled along the
    slots with ``kernel`` and ``pooling`` "max", "avg" or "none"), "tova" (the last position's
    attention), "knorm" (-||K_j||_2: pass ``keys``; observes nothing), "keydiff" (-cos(K_j, mean unit
    key): pass ``keys``; observes nothing). Query head q belongs to KV
    head ``q // (n_heads // n_kv_heads)`` (GQA): its rows are summed into that KV head.
    ``output_aware=True`` multiplies h2o, snapkv and tova scores by the size of the value's
    contribution to the attention output (CriticalKV): pass ``values`` and ``wo``. ``lookahead=G``
    makes SnapKV's window the G observed rows (feed the rows of G lookahead queries).
    ``context_weight=w`` (with a lookahead; the "best" preset's spec gives 0) adds the context's
    own SnapKV window: feed the context's rows, call :meth:`begin_lookahead`, then feed the
    lookahead's rows; per KV head ``s_j = l_j + w * (L / C) * c_j``, l the lookahead's score, c the
    context window's, L and C their sums over the slots (include/depthkv/scorer_config.hpp).

    :param scorer: one of :data:`SCORERS`
    :param n_heads: query heads (a positive multiple of n_kv_heads)
    :param n_kv_heads: KV heads (default: n_heads)
    :param window: SnapKV's observation window (default 16, the CLI's --obs-window)
    :param kernel: SnapKV's pooling kernel (odd; default 7)
    :raises Error: on bad head counts, window < 1, an even kernel, an unknown scorer or pooling,
        output-aware scoring of a scorer that does not allow it, a negative lookahead, a negative
        or non-finite context_weight, or a context_weight without a lookahead
    """

    def __init__(self, scorer: str, n_heads: int, n_kv_heads: Optional[int] = None, *,
                 window: int = DEFAULT_OBS_WINDOW, kernel: int = DEFAULT_KERNEL, pooling: str = "max",
                 output_aware: bool = False, lookahead: int = 0, context_weight: float = 0.0):
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self._s = _core.TokenScorer(str(scorer), _int32(n_heads, "n_heads"), _int32(n_kv_heads, "n_kv_heads"),
                                    _int32(window, "window"), _int32(kernel, "kernel"), str(pooling),
                                    bool(output_aware), _int32(lookahead, "lookahead"), float(context_weight))

    scorer = property(lambda self: self._s.scorer, doc="the scorer's name")
    n_heads = property(lambda self: self._s.n_heads)
    n_kv_heads = property(lambda self: self._s.n_kv_heads)
    window = property(lambda self: self._s.window)
    kernel = property(lambda self: self._s.kernel)
    pooling = property(lambda self: self._s.pooling)
    output_aware = property(lambda self: self._s.output_aware)
    lookahead = property(lambda self: self._s.lookahead)
    context_weight = property(lambda self: self._s.context_weight)

    def begin_lookahead(self) -> None:
        """Rows observed from now on are the lookahead's; the ones before, the context's (only a
        scorer with ``context_weight`` > 0 keeps the two apart)."""
        self._s.begin_lookahead()

    def observe(self, probs, q_pos0: int = 0, q_head: Optional[int] = None) -> None:
        """Adds attention-probability rows: ``probs[q, i, j]`` is query head q's probability, at
        position ``q_pos0 + i``, of slot j (masked entries 0). Rows of one head arrive with
        non-decreasing positions (later calls continue, e.g. a chunked prefill); the number of
        slots may grow from call to call.

        :param probs: float32 [n_heads, n_queries, n_keys] (or [n_queries, n_keys] with ``q_head``) on
            the CPU (numpy, or a torch tensor through DLPack), read in place; its last dimension must
            be contiguous (rows and heads may be strided)
        :param q_pos0: the position of the first row
        :param q_head: the query head of a 2-D ``probs``
        :raises Error: on a bad shape, dtype, device or layout, a NaN, infinite or negative
            probability, or a position before one already observed; the scorer is unchanged then
        """
        self._s.observe(_host_array(probs, "probs"), _int32(q_pos0, "q_pos0"),
                        None if q_head is None else _int32(q_head, "q_head"))

    def scores(self, n=None, *, keys=None, values=None, wo=None):
        """Scores of the slots a layer holds: a higher score is a more important token.

        :param n: slots per KV head (an int, or one per head); default: those of ``keys``/``values``,
            else the slots the observed rows covered. Slots past the observed ones score 0 (attention
            scorers).
        :param keys: float32 [n_kv_heads, >= n, head_dim] (knorm and keydiff read them)
        :param values: float32 [n_kv_heads, >= n, head_dim] (h2o-v1, h2o-v2 and output-aware scorers read them)
        :param wo: float32 [dim, n_heads * head_dim], the layer's output projection (``o_proj.weight``),
            for output-aware scorers
        :return: float32 [n_kv_heads, n], or a list of float32 rows when the heads hold different counts
        :raises Error: on bad shapes or dtypes, an array off the CPU, a NaN or infinite key, value or
            ``wo`` element, a missing array the scorer reads, fewer slots than observed
        """
        if n is None and (keys is not None or values is not None):
            n = int((keys if keys is not None else values).shape[1])
        if n is not None and np.ndim(n) > 0:
            n = [_int32(x, "TokenScorer.scores: n") for x in np.ravel(n)]
        elif n is not None:
            n = _int32(n, "TokenScorer.scores: n")
        kv = [None if a is None else _host_array(a, name) for a, name in ((keys, "keys"), (values, "values"), (wo, "wo"))]
        return self._s.scores(n, *kv)

    def observed_size(self, kv_head: int) -> int:
        """Slots of KV head ``kv_head`` covered by the observed rows (0 for knorm and keydiff)."""
        return self._s.observed_size(int(kv_head))

    def reset(self) -> None:
        """Forgets every observation."""
        self._s.reset()

    def __repr__(self) -> str:
        return (f"TokenScorer({self.scorer!r}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                f"window={self.window}, kernel={self.kernel}, pooling={self.pooling!r}, "
                f"output_aware={self.output_aware}, lookahead={self.lookahead}, "
                f"context_weight={self.context_weight})")


# ---- depthkv's engine and its driver ------------------------------------------------------------

def _int64(value, not_int: str, out_of_range: str) -> int:
    """``value`` as an int in the binding's range (int64); else an Error with the message ``not_int``
    or ``out_of_range`` (formatted with ``value``)."""
    try:
        v = operator.index(value)
    except TypeError:
        raise Error(not_int.format(value=value)) from None
    if not -2**63 <= v < 2**63:
        raise Error(out_of_range.format(value=v))
    return v


def _token_ids(ids, what: str) -> List[int]:
    """``ids`` (a sequence of ints or a 1-D integer array) as a list of ints."""
    if isinstance(ids, (str, bytes)):
        raise Error(f"{what} must be a list of token ids, got text (use Engine.tokenize(text))")
    if np.ndim(ids) != 1:
        raise Error(f"{what} must be a 1-D sequence of token ids, got {np.ndim(ids)} dimensions")
    return [_int64(t, f"{what}: token {{value!r}} at position {i} is not an integer",
                   f"{what}: token {{value}} at position {i} is not a token id") for i, t in enumerate(ids)]


class Generation:
    """What :meth:`Engine.generate` returns.

    Attributes:
        tokens: the generated token ids (list of int), the prompt not included
        report: the driver's report (``depthkv::llama::GenerationReport``) as a dict:
            ``spec`` (the spec that chose the kept tokens, the fallback's when the preset's rule
            distrusted the prompt; None without a spec), ``pruned`` (the oneshot eviction ran),
            ``budgets`` (tokens kept per layer by the last eviction), ``head_budgets`` (per layer and
            KV head with head curves, else None), ``lengths`` (tokens per layer before it),
            ``bytes_before`` / ``bytes_after`` (KV bytes around it), ``peak_bytes`` (the most bytes
            the cache held after any chunk or step), ``evictions`` (a schedule's), ``rule_ran`` /
            ``trusted`` / ``context_nll`` / ``nll_tokens`` (the preset's per-input rule),
            ``raised_to_protection``, ``lookahead``, ``prefill_ms``, ``lookahead_ms``,
            ``schedule_ms``, ``tokens_seen``, and ``cache_lengths`` / ``cache_bytes`` (the cache at
            the end)
    """

    def __init__(self, d: dict):
        self.tokens: List[int] = list(d["tokens"])
        self.report: dict = d["report"]

    def __repr__(self) -> str:
        r = self.report
        return (f"Generation(tokens={len(self.tokens)}, pruned={r['pruned']}, budgets={r['budgets']}, "
                f"bytes_after={r['bytes_after']}, peak_bytes={r['peak_bytes']})")


def _max_new_tokens(value, where: str) -> int:
    """``max_new_tokens`` as an int the binding takes (its sign is checked there)."""
    return _int64(value, f"{where}: max_new_tokens must be an integer, got {{value!r}}",
                  f"{where}: max_new_tokens {{value}} is out of range")


def _spec_json(spec: Optional[Mapping], where: str) -> Optional[str]:
    """A spec (dict) as the JSON text the binding parses; None stays None."""
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise Error(f"{where}: spec must be a dict (depthkv.preset(...) or the JSON form of a PruneSpec), "
                    f"got {type(spec).__name__}")
    try:
        return json.dumps(dict(spec))
    except (TypeError, ValueError) as e:
        raise Error(f"{where}: spec is not JSON: {e}") from None


class Engine:
    """depthkv's reference engine over one model file (``depthkv::llama::LlamaEngine`` on the model
    ``depthkv::llama::open_model`` opens: GGUF, or a llama2.c checkpoint with ``tok512.bin`` beside
    it), and greedy generation on the library's prefill-evict-decode driver
    (``depthkv::llama::PrunedGeneration``), the one ``depthkv generate`` runs.

    >>> eng = depthkv.Engine("stories260K.bin")
    >>> ids = eng.tokenize(story)                       # BOS first, as depthkv generate
    >>> full = eng.generate(ids, 32)                    # the full cache
    >>> prof = depthkv.load_profile("stories260K.best.profile.json")   # with head curves
    >>> spec = depthkv.preset("best", prof, keep=0.3, lengths=len(ids))
    >>> g = eng.generate(ids, 32, spec=spec, profile=prof, preset="best")
    >>> eng.detokenize(ids + g.tokens), g.report["budgets"], g.report["bytes_after"]

    :param path: a GGUF file or a llama2.c checkpoint
    :param n_threads: OpenMP threads (None or 0: all cores)
    :param kv_type: the KV cache's element type, "f16" (default, as depthkv generate) or "f32"
    :param chunk: prefill chunk size (a chunked spec's schedule sets its own)
    :param tokenizer: a llama2.c tokenizer file (default: the GGUF file's vocabulary, or tok512.bin
        beside a llama2.c model)
    :raises Error: on a missing file, a directory, a file of no known format, a bad tokenizer file,
        n_threads outside [0, 1024], chunk < 1 or another kv_type
    """

    def __init__(self, path: PathLike, *, n_threads: Optional[int] = None, kv_type: str = "f16",
                 chunk: int = 1024, tokenizer: Optional[PathLike] = None):
        if not hasattr(_core, "Engine"):
            raise Error("Engine: this build of depthkv has no engine (it was built without PCRE2, libpcre2-dev)")
        self._e = _core.Engine(_path(path, "Engine: path"), _int32(n_threads or 0, "Engine: n_threads"),
                               _text(kv_type, "Engine: kv_type"), _int32(chunk, "Engine: chunk"),
                               "" if tokenizer is None else _path(tokenizer, "Engine: tokenizer"))

    path = property(lambda self: self._e.path, doc="the model file")
    format = property(lambda self: self._e.format, doc='"gguf" or "llama2.c"')
    kv_type = property(lambda self: self._e.kv_type, doc='"f16" or "f32"')
    n_threads = property(lambda self: self._e.n_threads, doc="OpenMP threads (0: all cores)")
    chunk = property(lambda self: self._e.chunk, doc="prefill chunk size")
    n_layers = property(lambda self: self._e.n_layers)
    n_heads = property(lambda self: self._e.n_heads, doc="query heads")
    n_kv_heads = property(lambda self: self._e.n_kv_heads, doc="key/value heads")
    head_dim = property(lambda self: self._e.head_dim)
    dim = property(lambda self: self._e.dim, doc="model width")
    vocab_size = property(lambda self: self._e.vocab_size)
    seq_len = property(lambda self: self._e.seq_len, doc="the trained context length")
    architecture = property(lambda self: self._e.architecture)
    layer_window = property(lambda self: self._e.layer_window,
                            doc="every layer's sliding window (list of int; 0: a global layer)")
    tokenizer_source = property(lambda self: self._e.tokenizer_source,
                                doc="the file the tokenizer came from (None: the model has none)")
    bos_id = property(lambda self: self._e.bos_id, doc="the BOS token (None: none)")
    eos_id = property(lambda self: self._e.eos_id, doc="the EOS token (None: none)")

    def tokenize(self, text: str, *, bos: bool = True) -> List[int]:
        """Token ids of ``text`` (BOS first unless ``bos=False``), as ``depthkv generate --prompt``.

        :raises Error: when the model has no tokenizer
        """
        if not isinstance(text, str):
            raise Error(f"tokenize: text must be a str, got {type(text).__name__}")
        return self._e.tokenize(text, bool(bos))

    def detokenize(self, ids) -> str:
        """The text of ``ids`` as ``depthkv generate`` prints it: each token as it follows the one
        before, a leading BOS printing nothing (bytes that are no UTF-8 are replaced).

        :raises Error: when the model has no tokenizer, or on an id outside the vocabulary
        """
        return self._e.detokenize(_token_ids(ids, "detokenize: ids")).decode("utf-8", errors="replace")

    def generate(self, prompt_ids, max_new_tokens: int, spec: Optional[Mapping] = None,
                 profile: Optional[Profile] = None, preset: Optional[str] = None, *,
                 stop: bool = True, suffix_ids=()) -> Generation:
        """Greedy generation on the driver: the prompt is prefilled (in chunks), the cache pruned as
        ``spec`` says (oneshot after the prompt, or a chunked/decode schedule), then up to
        ``max_new_tokens`` tokens are decoded greedily on the pruned cache. The same request as
        ``depthkv generate -t 0`` with the flags that give the same spec gives the same tokens.

        :param prompt_ids: the prompt's token ids (e.g. :meth:`tokenize`; BOS first as the CLI)
        :param max_new_tokens: tokens to generate (>= 0); the prompt, the suffix and the new tokens
            but the last must fit the model's context
            (``len(prompt_ids) + len(suffix_ids) + max_new_tokens - 1 <= seq_len``)
        :param spec: what to keep: a :class:`Spec` (:func:`preset`) or a dict of the same keys (the
            JSON form of ``depthkv::PruneSpec``, ``prune_spec_from_json``); None: the full cache
        :param profile: the profile whose curves the spec's policy reads (optimal, proportional,
            head-optimal, mga, mlma*); checked against the model (layers, KV heads, sliding windows,
            and the file's size and header hash for a profile made by ``depthkv profile``)
        :param preset: a preset name (:data:`PRESETS`) whose per-input rule serves the prompt, as
            ``depthkv generate --preset``: a prompt it distrusts is served by its fallback spec
            (needs ``spec``, normally ``preset(name, profile, ...)``)
        :param stop: stop before a token that ends a generation (BOS; byte-level BPE: EOS/EOT), as
            ``depthkv generate`` does
        :param suffix_ids: tokens fed after the prompt's pruning, on the pruned cache and never
            pruned by it (a question after a compressed context, kvpress's query-agnostic
            protocol); the generation follows them. Empty (default): the generation follows the
            prompt
        :return: a :class:`Generation` (tokens and the driver's report)
        :raises Error: on ids that are no tokens of the model, an empty prompt, max_new_tokens < 0 or
            beyond the context, an invalid spec, a profile of another model or without the curves
            the policy reads, an unknown preset, or a preset without a spec
        """
        ids = _token_ids(prompt_ids, "generate: prompt_ids")
        n = _max_new_tokens(max_new_tokens, "generate")
        spec_json = _spec_json(spec, "generate")
        if profile is not None and not isinstance(profile, Profile):
            raise Error(f"generate: profile must be a depthkv.Profile (depthkv.load_profile), got "
                        f"{type(profile).__name__}")
        suffix = _token_ids(suffix_ids, "generate: suffix_ids")
        return Generation(self._e.generate(ids, n, spec_json, profile, "" if preset is None else str(preset),
                                           bool(stop), suffix))

    def generate_many(self, prompt_ids, max_new_tokens: int, runs: Sequence[Mapping], *, stop: bool = True,
                      suffix_ids=()) -> List[Generation]:
        """:meth:`generate` for several specs on one prompt, with one prefill: the runs whose spec
        is oneshot (or None) share a single forward pass of the prompt, whose attention feeds every
        run's scorers; each run then prunes its own copy of that cache, feeds the suffix and decodes
        (``PrunedGeneration::prefill_shared``). Each result equals :meth:`generate`'s for the same
        run, but ``prefill_ms`` (the shared pass's). A run with a chunked or decode schedule (which
        evicts during its own prefill) is served by its own prefill. Memory: the shared cache plus
        one run's copy at a time.

        :param runs: one dict per run with the keys of :meth:`generate`: ``spec``, ``profile``,
            ``preset`` (each optional; ``{}``: the full cache)
        :return: one :class:`Generation` per run, in order
        :raises Error: as :meth:`generate` for any run (before any prefill), or on a run that is no
            dict or has other keys
        """
        ids = _token_ids(prompt_ids, "generate_many: prompt_ids")
        n = _max_new_tokens(max_new_tokens, "generate_many")
        if isinstance(runs, (str, bytes, Mapping)) or not isinstance(runs, Sequence):
            raise Error(f"generate_many: runs must be a list of dicts, got {type(runs).__name__}")
        specs, profiles, presets = [], [], []
        for i, run in enumerate(runs):
            if not isinstance(run, Mapping):
                raise Error(f"generate_many: run {i} must be a dict (spec, profile, preset), got {type(run).__name__}")
            extra = sorted(set(run) - {"spec", "profile", "preset"})
            if extra:
                raise Error(f"generate_many: run {i} has unknown keys {extra} (spec, profile, preset)")
            spec, profile, preset = run.get("spec"), run.get("profile"), run.get("preset")
            specs.append(_spec_json(spec, f"generate_many: run {i}"))
            if profile is not None and not isinstance(profile, Profile):
                raise Error(f"generate_many: run {i}: profile must be a depthkv.Profile (depthkv.load_profile), got "
                            f"{type(profile).__name__}")
            profiles.append(profile)
            presets.append("" if preset is None else str(preset))
        suffix = _token_ids(suffix_ids, "generate_many: suffix_ids")
        return [Generation(d) for d in self._e.generate_many(ids, n, specs, profiles, presets, bool(stop), suffix)]

    def __repr__(self) -> str:
        return (f"Engine({self.path!r}, format={self.format!r}, n_layers={self.n_layers}, n_heads={self.n_heads}, "
                f"n_kv_heads={self.n_kv_heads}, vocab_size={self.vocab_size}, seq_len={self.seq_len}, "
                f"kv_type={self.kv_type!r})")
