"""depthkv for Hugging Face causal LMs: :func:`profile` measures a model's per-layer (and per-(layer,
KV head)) loss curves with the protocol of ``depthkv profile`` and returns the profile the C++
library, the CLI and :class:`depthkv.kvpress.DepthKVPress` read.

>>> import depthkv, depthkv.hf
>>> prof = depthkv.hf.profile(model, tokenizer, texts, scorer="snapkv", output="model.profile.json")
>>> depthkv.allocate(prof, keep=0.2).budgets

Protocol (``depthkv profile``, include/depthkv/llama/eval.hpp). A window is a context (``context``
tokens, default 384) and a continuation (``continuation``, default 128). The full run prefills the
context; as each layer runs, a hook on its attention module scores the layer's held context slots
per KV head by the path :class:`depthkv.kvpress.DepthKVPress` scores them (depthkv._scoring: the
layer's attention rows recomputed from its input and keys, fed to a :class:`depthkv.TokenScorer`;
SnapKV: the last ``window`` query positions; TOVA: the last one; a sliding-window layer: over its
held tokens), so only one layer's rows exist at a time and the profile measures the selection the
press makes (needs kvpress, whose query projection helper it uses). The continuation is then
teacher-forced on the full cache (positions n, n+1, ...). For each
layer l and keep ratio r, only layer l's context cache is pruned, physically: each KV head keeps
``k = depthkv.keep_tokens(r, n, protection)`` slots chosen by :func:`depthkv.select_keep` (the
library's ranking: the first n_sink and last n_recent always, then the best scores, ties to the
earlier position), in position order, through the pruning path DepthKVPress uses
(depthkv._layers.prune_layer); every other layer keeps its full cache, and the continuation is
teacher-forced again with its original positions. A sliding-window layer of window w (Gemma 3's
local layers) first drops the context slots no later query sees (it keeps its last min(n, w - 1),
the tokens transformers' sliding cache holds) and keeps min(k, those) of them, ranked by their
scores, as ``depthkv profile`` prunes a local layer: its curve is over ratios of n, flat where k
reaches its window. The profile records every layer's window (``layer_window``, 0 for a global
layer: :func:`profile_windows`), by which the allocator caps a sliding layer at window - 1 tokens,
and the model's KV shape (``kv_shape``), as ``depthkv profile`` does. Metrics per window, over the
continuation rows: mean KL(full || pruned) of the next-token distributions (log-softmax in
float64), the increase of the mean NLL of the true next tokens (the rows that have one), and the
fraction of rows whose argmax differs. The library's ``SensitivityProfiler`` aggregates them over
the windows (mean and standard error, ``_core.profile_from_samples``). With ``head_curves=True`` each (layer l, KV head
h, ratio r) is measured the same way with only head h of layer l pruned; the other heads of the
layer keep everything, and head h's pruned slots are masked (depthkv.kvpress's head-tail rule).

Activation reuse (``reuse=True``): layers below the pruned one see exactly the full run's inputs
and caches, so their continuation outputs are the full run's; they are stored once per window and
replayed instead of recomputed (each decoder layer is called as ``layer(hidden_states, ...)`` and
returns what it returned in the full run), so a run for layer l computes layers l.. only. This
holds for decoders whose layers read nothing but their input and their own cache (Llama, Mistral,
Qwen, Gemma, ...); pass ``reuse=False`` for other models.

Evaluation (:func:`evaluate`, ``python -m depthkv.hf eval``): the same windows and metrics, with
the whole cache compressed by a press (a :class:`depthkv.kvpress.DepthKVPress` or a kvpress press,
:func:`make_press`) at each of a list of keep ratios, instead of one layer at a time.

Model identity (:func:`check_profile_model`): the hash :func:`model_identity` records lets
DepthKVPress refuse a profile of another model.

Per-layer cache lengths go through the attention mask rule of depthkv.kvpress (sdpa, eager; flash
attention without head curves), installed on the model by :func:`profile`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from contextlib import nullcontext as _nullcontext
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

import depthkv
from depthkv import Error, _core
from depthkv._attention import WRAPPED, install_attention
from depthkv._layers import STATE, decoder_layers as _layers, layer_window, layer_windows, prune_layer, usable

__all__ = ["profile", "evaluate", "make_press", "PressMaker", "eval_table", "KVPRESS_NAMES", "Window",
           "windows_from_texts", "load_windows", "model_identity", "check_profile_model", "layer_windows",
           "profile_windows", "with_windows", "DEFAULT_RATIOS"]

#: The keep ratios ``depthkv profile`` probes by default.
DEFAULT_RATIOS: Tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75)
#: ``depthkv profile``'s window shape and count.
DEFAULT_CONTEXT, DEFAULT_CONTINUATION, DEFAULT_WINDOWS = 384, 128, 24


class Window(NamedTuple):
    """One calibration window: token ids of the context (pruned) and of the continuation (scored)."""
    context: List[int]
    continuation: List[int]


def windows_from_texts(tokenizer, texts: Union[str, Iterable[str]], context: int = DEFAULT_CONTEXT,
                       continuation: int = DEFAULT_CONTINUATION, n_windows: Optional[int] = DEFAULT_WINDOWS,
                       skip: int = 0) -> List[Window]:
    """Consecutive windows of ``context + continuation`` tokens of the texts, each text tokenized by
    ``tokenizer`` (with its special tokens, e.g. BOS) and the ids concatenated; ``skip`` windows are
    left out first, then ``n_windows`` are taken (None: all that fit).

    :raises Error: when the texts hold fewer tokens than the windows need
    """
    if isinstance(texts, str):
        texts = [texts]
    size = int(context) + int(continuation)
    if int(context) < 1 or int(continuation) < 2:
        raise Error(f"windows: context must be >= 1 and continuation >= 2, got {context} and {continuation}")
    need = None if n_windows is None else (int(skip) + int(n_windows)) * size
    ids: List[int] = []
    for t in texts:
        ids.extend(int(x) for x in tokenizer(t)["input_ids"])
        if need is not None and len(ids) >= need:
            break
    count = len(ids) // size - int(skip) if n_windows is None else int(n_windows)
    if count < 1 or (int(skip) + count) * size > len(ids):
        raise Error(f"windows: the texts hold {len(ids)} tokens; {skip} + {n_windows} windows of {size} need "
                    f"{(int(skip) + max(count, 1)) * size}")
    out = []
    for w in range(int(skip), int(skip) + count):
        a = w * size
        out.append(Window(ids[a:a + int(context)], ids[a + int(context):a + size]))
    return out


def load_windows(path_or_dict) -> Tuple[List[Window], dict]:
    """The windows of a ``depthkv eval --windows-out`` file (or its parsed dict): (windows, the file's
    other keys: context, continuation, skip, source, model)."""
    d = path_or_dict
    if not isinstance(d, dict):
        with open(os.fspath(d), encoding="utf-8") as f:
            d = json.load(f)
    if "windows" not in d:
        raise Error("load_windows: no 'windows' key (expected depthkv eval --windows-out's file)")
    ws = [Window([int(x) for x in w["context"]], [int(x) for x in w["continuation"]]) for w in d["windows"]]
    return ws, {k: v for k, v in d.items() if k != "windows"}


def model_identity(model, name: Optional[str] = None) -> Tuple[str, int, str, int]:
    """(name, bytes, hash, bytes hashed) recorded as the profile's model: the HF name or path
    (``model.name_or_path``, else the class name), the bytes of its state dict, and
    "blake2b64:" + a 64-bit BLAKE2b of its config (JSON, without the fields that do not change its
    outputs: the transformers version, the attention implementation, the name, architectures and
    dtype, which ``save_pretrained`` fills in, and runtime output flags) and of every state-dict
    tensor (name, dtype, shape, bytes), so a model saved and loaded again keeps its identity."""
    name = name or getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "") or type(model).__name__
    cfg = model.config.to_dict()
    for k in ("transformers_version", "_attn_implementation", "attn_implementation", "_name_or_path",
              "_attn_implementation_autoset", "output_attentions", "output_hidden_states", "return_dict",
              "use_cache", "architectures", "dtype", "torch_dtype"):
        cfg.pop(k, None)
    h = hashlib.blake2b(digest_size=8)
    h.update(json.dumps(cfg, sort_keys=True, default=str).encode())
    size = 0
    for key, t in sorted(model.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)
        h.update(raw.tobytes())
        size += raw.size
    return str(name), int(size), "blake2b64:" + h.hexdigest(), int(size)


def _hf_hash(profile) -> Optional[str]:
    h = str((profile.model or {}).get("header_hash", ""))
    return h if h.startswith("blake2b64:") else None


def check_profile_model(profile, model, who: str = "depthkv", hash_check: bool = True) -> None:
    """Refuses a profile of another model (the rule). Always: the profile's layer count equals the
    model's decoder layers, the KV heads of its head curves (when it has any) equal
    ``config.num_key_value_heads``, and the sliding windows it records, when it records them, are the
    model's (:func:`layer_windows`). With ``hash_check``, when the profile was made by
    :func:`profile` (its model hash is "blake2b64:..."), that hash equals :func:`model_identity`'s
    of the model (config and weights). Profiles made by ``depthkv profile`` record the hash of a
    GGUF / llama2.c file, which an HF model cannot reproduce: only the structure is checked.

    :raises Error: naming the profile's model and what differs (and ``check_model=False`` as the way
        to skip the hash)
    """
    rec = profile.model or {}
    name = rec.get("file", "?")
    n_layers = len(_layers(model))
    if profile.n_layers != n_layers:
        raise Error(f"{who}: the profile is of another model: it has {profile.n_layers} layers, the model "
                    f"{n_layers} (profile of {name})")
    n_kv = int(model.config.num_key_value_heads)
    for s in profile.scorers:
        h = profile.n_kv_heads(s)
        if h is not None and h != n_kv:
            raise Error(f"{who}: the profile is of another model: its {s} head curves are for {h} KV heads, the "
                        f"model has {n_kv} (profile of {name})")
    recorded, windows = profile_windows(profile), layer_windows(model)
    if recorded is not None and recorded != windows:
        raise Error(f"{who}: the profile is of another model: its layers' sliding windows are {recorded}, the "
                    f"model's {windows} (profile of {name})")
    want = _hf_hash(profile)
    if hash_check and want is not None:
        got = model_identity(model)[2]
        if got != want:
            raise Error(f"{who}: the profile is of another model: it records {name} ({want}), the model hashes "
                        f"to {got} (config and weights; pass check_model=False to apply it anyway)")


# ---- the runs of one window ---------------------------------------------------------------------

def _is_windows_file(data) -> bool:
    return isinstance(data, dict) or (isinstance(data, (str, os.PathLike)) and str(data).endswith(".json")
                                      and os.path.exists(data))


def _is_texts(data) -> bool:
    return isinstance(data, str) or (isinstance(data, (list, tuple)) and len(data) > 0 and isinstance(data[0], str))


def _as_windows(tokenizer, data, context, continuation, n_windows, skip) -> Tuple[List[Window], dict]:
    """The windows of ``data``: texts (needs the tokenizer), windows, or a --windows-out dict / file."""
    if _is_windows_file(data):
        ws, meta = load_windows(data)
        return ws[:n_windows] if n_windows else ws, meta
    if _is_texts(data):
        if tokenizer is None:
            raise Error("depthkv.hf.profile: texts need a tokenizer")
        return windows_from_texts(tokenizer, data, context, continuation, n_windows, skip), {"skip": skip}
    if data is None:
        raise Error("depthkv.hf.profile: give texts, token windows or a windows file")
    ws = []
    for w in data:
        c, t = (w["context"], w["continuation"]) if isinstance(w, dict) else w
        ws.append(Window([int(x) for x in c], [int(x) for x in t]))
    return ws[:n_windows] if n_windows else ws, {"skip": skip}


def _cache_of(keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> DynamicCache:
    """A DynamicCache whose layers hold the given tensors (no copy; appends make new tensors)."""
    cache = DynamicCache()
    layers = []
    for k, v in zip(keys, values):
        layer = DynamicLayer()
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
        layers.append(layer)
    cache.layers = layers
    return cache


class _Metrics(NamedTuple):
    kl: float
    dnll: float
    top1: float


class _Reference:
    """The full-cache continuation of one window: log-probabilities (float64), argmax and NLL of the
    true next tokens; :meth:`metrics` compares a pruned run's logits [Tc, vocab] with it."""

    def __init__(self, logits: torch.Tensor, targets: torch.Tensor):
        self.logp = torch.log_softmax(logits.double(), dim=-1)
        self.top = logits.argmax(-1)
        self.targets = targets
        self.nll = float(-self.logp[:-1].gather(1, targets[:, None]).mean())

    def metrics(self, logits: torch.Tensor) -> _Metrics:
        """Mean KL(full || pruned) over the rows, the NLL increase, the fraction of changed argmax."""
        lp = torch.log_softmax(logits.double(), dim=-1)
        kl = float((self.logp.exp() * (self.logp - lp)).sum(-1).mean())
        dnll = float(-lp[:-1].gather(1, self.targets[:, None]).mean()) - self.nll
        top1 = float((logits.argmax(-1) != self.top).double().mean())
        return _Metrics(kl, dnll, top1)


