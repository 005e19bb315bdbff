#!/usr/bin/env python3
"""kvpress and depthkv side by side: the same model, windows and protocol as `depthkv eval`.

For each model (stories260K, aidreams260K from the data folder):
 1. `depthkv eval --windows-out` writes the evaluation windows (the main job's settings: windows
    after the profile's calibration windows, or from `--skip` per model, e.g. the untouched windows
    of docs/results/windows.md: `--skip stories260K=216,aidreams260K=176 --out kvpress_peer_untouched`;
    context + continuation as profiled) as token ids.
 2. The llama2.c checkpoint is converted to a Hugging Face `LlamaForCausalLM` (q/k rows permuted
    from llama2.c's interleaved RoPE pairs to HF's rotate-half order) and checked: greedy text
    from BOS equals `depthkv generate -t 0`'s, and the full-cache NLL of the windows equals the
    one `depthkv eval` reports.
 3. Every kvpress press runs on every window at every keep ratio: the context is prefilled under
    the press, then the continuation is teacher-forced on the compressed cache (positions after
    the full context). Metric: mean over windows and continuation rows of KL(full || pruned), as
    `depthkv eval` defines it (metrics.hpp `compare_logits`).
 4. `depthkv eval --json` runs depthkv's policies on the same windows; depthkv's per-layer budgets
    are also applied inside kvpress with kvpress's own SnapKV scorer (and with AdaKV inside each
    layer).
 5. Head-level rows, when the <model>.best.profile.json (`own`, --best-profile-dir) holds head
    curves (`scorers.snapkv.heads`, from `depthkv profile --head-curves`): depthkv's own
    head-optimal policy (`depthkv eval --policies head-optimal`, per-head and adaptive re-split);
    depthkv's head-optimal budgets [layer][head] (`depthkv allocate --policy head-optimal`)
    applied inside kvpress with kvpress's SnapKV scorer; and kvpress's LUKVPress around
    kvpress's SnapKV with its budget curve built from those budgets (`lukv_curves`). LUKV runs on
    depthkv's curves, so it is not one of "kvpress's own presses" and is left out of the
    "best kvpress press" row.
 6. The table and the plot go to docs/results/kvpress_peer.{md,json,svg} (--out).

Head-wise presses (AdaKV, CriticalAdaKV, LUKV) and per-layer / per-head budgets are applied by
masking: the pruned (head, token) pairs get -inf in the attention of every later query (an additive
mask), which gives exactly the attention of a cache without them. kvpress's own mechanism ("fake
keys" found by a hyperplane search) fails on heads of 8 dimensions, and its physical per-layer
compression needs flash attention, which has no CPU kernel. LUKVPress (like AdaKVPress) only sets
`module.masked_key_indices` in its compress(), so it runs unchanged: its scores, sink/window
protection and per-head counts are its own, and only the application of its pruned indices is the
mask's (its assertion against eager attention holds: it runs under sdpa).

Needs torch, transformers and kvpress (requirements.txt) in a virtual environment outside the
repository, and a built `depthkv` CLI:

    python3 -m venv /tmp/venv-kvpress && /tmp/venv-kvpress/bin/pip install -r benchmarks/kvpress_peer/requirements.txt
    /tmp/venv-kvpress/bin/python benchmarks/kvpress_peer/run.py --depthkv build/release/tools/depthkv
"""

import argparse
import contextlib
import json
import math
import os
import struct
import subprocess
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The main job's settings (scripts/main-job.sh): windows and protection per model.
MODELS = {
    "stories260K": {"windows": 64, "selection": []},
    "aidreams260K": {"windows": 128, "selection": ["--sinks", "2", "--recent", "4", "--obs-window", "4"]},
}


# ---- the model -----------------------------------------------------------------------------------

