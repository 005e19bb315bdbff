"""depthkv for Python: the C++ library's profiles, allocator, presets and ranking rule.

Every function calls the header-only C++ library (depthkv._core, built with nanobind); invalid
input raises :class:`depthkv.Error` (a ``ValueError``) with the C++ ``depthkv::Error`` message.

>>> import depthkv
>>> prof = depthkv.load_profile("docs/results/stories260K.profile.json")
>>> a = depthkv.allocate(prof, keep=0.2, policy="optimal", scorer="snapkv")
>>> a.budgets                       # tokens each layer keeps (numpy int32)
>>> kept = depthkv.select_keep(scores, 40, protection=(4, 16))   # scores: float32 [heads, n]
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Tuple, Union

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

PathLike = Union[str, "os.PathLike[str]"]


def load_profile(path: PathLike) -> Profile:
    """Reads a profile file written by ``depthkv profile`` (or :func:`save_profile`).

    :raises Error: naming the file and what is wrong (missing, invalid JSON, schema errors)
    """
    return _core.load_profile(os.fspath(path))


def save_profile(profile: Profile, path: PathLike) -> None:
    """Writes ``profile`` as the CLI does (pretty-printed JSON; loading it back gives the same bytes).

    :raises Error: when the file cannot be written
    """
    _core.save_profile(profile, os.fspath(path))


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
        return int(n_sink), int(n_recent)
    except (TypeError, ValueError):
        raise Error(f"protection must be (n_sink, n_recent), got {protection!r}") from None


def _lengths(lengths, n_layers: int) -> Optional[List[int]]:
    if lengths is None:
        return None
    if np.ndim(lengths) == 0:
        return [int(lengths)] * n_layers
    return [int(x) for x in lengths]


def _budget(keep: Optional[float], total_tokens: Optional[int]) -> Tuple[Optional[float], Optional[int]]:
    if keep is not None and total_tokens is not None:
        raise Error("give exactly one of keep and total_tokens")
    if keep is None and total_tokens is None:
        keep = 0.2
    return (None if keep is None else float(keep)), (None if total_tokens is None else int(total_tokens))


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
    d = _core.allocate(profile, str(policy), scorer or "", keep, total_tokens, _lengths(lengths, profile.n_layers),
                       n_sink, n_recent, int(obs_window), int(min_tokens), int(tiers))
    return Allocation(d, keep, total_tokens)


class Spec(dict):
    """A ``depthkv::PruneSpec`` as a dict (the keys of ``prune_spec_to_json``: sinks, recent,
    obs_window, kernel, pooling, output_aware, head_alloc, head_alpha, lookahead, scorer, policy,
    budget, schedule, safeguard). ``predicted`` maps each scorer the preset considered to its
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
    spec, predicted = _core.preset(str(name), profile, keep, total_tokens, _lengths(lengths, profile.n_layers),
                                   n_sink, n_recent, int(obs_window), int(kernel), int(min_tokens),
                                   None if lookahead is None else int(lookahead))
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
    ks = [int(x) for x in np.ravel(k)] if per_head else [int(k)]
    n_sink, n_recent = _protection(protection)
    rows, matrix = _core.select_keep(scores, ks, n_sink, n_recent, positions)
    if not matrix:
        return rows[0]
    if per_head:
        return rows
    n = len(rows[0]) if rows else 0
    return np.stack(rows) if rows else np.zeros((0, n), dtype=np.int32)