class _Settings(NamedTuple):
    scorers: List[str]
    ratios: List[float]
    protection: Tuple[int, int]
    window: int
    kernel: int
    pooling: str
    output_aware: bool
    head_curves: bool
    reuse: bool


class _FullRun:
    """The full run of one window: the context caches, every layer's scorers (fed during the
    prefill, one layer's attention at a time), the continuation's log-probabilities and argmax, and
    (for reuse) every decoder layer's continuation output."""

    def __init__(self, model, w: Window, s: _Settings):
        dev = model.device
        self.model, self.n, self.tc = model, len(w.context), len(w.continuation)
        self.cont = torch.tensor([w.continuation], device=dev)
        self.pos = torch.arange(self.n, self.n + self.tc, device=dev)[None]
        self.targets = torch.tensor(w.continuation[1:], device="cpu")
        self.scorers = self._prefill(model, torch.tensor([w.context], device=dev), s)
        self.outputs: List[object] = []
        hooks = [layer.register_forward_hook(lambda m, a, o: self.outputs.append(o))
                 for layer in (_layers(model) if s.reuse else [])]
        try:
            logits = self.continuation(self.keys, self.values)
        finally:
            for h in hooks:
                h.remove()
        self.ref = _Reference(logits, self.targets)
        self.nll = self.ref.nll

    def _prefill(self, model, ids: torch.Tensor, s: _Settings) -> List[Dict[str, np.ndarray]]:
        """Prefills the context; a hook on every attention module scores that layer's held slots as
        the layer runs (depthkv._scoring.held_scores, DepthKVPress's scoring path): per layer, per
        scorer, float32 [n_kv_heads, held]."""
        from depthkv._scoring import held_scores  # needs kvpress (its query projection helper)

        own = {"window": s.window, "kernel": s.kernel, "pooling": s.pooling, "output_aware": s.output_aware}
        scores: List[Dict[str, np.ndarray]] = [{} for _ in _layers(model)]

        def feed(layer: int):
            def hook(module, args, kwargs, out):
                hs = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
                lay = kwargs["past_key_values"].layers[layer]
                w = layer_window(module)
                keys, values = usable(lay.keys, self.n, w), usable(lay.values, self.n, w)
                for x in s.scorers:
                    scores[layer][x] = held_scores(x, own, module, hs, keys, values,
                                                   kwargs["position_embeddings"])[0].numpy()
            return hook

        hooks = [layer.self_attn.register_forward_hook(feed(i), with_kwargs=True) for i, layer in enumerate(_layers(model))]
        try:
            cache = DynamicCache()
            with torch.no_grad():
                model.model(input_ids=ids, past_key_values=cache)
        finally:
            for h in hooks:
                h.remove()
        self.keys = [layer.keys for layer in cache.layers]
        self.values = [layer.values for layer in cache.layers]
        return scores

    def continuation(self, keys, values, first: int = 0) -> torch.Tensor:
        """The continuation's logits [Tc, vocab] (float32, CPU) on a cache of the given layers;
        layers below ``first`` replay the full run's outputs."""
        layers = _layers(self.model)
        saved = [layers[i].__dict__.get("forward") for i in range(first)]  # e.g. accelerate's hooked forward
        for i in range(first):
            layers[i].forward = (lambda out: (lambda *a, **k: out))(self.outputs[i])
        try:
            with torch.no_grad():
                out = self.model(input_ids=self.cont, past_key_values=_cache_of(keys, values), position_ids=self.pos)
        finally:
            for i in range(first):
                if saved[i] is None:
                    del layers[i].forward
                else:
                    layers[i].forward = saved[i]
        return out.logits[0].float().cpu()

    def metrics(self, logits: torch.Tensor) -> _Metrics:
        return self.ref.metrics(logits)