def read_llama2c(path):
    """The tensors of a llama2.c checkpoint (legacy format: 7 int32 header, float32 weights)."""
    with open(path, "rb") as f:
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("7i", f.read(28))
        data = np.fromfile(f, dtype=np.float32)
    shared = vocab > 0
    vocab = abs(vocab)
    hd = dim // n_heads
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        if off + n > data.size:
            raise ValueError(f"{path}: truncated checkpoint")
        t = data[off:off + n].reshape(shape)
        off += n
        return torch.from_numpy(t.copy())

    w = {"emb": take(vocab, dim), "rms_att": take(n_layers, dim), "wq": take(n_layers, n_heads * hd, dim),
         "wk": take(n_layers, n_kv * hd, dim), "wv": take(n_layers, n_kv * hd, dim),
         "wo": take(n_layers, dim, n_heads * hd), "rms_ffn": take(n_layers, dim), "w1": take(n_layers, hidden, dim),
         "w2": take(n_layers, dim, hidden), "w3": take(n_layers, hidden, dim), "rms_final": take(dim)}
    take(seq_len * hd // 2)  # freq_cis_real
    take(seq_len * hd // 2)  # freq_cis_imag
    w["cls"] = w["emb"] if shared else take(vocab, dim)
    cfg = dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads, n_kv=n_kv, vocab=vocab, seq_len=seq_len,
               shared=shared)
    return cfg, w


def rope_halves(w, n_heads):
    """Rows of a q/k projection from interleaved pairs (2j, 2j+1) to rotate-half pairs (j, j + hd/2)."""
    rows, cols = w.shape
    hd = rows // n_heads
    return w.view(n_heads, hd // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def to_hf(path, attn="sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM
    c, w = read_llama2c(path)
    cfg = LlamaConfig(vocab_size=c["vocab"], hidden_size=c["dim"], intermediate_size=c["hidden"],
                      num_hidden_layers=c["n_layers"], num_attention_heads=c["n_heads"],
                      num_key_value_heads=c["n_kv"], head_dim=c["dim"] // c["n_heads"],
                      max_position_embeddings=c["seq_len"], rms_norm_eps=1e-5, tie_word_embeddings=c["shared"],
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, bos_token_id=1,
                      eos_token_id=2, attn_implementation=attn)
    m = LlamaForCausalLM(cfg).eval()
    sd = {"model.embed_tokens.weight": w["emb"], "model.norm.weight": w["rms_final"], "lm_head.weight": w["cls"]}
    for l in range(c["n_layers"]):
        p = f"model.layers.{l}."
        sd[p + "input_layernorm.weight"] = w["rms_att"][l]
        sd[p + "post_attention_layernorm.weight"] = w["rms_ffn"][l]
        sd[p + "self_attn.q_proj.weight"] = rope_halves(w["wq"][l], c["n_heads"])
        sd[p + "self_attn.k_proj.weight"] = rope_halves(w["wk"][l], c["n_kv"])
        sd[p + "self_attn.v_proj.weight"] = w["wv"][l]
        sd[p + "self_attn.o_proj.weight"] = w["wo"][l]
        sd[p + "mlp.gate_proj.weight"] = w["w1"][l]
        sd[p + "mlp.down_proj.weight"] = w["w2"][l]
        sd[p + "mlp.up_proj.weight"] = w["w3"][l]
    missing, unexpected = m.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (c["shared"] and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    return m


def read_vocab(path, n):
    """llama2.c tokenizer file: max length, then per token a float score, an int length, bytes."""
    pieces = []
    with open(path, "rb") as f:
        f.read(4)
        for _ in range(n):
            f.read(4)
            (ln,) = struct.unpack("i", f.read(4))
            pieces.append(f.read(ln))
    return pieces


def decode(pieces, ids):
    """run.c's decode: a space after BOS is dropped, <0xXX> pieces are raw bytes."""
    out = b""
    prev = 1
    for t in ids:
        p = pieces[t]
        if prev == 1 and p.startswith(b" "):
            p = p[1:]
        if len(p) == 6 and p.startswith(b"<0x") and p.endswith(b">"):
            p = bytes([int(p[3:5], 16)])
        out += p
        prev = t
    return out.decode("utf-8", errors="replace")


# ---- masking: head-wise and per-layer budgets -------------------------------------------------------

def install_mask_patch():
    """Wraps every attention function: a module with `masked_key_indices` (batch, kv_head, slot)
    gets -inf added at those keys for every query of the call (kvpress's fake-key patch is then
    bypassed)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def patch(func):
        def wrapper(module, query, key, value, attention_mask, *args, **kwargs):
            idx = getattr(module, "masked_key_indices", None)
            if idx is None or query.shape[2] == key.shape[2]:
                return func(module, query, key, value, attention_mask, *args, **kwargs)
            bsz, nh, q_len, _ = query.shape
            nkv, k_len = key.shape[1], key.shape[2]
            add = torch.zeros(bsz, nkv, q_len, k_len, dtype=query.dtype)
            b, h, s = idx
            add[b, h, :, s] = float("-inf")
            add = add.repeat_interleave(nh // nkv, dim=1)
            if attention_mask is None:  # causal, the queries are the last q_len positions
                i = torch.arange(q_len)[:, None]
                j = torch.arange(k_len)[None, :]
                base = torch.where(j <= k_len - q_len + i, 0.0, float("-inf")).to(query.dtype)
            elif attention_mask.dtype == torch.bool:
                base = torch.where(attention_mask, 0.0, float("-inf")).to(query.dtype)
            else:
                base = attention_mask
            base = base[..., :k_len]
            kwargs.pop("is_causal", None)
            module.masked_key_indices = None
            try:
                return func(module, query, key, value, base + add, *args, **kwargs)
            finally:
                module.masked_key_indices = idx
        return wrapper

    for name, func in list(ALL_ATTENTION_FUNCTIONS.items()):
        ALL_ATTENTION_FUNCTIONS[name] = patch(func)


def make_budget_press(scorer, budgets, adaptive, alpha=0.2):
    """A press keeping `budgets[layer]` tokens per KV head of each layer (depthkv's per-layer
    budgets), chosen by `scorer`'s scores: top-k per head, or with `adaptive` top (k * heads)
    across the layer's heads with AdaKV's floor of alpha * k per head. `budgets[layer]` may also
    be a list, one budget per KV head (depthkv's head-optimal budgets): top-k_h per head h (not
    with `adaptive`). Applied by masking."""
    from kvpress.presses.base_press import BasePress

    class BudgetPress(BasePress):
        def post_init_from_model(self, model):
            scorer.post_init_from_model(model)

        def compress(self, module, hidden_states, keys, values, attentions, kwargs):
            scores = scorer.score(module, hidden_states, keys, values, attentions, kwargs).clone()
            bsz, nkv, k_len = scores.shape
            if isinstance(budgets[module.layer_idx], (list, tuple)):
                if adaptive:
                    raise ValueError("per-head budgets with adaptive heads are not supported")
                kh = torch.tensor([min(k_len, int(x)) for x in budgets[module.layer_idx]])
                if kh.numel() != nkv:
                    raise ValueError(f"{kh.numel()} head budgets for {nkv} KV heads")
                if bool((kh >= k_len).all()):
                    module.masked_key_indices = None
                    return keys, values
                order = torch.argsort(scores, dim=-1, descending=True, stable=True)
                rank = torch.arange(k_len).view(1, 1, k_len).expand_as(order)
                batch, heads, r = torch.where(rank >= kh.view(1, nkv, 1))
                module.masked_key_indices = (batch, heads, order[batch, heads, r])
                return keys, values
            k = min(k_len, int(budgets[module.layer_idx]))
            if k >= k_len:
                module.masked_key_indices = None
                return keys, values
            big = torch.finfo(scores.dtype).max
            if adaptive:
                n_safe = max(1, int(k * alpha)) if k > 0 else 0
                if n_safe:
                    scores.scatter_(-1, torch.topk(scores, n_safe, dim=-1).indices, big)
                n_pruned = nkv * (k_len - k)
                flat = torch.topk(-scores.reshape(bsz, -1), n_pruned, dim=1).indices.flatten()
                heads, slots = flat // k_len, flat % k_len
                batch = torch.arange(bsz).repeat_interleave(n_pruned)
            else:
                drop = torch.topk(-scores, k_len - k, dim=-1).indices  # [bsz, nkv, k_len - k]
                batch = torch.arange(bsz)[:, None, None].expand_as(drop).flatten()
                heads = torch.arange(nkv)[None, :, None].expand_as(drop).flatten()
                slots = drop.flatten()
            module.masked_key_indices = (batch, heads, slots)
            return keys, values

    return BudgetPress()


# ---- head-level budgets: depthkv allocate --policy head-optimal, LUKV's curves ------------------------

LUKV_LABEL = "kvpress LUKV+SnapKV (depthkv head curves)"
# rows labelled "kvpress ..." that run on depthkv's measurements: not kvpress's own presses, so
# never the "best kvpress press"
NOT_KVPRESS_OWN = {LUKV_LABEL}


def has_head_curves(profile_path):
    try:
        return bool(json.load(open(profile_path))["scorers"]["snapkv"].get("heads"))
    except (OSError, KeyError, ValueError):
        return False


def selection_flags(sel):
    """depthkv's selection flags for a profile's recorded selection (calibration.selection)."""
    f = ["--sinks", str(sel["sinks"]), "--recent", str(sel["recent"]), "--obs-window", str(sel["obs_window"]),
         "--kernel", str(sel["kernel"]), "--pooling", sel["pooling"]]
    if sel.get("output_aware"):
        f.append("--output-aware")
    if "head_alloc" in sel:
        f += ["--head-alloc", sel["head_alloc"], "--head-alpha", str(sel["head_alpha"])]
    return f


class HeadBudgets:
    """depthkv's head-optimal budgets [layer][head] (tokens each KV head keeps of `length`) per
    keep ratio, from `depthkv allocate --policy head-optimal --json` (cached; None where the
    request is infeasible: a keep below the sinks + recent every head protects)."""

    def __init__(self, dk, profile, length, sel):
        self.cmd = [dk, "allocate", "--profile", profile, "--policy", "head-optimal", "--scorer", "snapkv",
                    "--length", str(length)] + selection_flags(sel)
        self.length = length
        self.cache = {}

    def get(self, keep):
        key = f"{keep:.2f}"
        if key not in self.cache:
            r = subprocess.run(self.cmd + ["--keep", key, "--json"], capture_output=True, text=True)
            if r.returncode != 0:
                if "infeasible" not in r.stderr:
                    raise RuntimeError(f"depthkv allocate failed: {r.stderr}")
                self.cache[key] = None
            else:
                self.cache[key] = json.loads(r.stdout)["head_budgets"]
        return self.cache[key]


def lukv_curves(hb, n_layers, n_kv):
    """LUKVPress's `_budget_curves` [99, layers, KV heads] from depthkv's head-optimal budgets.

    LUKVPress.compress at compression ratio c reads row round(100 c) - 1 (so row i is c = (i+1)/100,
    keep 1 - c) and takes each value as the head's *prune* ratio: head h keeps (1 - v[l][h]) * seq_len
    tokens (rounded to the layer total, the remainder to the largest fractions). So v[l][h] =
    1 - k[l][h] / length with k = depthkv's head budgets at keep 1 - c for the profile's context
    length (the prefill's seq_len). Keeps depthkv finds infeasible (below the per-head protection)
    get the uniform row v = c."""
    curves = np.empty((99, n_layers, n_kv), dtype=np.float64)
    n_fallback = 0
    for i in range(99):
        c = (i + 1) / 100
        k = hb.get(1.0 - c)
        if k is None:
            curves[i] = c
            n_fallback += 1
        else:
            k = np.asarray(k, dtype=np.float64)
            if k.shape != (n_layers, n_kv):
                raise ValueError(f"head budgets of shape {k.shape}, expected {(n_layers, n_kv)}")
            curves[i] = 1.0 - k / hb.length
    return curves, n_fallback


def make_lukv_press(obs_window, sinks, recent, curves, hb, log):
    """kvpress's LUKVPress(SnapKVPress) with `curves` set (no download), unchanged but for a check
    after its compress(): the kept tokens per KV head (seq_len minus its masked indices) equal
    depthkv's head budgets at the press's keep ratio."""
    import kvpress as kp

    class CheckedLUKV(kp.LUKVPress):
        def compress(self, module, hidden_states, keys, values, attentions, kwargs):
            out = super().compress(module, hidden_states, keys, values, attentions, kwargs)
            bsz, nkv, seq_len, _ = keys.shape
            idx = getattr(module, "masked_key_indices", None)
            pruned = torch.zeros(nkv, dtype=torch.long) if idx is None else torch.bincount(idx[1], minlength=nkv)
            kept = (seq_len - pruned // bsz).tolist()
            want = hb.get(1.0 - round(self.compression_ratio * 100) / 100) if seq_len == hb.length else None
            if want is not None and kept != [min(seq_len, int(x)) for x in want[module.layer_idx]]:
                raise AssertionError(f"LUKV layer {module.layer_idx} keeps {kept} per KV head, depthkv's head "
                                     f"budgets are {want[module.layer_idx]}")
            log[module.layer_idx] = (kept, want is not None)
            return out

    p = CheckedLUKV(press=kp.SnapKVPress(window_size=obs_window, kernel_size=7), sink=sinks, window=recent)
    p._budget_curves = curves
    return p


# ---- the protocol ----------------------------------------------------------------------------------

def continuation_logits(model, ctx, cont, press):
    from transformers import DynamicCache
    cache = DynamicCache()
    for layer in model.model.layers:
        layer.self_attn.masked_key_indices = None
    with torch.no_grad():
        with press(model) if press is not None else contextlib.nullcontext():
            model.model(input_ids=torch.tensor([ctx]), past_key_values=cache)
        pos = torch.arange(len(ctx), len(ctx) + len(cont))[None]
        out = model(input_ids=torch.tensor([cont]), past_key_values=cache, position_ids=pos)
    return torch.log_softmax(out.logits[0].double(), dim=-1)


def greedy(model, steps):
    """run.c's greedy loop from BOS: `steps` positions, stopping early at a BOS."""
    from transformers import DynamicCache
    cache = DynamicCache()
    ids = [1]
    with torch.no_grad():
        for pos in range(steps):
            out = model(input_ids=torch.tensor([[ids[-1]]]), past_key_values=cache, position_ids=torch.tensor([[pos]]))
            nxt = int(out.logits[0, -1].argmax())
            if nxt == 1:
                break
            ids.append(nxt)
    return ids


def kl_rows(full, pruned):
    return (full.exp() * (full - pruned)).sum(-1)  # KL(full || pruned) per row


def nll(logp, cont):
    t = torch.tensor(cont[1:])
    return float(-logp[:-1].gather(1, t[:, None]).mean())


def run_depthkv(dk, args_common, extra):
    r = subprocess.run([dk, "eval"] + args_common + extra + ["--json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"depthkv eval failed: {r.stderr}")
    return json.loads(r.stdout)


def kvpress_presses(obs_window):
    import kvpress as kp
    snap = lambda: kp.SnapKVPress(window_size=obs_window, kernel_size=7)
    p = {
        "SnapKV": (snap(), "sdpa"),
        "AdaKV+SnapKV": (kp.AdaKVPress(snap()), "sdpa"),
        "CriticalKV+SnapKV": (kp.CriticalKVPress(snap()), "sdpa"),
        "CriticalAdaKV+SnapKV": (kp.CriticalAdaKVPress(snap()), "sdpa"),
        "PyramidKV": (kp.PyramidKVPress(window_size=obs_window, kernel_size=7), "sdpa"),
        "TOVA": (kp.TOVAPress(), "sdpa"),
        "StreamingLLM": (kp.StreamingLLMPress(n_sink=4), "sdpa"),
        "ExpectedAttention": (kp.ExpectedAttentionPress(), "sdpa"),
        "AdaKV+ExpectedAttention": (kp.AdaKVPress(kp.ExpectedAttentionPress(use_vnorm=True)), "sdpa"),
        "KeyDiff": (kp.KeyDiffPress(), "sdpa"),
        "Knorm": (kp.KnormPress(), "sdpa"),
        "ObservedAttention (H2O)": (kp.ObservedAttentionPress(), "eager"),
    }
    return p


def set_ratio(press, keep):
    press.compression_ratio = 1.0 - keep


def depthkv_common(name, a, skip=None, windows=None):
    """(model folder, checkpoint, main profile path, its selection, `depthkv eval` arguments) of `name`
    (`skip`, `windows`: instead of --skip and --windows)."""
    mdir = os.path.join(a.data, "models", name)
    bin_path = os.path.join(mdir, name + ".bin")
    text = os.path.join(a.data, "text", "tinystories_valid.txt")
    profile = os.path.join(ROOT, "docs", "results", name + ".profile.json")
    sel = json.load(open(profile))["calibration"]["selection"]
    m = MODELS[name]
    windows = windows or a.windows or m["windows"]
    skip = skip if skip is not None else a.skip.get(name)
    common = ["--model", bin_path, "--text", text, "--profile", profile, "--windows", str(windows),
              "--threads", str(a.threads)] + (["--skip", str(skip)] if skip is not None else []) + m["selection"]
    return mdir, bin_path, profile, sel, common


def own_common(name, a, common, profile):
    """`common` with the preset's profile (<model>.best.profile.json) and its own protection, or None."""
    own = os.path.join(a.best_profile_dir, name + ".best.profile.json")
    if not os.path.exists(own):
        return None
    osel = json.load(open(own))["calibration"]["selection"]
    return [x if x != profile else own for x in common[:len(common) - len(MODELS[name]["selection"])]] + [
        "--sinks", str(osel["sinks"]), "--recent", str(osel["recent"]), "--obs-window", str(osel["obs_window"])]


def preset_rows(a, res, common_own):
    """`depthkv eval --preset best` on `common_own`'s windows into res["kl"] and res["preset_scorer"]."""
    rows = run_depthkv(a.depthkv, common_own, ["--keeps", ",".join(map(str, a.keep)), "--preset", "best"])
    res["kl"]["depthkv --preset best"] = {str(r["keep"]): r["kl"] for r in rows}  # in place: the row order stays
    res["preset_scorer"] = {str(r["keep"]): r["scorer"] for r in rows}


def refresh_preset(rows, a):
    """Reruns only the `--preset best` rows of a results JSON (kvpress's rows and depthkv's others kept)."""
    for res in rows:
        name = res["model"]
        first, end = res["windows"]  # the windows the JSON was measured on
        _, _, profile, _, common = depthkv_common(name, a, skip=first, windows=end - first)
        common_own = own_common(name, a, common, profile)
        if common_own is None or "depthkv --preset best" not in res["kl"]:
            continue
        before = dict(res["kl"]["depthkv --preset best"])
        preset_rows(a, res, common_own)
        print(f"== {name}: --preset best {before} -> {res['kl']['depthkv --preset best']}", flush=True)


def evaluate_model(name, a, out_rows):
    import kvpress as kp
    mdir, bin_path, profile, sel, common = depthkv_common(name, a)
    m = MODELS[name]
    wpath = os.path.join(a.work, name + ".windows.json")
    r = subprocess.run([a.depthkv, "eval"] + common + ["--windows-out", wpath], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    W = json.load(open(wpath))
    print(f"== {name}: {len(W['windows'])} windows ({W['skip']}..{W['skip'] + len(W['windows']) - 1}) of "
          f"{W['context']}+{W['continuation']} tokens of {W['source']}", flush=True)

    models = {"sdpa": to_hf(bin_path, "sdpa"), "eager": to_hf(bin_path, "eager")}
    # checks: greedy text from BOS, full-cache NLL
    cfg = models["sdpa"].config
    steps = min(64, cfg.max_position_embeddings)
    g = subprocess.run([a.depthkv, "generate", "-m", bin_path, "-t", "0", "-n", str(steps)], capture_output=True,
                       text=True)
    ids = greedy(models["sdpa"], steps)
    pieces = read_vocab(os.path.join(mdir, "tok512.bin") if os.path.exists(os.path.join(mdir, "tok512.bin"))
                        else [f for f in (os.path.join(mdir, x) for x in os.listdir(mdir)) if f.endswith(".bin") and
                              "tok" in os.path.basename(f)][0], cfg.vocab_size)
    hf_text = decode(pieces, ids[1:])
    greedy_equal = hf_text.strip() == g.stdout.strip()
    print(f"greedy from BOS ({steps} positions): {'equal' if greedy_equal else 'DIFFERENT'} to depthkv generate",
          flush=True)
    if not greedy_equal:
        print(f"  hf:      {hf_text!r}\n  depthkv: {g.stdout.strip()!r}")

    full = []
    for w in W["windows"]:
        full.append(continuation_logits(models["sdpa"], w["context"], w["continuation"], None))
    nll_hf = float(np.mean([nll(f, w["continuation"]) for f, w in zip(full, W["windows"])]))

    dk_rows = run_depthkv(a.depthkv, common, ["--keeps", ",".join(map(str, a.keep)), "--policies",
                                               "uniform,optimal", "--scorers", "snapkv,h2o"] + a.depthkv_extra)
    nll_dk = dk_rows[0]["nll_full"]
    print(f"full-cache NLL: HF {nll_hf:.5f}, depthkv {nll_dk:.5f}", flush=True)
    res = {"model": name, "windows": [W["skip"], W["skip"] + len(W["windows"])], "context": W["context"],
           "continuation": W["continuation"], "greedy_equal": greedy_equal, "nll_full_hf": nll_hf,
           "nll_full_depthkv": nll_dk, "kl": {}}

    def run(label, press, attn, keep):
        t0 = time.time()
        kls = []
        for f, w in zip(full, W["windows"]):
            p = continuation_logits(models[attn], w["context"], w["continuation"], press)
            kls.append(float(kl_rows(f, p).mean()))
        res["kl"].setdefault(label, {})[str(keep)] = float(np.mean(kls))
        print(f"  {label:<34} keep {keep:.2f}: KL {np.mean(kls):.5f}  ({time.time() - t0:.1f} s)", flush=True)

    for label, (press, attn) in kvpress_presses(sel["obs_window"]).items():
        if a.presses and label not in a.presses:
            continue
        for keep in a.keep:
            set_ratio(press, keep)
            try:
                run("kvpress " + label, press, attn, keep)
            except Exception as e:  # a press that cannot run on this model is reported, not fatal
                print(f"  kvpress {label}: failed at keep {keep}: {type(e).__name__}: {e}", flush=True)
                res["kl"].setdefault("kvpress " + label, {})[str(keep)] = None
                break
    for row in dk_rows:
        res["kl"].setdefault(f"depthkv {row['scorer']} {row['policy']}", {})[str(row["keep"])] = row["kl"]
    # `--preset best` (output-aware SnapKV or H2O, per keep the one of the lower predicted loss;
    # head-optimal budgets from head curves) and both scorers with uniform and per-layer optimal
    # budgets, with the curves measured under that setting (the main job's
    # <model>.best.profile.json: the main profile's calibration windows and selection) when present
    own = os.path.join(a.best_profile_dir, name + ".best.profile.json")
    if os.path.exists(own) and not a.plain_only:
        # the preset's profile's own protection (it may differ from the main profile's)
        common_own = own_common(name, a, common, profile)
        keeps = ["--keeps", ",".join(map(str, a.keep))]
        preset_rows(a, res, common_own)
        scorers = ",".join(s for s in ("snapkv", "h2o") if s in json.load(open(own))["scorers"])
        # the scorers as the preset's profile measured them (its lookahead, if any)
        look = int(json.load(open(own))["calibration"]["selection"].get("lookahead", 0))
        look_flags = ["--lookahead", str(look)] if look else []
        look_label = f" + lookahead {look}" if look else ""
        for row in run_depthkv(a.depthkv, common_own, keeps + ["--policies", "uniform,optimal", "--scorers", scorers,
                                                               "--output-aware"] + look_flags):
            label = f"depthkv {row['scorer']} + output-aware{look_label} {row['policy']}"
            res["kl"].setdefault(label, {})[str(row["keep"])] = row["kl"]
    heads = os.path.exists(own) and not a.plain_only and not a.no_heads and has_head_curves(own)
    if os.path.exists(own) and not a.plain_only and not heads:
        print(f"  {own}: no head curves (scorers.snapkv.heads): no head-level rows", flush=True)
    if heads:
        # depthkv's head-optimal budgets (head curves of `own`; per head exactly, that is the
        # preset's row) re-split across each layer's heads by the scores (adaptive)
        head_flags = ["--policies", "head-optimal", "--scorers", "snapkv", "--output-aware", "--head-alloc", "adaptive"]
        for row in run_depthkv(a.depthkv, common_own, keeps + head_flags + look_flags):
            res["kl"].setdefault(f"depthkv snapkv + output-aware{look_label} head-optimal + adaptive heads",
                                 {})[str(row["keep"])] = row["kl"]
        own_prof = json.load(open(own))
        own_sel = own_prof["calibration"]["selection"]
        n_kv = int(own_prof["scorers"]["snapkv"]["heads"]["n_kv_heads"])
        hb = HeadBudgets(a.depthkv, own, W["context"], own_sel)
        # depthkv's head-optimal budgets inside kvpress with kvpress's SnapKV scorer
        for keep in a.keep:
            k = hb.get(keep)
            if k is None:
                print(f"  depthkv head-optimal: infeasible at keep {keep}", flush=True)
                continue
            scorer = kp.SnapKVPress(window_size=own_sel["obs_window"], kernel_size=7)
            run("depthkv head-optimal budgets + kvpress SnapKV", make_budget_press(scorer, k, False), "sdpa", keep)
        # kvpress's LUKV around kvpress's SnapKV, its budget curve from depthkv's head-optimal budgets
        t0 = time.time()
        curves, n_fallback = lukv_curves(hb, cfg.num_hidden_layers, n_kv)
        print(f"  LUKV curve [99, {cfg.num_hidden_layers}, {n_kv}] from depthkv allocate --policy head-optimal "
              f"({n_fallback} infeasible keeps: uniform rows; {time.time() - t0:.1f} s)", flush=True)
        res["lukv_curve_fallback_rows"] = n_fallback
        log = {}
        press = make_lukv_press(own_sel["obs_window"], own_sel["sinks"], own_sel["recent"], curves, hb, log)
        for keep in a.keep:
            set_ratio(press, keep)
            log.clear()
            try:
                run(LUKV_LABEL, press, "sdpa", keep)
            except Exception as e:
                print(f"  {LUKV_LABEL}: failed at keep {keep}: {type(e).__name__}: {e}", flush=True)
                res["kl"].setdefault(LUKV_LABEL, {})[str(keep)] = None
                break
            checked = all(c for _, c in log.values())
            print(f"    LUKV kept per KV head (last window): {[log[l][0] for l in sorted(log)]}"
                  f"{' = depthkv head budgets (checked every window and layer)' if checked else ''}", flush=True)
    # depthkv's budgets with kvpress's SnapKV scorer (per head, and AdaKV inside each layer)
    for row in dk_rows:
        if row["scorer"] != "snapkv" or row["policy"] not in ("optimal", "uniform"):
            continue
        for adaptive in (False, True):
            scorer = kp.SnapKVPress(window_size=sel["obs_window"], kernel_size=7)
            label = f"depthkv {row['policy']} budgets + kvpress SnapKV" + (" + AdaKV" if adaptive else "")
            run(label, make_budget_press(scorer, row["budgets"], adaptive), "sdpa", row["keep"])
    out_rows.append(res)


def best_kvpress(res, keep):
    best = None
    for label, d in res["kl"].items():
        v = d.get(str(keep))
        if label in NOT_KVPRESS_OWN:  # runs on depthkv's curves: not one of kvpress's own presses
            continue
        if label.startswith("kvpress ") and v is not None and (best is None or v < best[1]):
            best = (label[len("kvpress "):], v)
    return best


def write_results(rows, a):
    md = ["# kvpress side by side with depthkv", "",
          "Written by `benchmarks/kvpress_peer/run.py` (kvpress " + kvpress_version() + ", torch " + torch.__version__ +
          ", CPU, float32). Mean KL(full || pruned) over the continuation of each evaluation window "
          "(the windows named under each model: by default those after the profile's calibration windows, as "
          "`depthkv eval` takes them, or those `--skip` starts at; context and continuation as profiled; which "
          "window set is which: docs/results/windows.md). " + (f"kvpress presses run: {', '.join(a.presses)} (a subset). "
          if a.presses else "") + "kvpress presses run on the model converted to Hugging Face Llama; "
          "head-wise presses and per-layer budgets are applied by an additive attention mask (see the script). "
          "\"Best kvpress press\" is the best of kvpress's own presses: "
          "\"kvpress LUKV+SnapKV (depthkv head curves)\" (kvpress's LUKVPress with its budget curve built from "
          "depthkv's head-optimal budgets) is left out of it, as it runs on depthkv's measurements.", ""]
    for res in rows:
        keeps = a.keep
        md += [f"## {res['model']}", "",
               f"Windows {res['windows'][0]}..{res['windows'][1] - 1}, context {res['context']} + continuation "
               f"{res['continuation']}. Checks: greedy text from BOS {'equal to' if res['greedy_equal'] else 'DIFFERENT from'} "
               f"`depthkv generate`; full-cache NLL {res['nll_full_hf']:.5f} (HF) vs {res['nll_full_depthkv']:.5f} (depthkv).", "",
               "| method | " + " | ".join(f"keep {k}" for k in keeps) + " |",
               "|---|" + "---|" * len(keeps)]
        for label, d in res["kl"].items():
            cells = []
            for k in keeps:
                v = d.get(str(k))
                cells.append("failed" if v is None and str(k) in d else ("" if v is None else f"{v:.5f}"))
            md.append(f"| {label} | " + " | ".join(cells) + " |")
        best = [best_kvpress(res, k) for k in keeps]
        if "preset_scorer" in res:
            md.append("| (the scorer `--preset best` chose) | " + " | ".join(
                res["preset_scorer"].get(str(k), "") for k in keeps) + " |")
        md.append("| best kvpress press (kvpress's own) | " + " | ".join(f"{b[1]:.5f} ({b[0]})" if b else "" for b in best) + " |")
        for label in [l for l in res["kl"] if l.startswith("depthkv ") or l in NOT_KVPRESS_OWN]:
            d = res["kl"][label]
            md.append(f"| ratio {label} / best kvpress | " + " | ".join(
                f"{d[str(k)] / b[1]:.2f}" if b and d.get(str(k)) is not None else "" for k, b in zip(keeps, best)) + " |")
        md.append("")
    out = os.path.join(ROOT, "docs", "results", a.out)
    open(out + ".md", "w").write("\n".join(md) + "\n")
    json.dump(rows, open(out + ".json", "w"), indent=1)
    plot(rows, a, out)
    print(f"wrote {out}.md, {out}.json")


def kvpress_version():
    try:
        from importlib.metadata import version
        return version("kvpress")
    except Exception:
        return "?"


def plot_series(res, keeps):
    """The plot's panels for one model, at most 8 series each (the rest are in the table):
    kvpress's own presses, the 6 of the lowest geometric-mean KL over the keeps, beside `--preset
    best`; and depthkv's rows: the preset, its scorer (the one it chose most often) with uniform and
    optimal budgets, plain SnapKV uniform and optimal, depthkv's head-optimal budgets inside kvpress,
    LUKV on depthkv's curves, and the best kvpress press at each keep."""
    kl = res["kl"]

    def full(label):
        d = kl.get(label, {})
        return all(d.get(str(k)) is not None and d[str(k)] > 0 for k in keeps)

    def gmean(label):
        return math.exp(sum(math.log(kl[label][str(k)]) for k in keeps) / len(keeps))

    preset = "depthkv --preset best"
    own = [l for l in kl if l.startswith("kvpress ") and l not in NOT_KVPRESS_OWN and full(l)]
    own.sort(key=gmean)
    p1 = [(l, "kvpress") for l in own[:6]]
    if full(preset):
        p1.append((preset, "preset"))
    best = [best_kvpress(res, k) for k in keeps]
    envelope = {str(k): b[1] for k, b in zip(keeps, best) if b}
    chosen = list(res.get("preset_scorer", {}).values())
    sc = max(set(chosen), key=chosen.count) if chosen else "snapkv"
    p2 = []
    if full(preset):
        p2.append((preset, "preset"))
    p2 += [(l, "depthkv") for l in kl if l.startswith(f"depthkv {sc} + output-aware") and
           (l.endswith(" uniform") or l.endswith(" optimal")) and "head-optimal" not in l and full(l)]
    p2 += [(l, "depthkv") for l in ("depthkv snapkv uniform", "depthkv snapkv optimal") if full(l)]
    p2 += [(l, "hybrid") for l in ("depthkv head-optimal budgets + kvpress SnapKV", LUKV_LABEL) if full(l)]
    p2 = p2[:7]
    panels = [(f"{res['model']}: kvpress presses (the best 6 of the {len(own)} with every keep)", p1, None),
              (f"{res['model']}: depthkv", p2, envelope if len(envelope) == len(keeps) else None)]
    return panels


def plot(rows, a, out):
    """KL against keep, log scale (gnuplot): per model two panels of at most 8 series, legends
    below the plot area, text without gnuplot's enhanced markup."""
    if subprocess.run(["sh", "-c", "command -v gnuplot"], capture_output=True).returncode != 0:
        print("gnuplot not found: no plot")
        return
    name = os.path.basename(out)  # the .gp runs in its own folder
    styles = {"preset": "lp lw 3 pt 7 ps 1.2 lc rgb 'black'", "depthkv": "lp lw 2 pt 7",
              "hybrid": "lp lw 2 dt 3 pt 5", "kvpress": "lp lw 1.5 dt 2", "envelope": "lp lw 2 dt 2 pt 4 lc rgb 'red'"}
    gp = [f"set terminal svg size 1400,{660 * len(rows)} dynamic noenhanced font 'sans,11' background rgb 'white'",
          f"set output '{name}.svg'",
          f"set multiplot layout {len(rows)},2 title 'Mean KL(full || pruned) against keep ratio, log scale "
          "(every row: docs/results/" + name + ".md)'",
          "set logscale y", "set format y '%g'", "set xlabel 'keep ratio'", "set ylabel 'mean KL(full || pruned)'",
          "set key below Left reverse vertical maxcols 1 font ',9' spacing 1.1 height 1.5", "set grid", "set xtics (" +
          ", ".join(f"'{k:g}' {k}" for k in a.keep) + ")", "set xrange [" + f"{min(a.keep) - 0.02}:{max(a.keep) + 0.02}]",
          "set lmargin 10"]
    dat = out + ".dat"
    idx = 0
    plots = []
    with open(dat, "w") as f:
        for res in rows:
            for title, series, envelope in plot_series(res, a.keep):
                cmds = []
                for label, kind in series + ([("best kvpress press (per keep)", "envelope")] if envelope else []):
                    d = envelope if kind == "envelope" else res["kl"][label]
                    f.write(f"# {res['model']} | {label}\n")
                    for k in a.keep:
                        f.write(f"{k} {d[str(k)]}\n")
                    f.write("\n\n")
                    style = styles[kind] + (f" pt {4 + 2 * len(cmds)}" if kind == "kvpress" else "")
                    cmds.append(f"'{name}.dat' index {idx} with {style} title '{label.replace(chr(39), '')}'")
                    idx += 1
                assert len(cmds) <= 8, f"{title}: {len(cmds)} series"
                plots.append((title, cmds))
    for title, cmds in plots:
        gp.append(f"set title '{title}'")
        gp.append("plot " + ", ".join(cmds))
    gp.append("unset multiplot")
    open(out + ".gp", "w").write("\n".join(gp) + "\n")
    subprocess.run(["gnuplot", name + ".gp"], check=True, cwd=os.path.dirname(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--depthkv", default=os.path.join(ROOT, "build", "release", "tools", "depthkv"))
    ap.add_argument("--data", default=os.environ.get("DEPTHKV_DATA_DIR", os.path.join(ROOT, "..", "shared")))
    ap.add_argument("--models", default="stories260K,aidreams260K")
    ap.add_argument("--keep", default="0.1,0.2,0.3,0.5")
    ap.add_argument("--windows", type=int, default=0, help="evaluation windows (default: the main job's)")
    ap.add_argument("--skip", default="",
                    help="windows skipped before the first evaluation window, per model (NAME=N,...; default: the "
                         "first window after the profile's calibration windows, as depthkv eval takes them)")
    ap.add_argument("--presses", default="", help="kvpress presses to run (default: all), comma-separated labels")
    ap.add_argument("--depthkv-extra", default="", help="extra flags for depthkv eval (space-separated)")
    ap.add_argument("--threads", type=int, default=0, help="depthkv's threads (0: OpenMP default)")
    ap.add_argument("--plain-only", action="store_true", help="only depthkv's plain scorers (no output-aware rows)")
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch's threads (1: fastest for this model size; more threads only add overhead)")
    ap.add_argument("--work", default="/tmp/kvpress_peer")
    ap.add_argument("--out", default="kvpress_peer",
                    help="results name under docs/results/ (an absolute path: written there instead)")
    ap.add_argument("--best-profile-dir", default=os.path.join(ROOT, "docs", "results"),
                    help="folder of the <model>.best.profile.json files (the `own` profiles, head curves included)")
    ap.add_argument("--no-heads", action="store_true", help="no head-level rows (head-optimal, LUKV)")
    ap.add_argument("--from-json", default="", help="only rewrite the table and plot from this results JSON")
    ap.add_argument("--refresh-preset", default="",
                    help="rerun only the `--preset best` rows of this results JSON (no torch needed), then "
                         "rewrite it, its table and its plot (--out)")
    a = ap.parse_args()
    a.keep = [float(k) for k in a.keep.split(",")]
    a.presses = [p for p in a.presses.split(",") if p]
    a.depthkv_extra = a.depthkv_extra.split()
    a.skip = {n: int(v) for n, v in (x.split("=") for x in a.skip.split(",") if x)}
    if a.from_json or a.refresh_preset:
        rows = json.load(open(a.from_json or a.refresh_preset))
        if a.refresh_preset:
            refresh_preset(rows, a)
        write_results(rows, a)
        return 0
    os.makedirs(a.work, exist_ok=True)
    torch.set_num_threads(a.torch_threads)
    import kvpress  # noqa: F401  (patches the attention functions; ours goes around it)
    install_mask_patch()
    rows = []
    for name in a.models.split(","):
        evaluate_model(name, a, rows)
    write_results(rows, a)


if __name__ == "__main__":
    sys.exit(main())