def _layer_scores(run: _FullRun, scorer: str, layer: int) -> np.ndarray:
    """float32 [n_kv_heads, held]: the scorer's scores of layer ``layer``'s held context slots (the
    last ``held(n, window)``: every slot for a full-attention layer), taken at the prefill."""
    return np.ascontiguousarray(run.scorers[layer][scorer])


def _pruned_run(model, run: _FullRun, s: _Settings, scores: np.ndarray, layer: int, budgets: List[int],
                reuse: bool) -> _Metrics:
    """The metrics with only layer ``layer``'s cache pruned, its KV heads to ``budgets`` (at most its
    held tokens; depthkv._layers.prune_layer: the path DepthKVPress prunes by)."""
    attn = _layers(model)[layer].self_attn
    w = layer_window(attn)
    keys, values = list(run.keys), list(run.values)
    held_k, held_v = usable(keys[layer], run.n, w), usable(values[layer], run.n, w)
    try:
        keys[layer], values[layer], _ = prune_layer(attn, held_k, held_v, run.n, budgets,
                                                    torch.from_numpy(scores)[None], s.protection)
        return run.metrics(run.continuation(keys, values, layer if reuse else 0))
    finally:
        setattr(attn, STATE, None)


def _layer_runs(model, run: _FullRun, s: _Settings, scores: np.ndarray, layer: int, reuse: bool) -> List[_Metrics]:
    """Only layer ``layer`` pruned, at each ratio (of the context; at most the layer's held tokens)."""
    n_kv = scores.shape[0]
    return [_pruned_run(model, run, s, scores, layer, [depthkv.keep_tokens(r, run.n, s.protection)] * n_kv, reuse)
            for r in s.ratios]


def _head_runs(model, run: _FullRun, s: _Settings, scores: np.ndarray, layer: int, reuse: bool) -> List[List[_Metrics]]:
    """Only KV head h of layer ``layer`` pruned, at each ratio ([head][ratio]): the head's kept slots
    first (position order), its other held slots after them, masked; the other heads keep every
    held slot."""
    n_kv, h = scores.shape
    out = []
    for head in range(n_kv):
        row = []
        for r in s.ratios:
            budgets = [h] * n_kv
            budgets[head] = depthkv.keep_tokens(r, run.n, s.protection)
            row.append(_pruned_run(model, run, s, scores, layer, budgets, reuse))
        out.append(row)
    return out


class _Progress:
    def __init__(self, progress, total: int):
        self.fn = progress if callable(progress) else None
        self.bar = progress is True
        self.done, self.total, self.t0 = 0, total, time.perf_counter()

    def step(self, n: int, label: str) -> None:
        self.done += n
        if self.fn is not None:
            self.fn(self.done, self.total)
        if self.bar:
            el = time.perf_counter() - self.t0
            eta = el / self.done * (self.total - self.done) if self.done else 0.0
            end = "\n" if self.done == self.total else ""
            print(f"\rdepthkv.hf.profile {label}: {self.done}/{self.total} runs, {el:.1f} s, eta {eta:.1f} s   ",
                  end=end, file=sys.stderr, flush=True)


def _ratios(keep_ratios) -> List[float]:
    ratios = [float(r) for r in keep_ratios]
    if not ratios or any(not 0.0 < r < 1.0 for r in ratios) or ratios != sorted(set(ratios)):
        raise Error(f"depthkv.hf.profile: keep_ratios must be strictly ascending in (0, 1), got {list(keep_ratios)}")
    return ratios


def _settings(model, scorer, keep_ratios, protection, window, kernel, pooling, output_aware, head_curves,
              reuse, metric) -> _Settings:
    if not hasattr(getattr(model, "config", None), "num_attention_heads") or not hasattr(model, "model"):
        raise Error(f"depthkv.hf.profile: model must be a transformers causal LM, got {type(model).__name__}")
    if isinstance(keep_ratios, (str, bytes)):
        raise Error(f"depthkv.hf.profile: keep_ratios must be a sequence of numbers, got {keep_ratios!r}")
    scorers = [x.strip() for x in scorer.split(",")] if isinstance(scorer, str) else [str(x) for x in scorer]
    if not scorers or len(set(scorers)) != len(scorers):
        raise Error(f"depthkv.hf.profile: give one or more distinct scorers, got {scorer!r}")
    for name in scorers:  # every scorer setting checked by the library before any run
        depthkv.TokenScorer(name, model.config.num_attention_heads, model.config.num_key_value_heads,
                            window=window, kernel=kernel, pooling=pooling, output_aware=output_aware)
    ratios = _ratios(keep_ratios)
    prot = depthkv._protection(protection)
    if min(prot) < 0:
        raise Error(f"depthkv.hf.profile: protection must be >= 0, got {prot}")
    if metric not in ("kl", "dnll", "top1"):
        raise Error(f"depthkv.hf.profile: unknown loss metric {metric!r} (expected kl, dnll or top1)")
    if head_curves and model.config._attn_implementation not in WRAPPED:
        raise Error("depthkv.hf.profile: head curves need sdpa or eager attention (per-head masks)")
    return _Settings(scorers, ratios, prot, int(window), int(kernel), str(pooling), bool(output_aware),
                     bool(head_curves), bool(reuse))


def _check_windows(model, windows: List[Window]) -> Tuple[int, int]:
    if not windows:
        raise Error("depthkv.hf.profile: no windows")
    n, tc = len(windows[0].context), len(windows[0].continuation)
    if any(len(w.context) != n or len(w.continuation) != tc for w in windows):
        raise Error("depthkv.hf.profile: every window must have the same context and continuation lengths")
    if n < 1 or tc < 2:
        raise Error(f"depthkv.hf.profile: context must be >= 1 and continuation >= 2 tokens, got {n} and {tc}")
    vocab = model.config.vocab_size
    if any(not 0 <= t < vocab for w in windows for t in w.context + w.continuation):
        raise Error(f"depthkv.hf.profile: a token id outside the vocabulary of {vocab}")
    return n, tc


def _measure(model, windows: List[Window], s: _Settings, progress) -> Tuple[dict, dict]:
    """Per scorer, the metrics (kl, dnll, top1) of every run: [3, n_layers, n_ratios, n_windows]
    and, with head curves, [3, n_layers * n_kv_heads, n_ratios, n_windows]."""
    L, H = len(_layers(model)), model.config.num_key_value_heads
    R, W = len(s.ratios), len(windows)
    layer_m = {x: np.zeros((3, L, R, W)) for x in s.scorers}
    head_m = {x: np.zeros((3, L * H, R, W)) for x in s.scorers} if s.head_curves else {}
    bar = _Progress(progress, W * len(s.scorers) * L * R * (1 + (H if s.head_curves else 0)))
    was_training = model.training
    model.eval()
    try:
        for w, win in enumerate(windows):
            run = _FullRun(model, win, s)
            for x in s.scorers:
                for layer in range(L):
                    sc = _layer_scores(run, x, layer)
                    for k, m in enumerate(_layer_runs(model, run, s, sc, layer, s.reuse)):
                        layer_m[x][:, layer, k, w] = m
                    bar.step(R, x)
                    if not s.head_curves:
                        continue
                    for h, row in enumerate(_head_runs(model, run, s, sc, layer, s.reuse)):
                        for k, m in enumerate(row):
                            head_m[x][:, layer * H + h, k, w] = m
                    bar.step(R * H, x + " heads")
            del run
    finally:
        model.train(was_training)
    return layer_m, head_m


def profile_windows(profile) -> Optional[List[int]]:
    """The per-layer sliding windows a profile records (``layer_window``: 0 for a global layer), or
    None when it records none (a model without sliding-window layers, or an older file)."""
    w = json.loads(profile.to_json()).get("layer_window")
    return None if w is None else [int(x) for x in w]


def with_windows(profile, windows: Sequence[int], kv_shape: Optional[Tuple[int, int]] = None) -> depthkv.Profile:
    """The profile with ``layer_window`` = ``windows`` (per layer, 0 for a global layer; all 0: none
    recorded) and, when given, ``kv_shape`` = (n_kv_heads, head_dim): what the allocator caps the
    sliding layers by (budget_allocator.hpp ``window_caps``) and what byte reports read.

    :raises Error: on a window list of another length than the profile's layers, or a negative window
    """
    windows = [int(w) for w in windows]
    if len(windows) != profile.n_layers or min(windows) < 0:
        raise Error(f"with_windows: {len(windows)} windows for {profile.n_layers} layers, each >= 0, got {windows}")
    d = json.loads(profile.to_json())
    d.pop("layer_window", None)
    if any(windows):
        d["layer_window"] = windows
    if kv_shape is not None:
        d["kv_shape"] = {"n_kv_heads": int(kv_shape[0]), "head_dim": int(kv_shape[1])}
    import tempfile
    fd, path = tempfile.mkstemp(suffix=".profile.json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(d, f)
        return depthkv.load_profile(path)
    finally:
        os.unlink(path)


def profile(model, tokenizer=None, data=None, *, keep_ratios: Sequence[float] = DEFAULT_RATIOS,
            scorer: Union[str, Sequence[str]] = "snapkv", protection: Sequence[int] = depthkv.DEFAULT_PROTECTION,
            window: int = depthkv.DEFAULT_OBS_WINDOW, kernel: int = depthkv.DEFAULT_KERNEL, pooling: str = "max",
            output_aware: bool = False, head_curves: bool = False, context: int = DEFAULT_CONTEXT,
            continuation: int = DEFAULT_CONTINUATION, n_windows: Optional[int] = DEFAULT_WINDOWS, skip: int = 0,
            metric: str = "kl", reuse: bool = True, name: Optional[str] = None, text_file: Optional[str] = None,
            output=None, progress: Union[bool, Callable[[int, int], None], None] = None) -> depthkv.Profile:
    """Measures the loss curves of a Hugging Face causal LM (module docstring: the protocol) and
    returns them as a :class:`depthkv.Profile` (written to ``output`` when given).

    :param model: a transformers causal LM (``model.model`` its decoder, ``model.config`` with
        num_attention_heads and num_key_value_heads), on any device, in eval mode
    :param tokenizer: the model's tokenizer (needed for texts only; None for token windows)
    :param data: texts (a str or a list of str: cut into windows of context + continuation tokens,
        :func:`windows_from_texts`), token windows (a list of (context ids, continuation ids) or of
        dicts with "context" and "continuation"), or a ``depthkv eval --windows-out`` file / dict
    :param keep_ratios: probed ratios, strictly ascending in (0, 1) (default: ``depthkv profile``'s six)
    :param scorer: a scorer name or several (:data:`depthkv.SCORERS`; "h2o,snapkv" as the CLI's --scorers)
    :param protection: (n_sink, n_recent) every head keeps (the CLI's --sinks, --recent)
    :param window, kernel, pooling, output_aware: the scorers' settings (--obs-window, --kernel, --pooling, --output-aware)
    :param head_curves: also measure the per-(layer, KV head) curves (n_kv_heads times the runs)
    :param context, continuation, n_windows, skip: the windows cut from texts (n_windows also limits given windows)
    :param metric: the profile's default metric ("kl", "dnll" or "top1"); all three are stored
    :param reuse: replay the full run's outputs below the pruned layer (module docstring)
    :param name: the model name recorded (default: ``model.name_or_path``)
    :param text_file: the calibration source recorded (default: the windows file's source, else "")
    :param progress: True for a progress line on stderr, or a function (done, total)
    :raises Error: on bad settings or windows, a model whose attention cannot be masked per layer
    """
    s = _settings(model, scorer, keep_ratios, protection, window, kernel, pooling, output_aware, head_curves, reuse,
                  metric)
    windows, meta = _as_windows(tokenizer, data, context, continuation, n_windows, skip)
    n, tc = _check_windows(model, windows)
    install_attention(model, who="depthkv.hf.profile")
    L, H = len(_layers(model)), model.config.num_key_value_heads
    layer_m, head_m = _measure(model, windows, s, progress)
    ident = model_identity(model, name)
    src = text_file if text_file is not None else str(meta.get("source", ""))
    prof = _core.profile_from_samples(
        L, s.ratios, {x: tuple(np.ascontiguousarray(a) for a in m) for x, m in layer_m.items()},
        {x: (H, tuple(np.ascontiguousarray(a) for a in m)) for x, m in head_m.items()}, ident, src, n, tc,
        int(meta.get("skip", 0)), "hf " + ("pre-tokenized" if tokenizer is None else "text"),
        (s.protection[0], s.protection[1], s.window, s.kernel), s.pooling, s.output_aware, str(metric))
    cfg = model.config
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    prof = with_windows(prof, layer_windows(model), (H, head_dim))
    if output is not None:
        depthkv.save_profile(prof, output)
    return prof


# ---- evaluation of a press: KL(full || pruned) over windows --------------------------------------

def _kvpress_table():
    """kvpress's presses by name (:data:`KVPRESS_NAMES`): name -> (label, the attention
    implementation the press needs, factory (window, kernel) -> press); the presses and settings of
    benchmarks/kvpress_peer."""
    import kvpress as kp

    def snap(w, k):
        return kp.SnapKVPress(window_size=w, kernel_size=k)
    return {
        "snapkv": ("kvpress SnapKV", "sdpa", snap),
        "adakv-snapkv": ("kvpress AdaKV+SnapKV", "sdpa", lambda w, k: kp.AdaKVPress(snap(w, k))),
        "criticalkv-snapkv": ("kvpress CriticalKV+SnapKV", "sdpa", lambda w, k: kp.CriticalKVPress(snap(w, k))),
        "criticaladakv-snapkv": ("kvpress CriticalAdaKV+SnapKV", "sdpa",
                                 lambda w, k: kp.CriticalAdaKVPress(snap(w, k))),
        "pyramidkv": ("kvpress PyramidKV", "sdpa", lambda w, k: kp.PyramidKVPress(window_size=w, kernel_size=k)),
        "tova": ("kvpress TOVA", "sdpa", lambda w, k: kp.TOVAPress()),
        "streamingllm": ("kvpress StreamingLLM", "sdpa", lambda w, k: kp.StreamingLLMPress(n_sink=4)),
        "expected-attention": ("kvpress ExpectedAttention", "sdpa", lambda w, k: kp.ExpectedAttentionPress()),
        "adakv-expected-attention": ("kvpress AdaKV+ExpectedAttention", "sdpa",
                                     lambda w, k: kp.AdaKVPress(kp.ExpectedAttentionPress(use_vnorm=True))),
        "keydiff": ("kvpress KeyDiff", "sdpa", lambda w, k: kp.KeyDiffPress()),
        "knorm": ("kvpress Knorm", "sdpa", lambda w, k: kp.KnormPress()),
        "observed-attention": ("kvpress ObservedAttention (H2O)", "eager", lambda w, k: kp.ObservedAttentionPress()),
    }


KVPRESS_NAMES = ("snapkv", "adakv-snapkv", "criticalkv-snapkv", "criticaladakv-snapkv", "pyramidkv", "tova",
                 "streamingllm", "expected-attention", "adakv-expected-attention", "keydiff", "knorm",
                 "observed-attention")


class PressMaker(NamedTuple):
    """What :func:`evaluate` runs: ``make(keep)`` returns the press at a keep ratio; ``attn`` is the
    attention implementation it needs (None: the model's)."""
    label: str
    make: Callable[[float], object]
    attn: Optional[str] = None


def make_press(name: str, profile=None, *, policy: str = "optimal", scorer_press=None, window: Optional[int] = None,
               kernel: int = depthkv.DEFAULT_KERNEL, protection: Optional[Sequence[int]] = None,
               check_model: bool = True) -> PressMaker:
    """A press by name for :func:`evaluate`: "depthkv" (:class:`depthkv.kvpress.DepthKVPress` with
    ``profile`` and ``policy``; ``scorer_press`` a kvpress name of :data:`KVPRESS_NAMES` built with
    ``window``/``kernel``, a depthkv scorer name, or None: kvpress's SnapKV with the profile's
    obs_window and ``kernel``), or a kvpress press of :data:`KVPRESS_NAMES` (its compression ratio
    1 - keep; ``window``, default the profile's obs_window or 16, and ``kernel`` for the SnapKV ones).

    :raises Error: on an unknown name, or "depthkv" without a profile
    """
    sel = (profile.selection or {}) if isinstance(profile, depthkv.Profile) else {}
    w = int(window if window is not None else sel.get("obs_window", depthkv.DEFAULT_OBS_WINDOW))
    if name == "depthkv":
        if profile is None:
            raise Error("make_press: the depthkv press needs a profile")
        from depthkv.kvpress import DepthKVPress
        prot = tuple(protection) if protection is not None else depthkv.DEFAULT_PROTECTION
        inner = scorer_press if scorer_press is not None else "kvpress:snapkv"
        own = not inner.startswith("kvpress:")
        if not own and inner[8:] not in _kvpress_table():
            raise Error(f"make_press: unknown kvpress press {inner!r} (kvpress:NAME, NAME one of "
                        f"{', '.join(KVPRESS_NAMES)})")
        label = f"DepthKVPress {policy} + " + (f"depthkv {inner}" if own else _kvpress_table()[inner[8:]][0])

        def depthkv_press(keep):
            sp = inner if own else _kvpress_table()[inner[8:]][2](w, kernel)
            return DepthKVPress(profile, keep, policy, sp, protection=prot, check_model=check_model)
        return PressMaker(label, depthkv_press)
    table = _kvpress_table()
    if name not in table:
        raise Error(f"make_press: unknown press {name!r} (depthkv or one of {', '.join(KVPRESS_NAMES)})")
    label, attn, factory = table[name]

    def kvpress_press(keep):
        p = factory(w, kernel)
        p.compression_ratio = 1.0 - float(keep)
        return p
    return PressMaker(label, kvpress_press, attn)


def _as_maker(press) -> PressMaker:
    if isinstance(press, PressMaker):
        return press
    if isinstance(press, str):
        return make_press(press)
    if hasattr(press, "with_keep"):  # a DepthKVPress
        return PressMaker(f"DepthKVPress {press.policy}", press.with_keep)
    if callable(press) and not hasattr(press, "compress"):
        return PressMaker(getattr(press, "__name__", "press"), press)
    if hasattr(press, "compression_ratio"):
        def at(keep, p=press):
            p.compression_ratio = 1.0 - float(keep)
            return p
        return PressMaker(type(press).__name__, at)
    raise Error(f"evaluate: press must be a name, a press, a PressMaker or a function keep -> press, "
                f"got {type(press).__name__}")


class _EvalProgress:
    """tqdm when installed, else a counter line on stderr."""

    def __init__(self, enabled: bool, total: int, label: str):
        self.bar, self.line, self.done, self.total, self.label = None, False, 0, total, label
        if not enabled:
            return
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=f"depthkv.hf eval {label}", unit="run", file=sys.stderr)
        except ImportError:
            self.line, self.t0 = True, time.perf_counter()

    def step(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.line:
            end = "\n" if self.done == self.total else ""
            print(f"\rdepthkv.hf eval {self.label}: {self.done}/{self.total} runs, "
                  f"{time.perf_counter() - self.t0:.1f} s   ", end=end, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _eval_window(model, w: Window, maker: PressMaker, keeps: List[float], bar: _EvalProgress):
    """(full-cache NLL, per keep (metrics, per-layer cache lengths)) of one window."""
    dev = model.device
    ctx = torch.tensor([w.context], device=dev)
    n, tc = len(w.context), len(w.continuation)
    cont = torch.tensor([w.continuation], device=dev)
    pos = torch.arange(n, n + tc, device=dev)[None]
    targets = torch.tensor(w.continuation[1:])

    def logits_under(press):
        cache = DynamicCache()
        with torch.no_grad():
            with press(model) if press is not None else _nullcontext():
                model.model(input_ids=ctx, past_key_values=cache)
            lengths = [int(layer.keys.shape[-2]) for layer in cache.layers]
            out = model(input_ids=cont, past_key_values=cache, position_ids=pos)
        bar.step()
        return out.logits[0].float().cpu(), lengths

    full, _ = logits_under(None)
    ref = _Reference(full, targets)
    rows = []
    for keep in keeps:
        logits, lengths = logits_under(maker.make(keep))
        rows.append((ref.metrics(logits), lengths))
    return ref.nll, rows


def _keeps(keeps) -> List[float]:
    ks = [float(k) for k in (keeps if isinstance(keeps, (list, tuple, np.ndarray)) else [keeps])]
    if not ks or any(not 0.0 < k <= 1.0 for k in ks):
        raise Error(f"evaluate: keeps must be in (0, 1], got {list(ks)}")
    return ks


def evaluate(model, tokenizer=None, data=None, press="snapkv", keeps: Sequence[float] = (0.1, 0.2, 0.3, 0.5), *,
             context: int = DEFAULT_CONTEXT, continuation: int = DEFAULT_CONTINUATION,
             n_windows: Optional[int] = DEFAULT_WINDOWS, skip: int = 0, progress: bool = False) -> dict:
    """KL(full || pruned) of a press over windows (the protocol of :func:`profile` and ``depthkv
    eval``): per window, the context is prefilled under the press (``with press(model)``, the
    cache compressed by it), then the continuation is teacher-forced on the compressed cache at its
    original positions; the full run is the same without the press. Metrics per window over the
    continuation rows: mean KL(full || pruned) (log-softmax in float64), the NLL increase of the
    true next tokens, the fraction of changed argmax; averaged over the windows.

    :param data: texts, token windows or a ``depthkv eval --windows-out`` file (as :func:`profile`)
    :param press: a name (:func:`make_press`: a kvpress press of :data:`KVPRESS_NAMES`), a
        :class:`PressMaker`, a :class:`depthkv.kvpress.DepthKVPress` (re-made per keep), a kvpress
        press (its ``compression_ratio`` set to 1 - keep) or a function keep -> press
    :param keeps: keep ratios in (0, 1]
    :param context, continuation, n_windows, skip: the windows cut from texts
    :param progress: a progress bar on stderr (tqdm when installed)
    :return: {"press", "keeps", "kl", "dnll", "top1" (per keep, the mean over windows), "kl_windows"
        ([keep][window]), "lengths" (per keep, every layer's cache length after the compression of
        the last window), "windows" ([first, end) of ``skip`` numbering), "context", "continuation",
        "nll_full", "seconds"}
    :raises Error: on bad windows or keeps, an unknown press, a DepthKVPress profile of another model
    """
    maker, ks = _as_maker(press), _keeps(keeps)
    windows, meta = _as_windows(tokenizer, data, context, continuation, n_windows, skip)
    n, tc = _check_windows(model, windows)
    impl = model.config._attn_implementation
    bar = _EvalProgress(bool(progress), len(windows) * (1 + len(ks)), maker.label)
    t0 = time.perf_counter()
    was_training = model.training
    model.eval()
    if maker.attn is not None and maker.attn != impl:
        model.set_attn_implementation(maker.attn)
    try:
        per = [_eval_window(model, w, maker, ks, bar) for w in windows]
    finally:
        bar.close()
        model.train(was_training)
        if model.config._attn_implementation != impl:
            model.set_attn_implementation(impl)
    first = int(meta.get("skip", 0))
    m = np.array([[row[0] for row in rows] for _, rows in per])  # [window, keep, metric]
    return {"press": maker.label, "keeps": ks, "kl": m[:, :, 0].mean(0).tolist(), "dnll": m[:, :, 1].mean(0).tolist(),
            "top1": m[:, :, 2].mean(0).tolist(), "kl_windows": m[:, :, 0].T.tolist(),
            "lengths": [row[1] for row in per[-1][1]], "windows": [first, first + len(windows)], "context": n,
            "continuation": tc, "nll_full": float(np.mean([p[0] for p in per])),
            "seconds": time.perf_counter() - t0}


# ---- python -m depthkv.hf profile | eval ---------------------------------------------------------

def _common_args(p) -> None:
    """The model, data and window arguments of both commands."""
    p.add_argument("--model", required=True, help="HF model name or folder (AutoModelForCausalLM.from_pretrained)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="text file (tokenized as one text by the model's tokenizer)")
    src.add_argument("--windows-file", help="token windows: a depthkv eval --windows-out file")
    p.add_argument("--context", type=int, default=DEFAULT_CONTEXT, help="context tokens per window (pruned)")
    p.add_argument("--continuation", type=int, default=DEFAULT_CONTINUATION, help="continuation tokens per window")
    p.add_argument("--windows", type=int, default=DEFAULT_WINDOWS, help="windows")
    p.add_argument("--skip", type=int, default=0, help="windows of --text skipped first")
    p.add_argument("--sinks", type=int, default=depthkv.DEFAULT_PROTECTION[0], help="attention-sink tokens kept")
    p.add_argument("--recent", type=int, default=depthkv.DEFAULT_PROTECTION[1], help="recent tokens kept")
    p.add_argument("--kernel", type=int, default=depthkv.DEFAULT_KERNEL, help="SnapKV's pooling kernel (odd)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device")
    p.add_argument("--dtype", default="auto", help="torch dtype of the weights (auto, float32, bfloat16, float16)")
    p.add_argument("--attn", default="sdpa", help="attention implementation (sdpa or eager)")


def _parser():
    import argparse
    ap = argparse.ArgumentParser(prog="python -m depthkv.hf", description="depthkv for Hugging Face causal LMs")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("profile", help="measure per-layer loss curves and write a profile file (as depthkv profile)")
    _common_args(p)
    p.add_argument("-o", "--output", required=True, help="profile file to write (JSON)")
    p.add_argument("--scorers", default="snapkv", help="token scorers, comma-separated (h2o, snapkv, tova, ...)")
    p.add_argument("--ratios", default=",".join(map(str, DEFAULT_RATIOS)), help="probed keep ratios")
    p.add_argument("--obs-window", type=int, default=depthkv.DEFAULT_OBS_WINDOW, help="SnapKV's observation window")
    p.add_argument("--pooling", default="max", help="SnapKV's pooling: max, avg or none")
    p.add_argument("--output-aware", action="store_true", help="output-aware (CriticalKV) rescaling")
    p.add_argument("--head-curves", action="store_true", help="also measure the per-(layer, KV head) curves")
    p.add_argument("--metric", default="kl", help="the profile's default metric: kl, dnll or top1")
    p.add_argument("--no-reuse", action="store_true", help="recompute the layers below the pruned one")
    p.add_argument("--name", help="model name recorded in the profile (default: --model)")
    e = sub.add_parser("eval", help="KL(full || pruned) of a press over windows, at several keep ratios")
    _common_args(e)
    e.add_argument("--press", default="depthkv", help="depthkv (DepthKVPress: needs --profile) or a kvpress press: "
                   + ", ".join(KVPRESS_NAMES))
    e.add_argument("--profile", help="depthkv profile file (for --press depthkv)")
    e.add_argument("--policy", default="optimal", help="depthkv allocation policy (for --press depthkv)")
    e.add_argument("--scores", default="kvpress:snapkv", help="the scores DepthKVPress ranks by: kvpress:NAME (a "
                   "kvpress press above) or a depthkv scorer (snapkv, h2o, tova, ...)")
    e.add_argument("--keeps", default="0.1,0.2,0.3,0.5", help="keep ratios, comma-separated")
    e.add_argument("--obs-window", type=int, default=None, help="observation window (default: the profile's, or 16)")
    e.add_argument("--no-check-model", action="store_true", help="apply a profile whose model hash differs")
    e.add_argument("--json", action="store_true", help="print the result as JSON")
    return ap


def _load(a):
    """The model, tokenizer (None for --windows-file) and data of the command line."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    dtype = a.dtype if a.dtype == "auto" else getattr(torch, a.dtype)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation=a.attn).to(a.device).eval()
    tokenizer, data = None, a.windows_file
    if a.text:
        tokenizer = AutoTokenizer.from_pretrained(a.model)
        with open(a.text, encoding="utf-8") as f:
            data = f.read()
    return model, tokenizer, data


def _main_profile(a) -> int:
    model, tokenizer, data = _load(a)
    t0 = time.perf_counter()
    prof = profile(model, tokenizer, data, keep_ratios=[float(x) for x in a.ratios.split(",")], scorer=a.scorers,
                   protection=(a.sinks, a.recent), window=a.obs_window, kernel=a.kernel, pooling=a.pooling,
                   output_aware=a.output_aware, head_curves=a.head_curves, context=a.context,
                   continuation=a.continuation, n_windows=a.windows, skip=a.skip, metric=a.metric,
                   reuse=not a.no_reuse, name=a.name or a.model, text_file=a.text or a.windows_file,
                   output=a.output, progress=True)
    print(f"profile written to {a.output} ({time.perf_counter() - t0:.2f} s)")
    for s in prof.scorers:
        print(f"\nscorer {s}: mean {prof.metric} per layer (rows) and keep ratio (columns), +- standard error")
        print("layer" + "".join(f"  {r:15.2f}" for r in prof.keep_ratios))
        mean, se = prof.curves(s), prof.curves(s, stderr=True)
        for layer in range(prof.n_layers):
            print(f"{layer:5d}" + "".join(f"  {m:7.4f}+-{e:6.4f}" for m, e in zip(mean[layer], se[layer])))
    return 0


def eval_table(r: dict) -> str:
    """The text table of an :func:`evaluate` result: per keep, the mean KL, NLL increase, changed
    argmax and the per-layer cache lengths after compression (of the last window)."""
    lines = [f"{r['press']}: windows {r['windows'][0]}..{r['windows'][1] - 1} ({r['context']} + {r['continuation']} "
             f"tokens), full-cache NLL {r['nll_full']:.5f}, {r['seconds']:.1f} s",
             f"{'keep':>6}  {'KL(full||pruned)':>16}  {'dNLL':>9}  {'top1 changed':>12}  cache lengths per layer"]
    for k, kl, dn, t1, ln in zip(r["keeps"], r["kl"], r["dnll"], r["top1"], r["lengths"]):
        lines.append(f"{k:6.2f}  {kl:16.6f}  {dn:9.5f}  {t1:12.4f}  {' '.join(map(str, ln))}")
    return "\n".join(lines)


def _main_eval(a) -> int:
    prof = depthkv.load_profile(a.profile) if a.profile else None
    maker = make_press(a.press, prof, policy=a.policy, scorer_press=a.scores, window=a.obs_window, kernel=a.kernel,
                       protection=(a.sinks, a.recent), check_model=not a.no_check_model)
    model, tokenizer, data = _load(a)
    r = evaluate(model, tokenizer, data, maker, [float(x) for x in a.keeps.split(",")], context=a.context,
                 continuation=a.continuation, n_windows=a.windows, skip=a.skip, progress=True)
    print(json.dumps(r) if a.json else eval_table(r))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m depthkv.hf profile|eval ...``: profile loads the model with transformers, runs
    :func:`profile` with a progress line on stderr, writes the profile and prints its curves; eval
    runs :func:`evaluate` for one press and prints its table (or ``--json``)."""
    a = _parser().parse_args(argv)
    try:
        return _main_profile(a) if a.command == "profile" else _main_eval(a)
    except Error as e:
        print(f"depthkv.hf: error: {e}", file=sys.stderr)
        return 1

if __name__ == "__main__":
    sys.exit(main())
