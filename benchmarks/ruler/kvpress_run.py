"""The RULER-style suite on kvpress's presses (transformers), beside run.py's rows of depthkv's engine.

The samples are run.py's (benchmarks/ruler/tasks.py, sized in the model's own tokens by
``depthkv.Engine(model).tokenize``) and so are the token ids: the context is
``eng.tokenize(context)`` (BOS first), the question ``eng.tokenize(question, bos=False)``.
transformers' tokenizer is never used (Gemma 3's GGUF tokenizer in transformers is wrong), and the
outputs are detokenized by depthkv. The model is the same file, in transformers (float32, sdpa):
a GGUF file through ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)`` (transformers
dequantizes it; needs the ``gguf`` package), a llama2.c checkpoint through the kvpress_peer
harness's conversion (``to_hf``).

Protocols (as run.py's):
  outside  (kvpress's query-agnostic one) the context is prefilled under the press
           (``with press(model): model.model(ctx, past_key_values=cache)``), then the question is
           fed on the compressed cache (no press) at the positions after the full context, then
           greedy decoding;
  inside   the press is applied to the prefill of context + question, then greedy decoding.
Greedy decoding of ``run.MAX_NEW[task]`` tokens, stopping before a token that ends a generation as
depthkv's engine does: BOS, and for a byte-level BPE vocabulary (GGUF ``tokenizer.ggml.model`` =
gpt2) EOS and EOT (``tokenizer.ggml.eot_token_id``, else the first of depthkv's end-of-turn names
found in the vocabulary). Scored by ``string_match_all`` x 100, as run.py.

Presses (kvpress 0.5.5; its defaults, but for the windows, set as run.py's SELECTION: observation
window 16, kernel 7, 4 sinks):
  snapkv              SnapKVPress(window_size=16, kernel_size=7);
  tova                TOVAPress();
  keydiff             KeyDiffPress();
  expected-attention  ExpectedAttentionPress() (n_sink=4, its default; n_future_positions=512 is
                      no window);
  criticalkv          CriticalKVPress(SnapKVPress(16, 7));
  adakv               AdaKVPress(SnapKVPress(16, 7)): head-wise, masked;
  pyramidkv           PyramidKVPress(window_size=16, kernel_size=7);
  streamingllm        StreamingLLMPress(n_sink=4);
  depthkv             depthkv.kvpress.DepthKVPress(--profile, keep, policy "optimal",
                      protection (4, 16)): depthkv's per-layer budgets, kvpress's SnapKV scores with
                      the profile's window and kernel (skipped without --profile);
  criticaladakv       CriticalAdaKVPress(SnapKVPress(16, 7)): head-wise, masked (not by default);
  kvzip               KVzipPress(n_sink=4): masked (its per-layer ratios are applied head-wise
                      by a mask); slow (context-reconstruction passes, ~6x SnapKV's time); only with
                      --kvzip; GGUF models only (it loads the model's tokenizer in transformers for its
                      chat template and "Repeat the previous context" prompts); kvpress refuses Gemma 3.
Compression ratios as run.py's --compressions (kvpress's compression_ratio, the fraction removed).
A "kvpress-full" row (compression 0) is transformers' full cache.

Masked presses. Head-wise presses (adakv, criticaladakv, kvzip) only mask the pruned (head, token) pairs:
the cache keeps its full length. They are applied by the kvpress_peer harness's exact additive mask
(``install_mask_patch``: -inf at the pruned keys for every later query, instead of kvpress's fake
keys), and their rows have ``"masked": true`` (the table marks them " (masked)"). Caches whose
layers differ in length (pyramidkv, depthkv) get depthkv's per-layer attention masks
(``depthkv.kvpress.install_attention``).

Gemma 3 (Gemma3ForCausalLM) in kvpress: kvpress skips the sliding-window layers only for
Gemma3ForConditionalGeneration, so here every layer is compressed, sliding ones included, and in
the plain ``DynamicCache`` (kvpress's pipeline's) a sliding layer's window counts cache slots, not
positions, after the pruning (depthkv's engine and DepthKVPress cap a sliding layer at its window).

Rows are run.py's (length, task, seed, method, compression, score, n_context, n_question, answers,
output, seconds, prefill_ms) with method "kvpress-<press>", plus tokens, masked, kv_bytes_f32 (the
transformers cache's physical bytes after the prefill), kv_slots (physical (layer, KV head, token)
slots) and kept_fraction (unmasked slots over layers x KV heads x prefilled tokens). The result has
run.py's model, protocol and seeds keys, so report.py merges run.py's and this script's files of
one model, protocol and seeds into one table and plot.

Consistency check: on every sample the kvpress-full row's greedy tokens are compared with depthkv's
full-cache ones (``eng.generate(ctx, n, suffix_ids=q)``, or ``eng.generate(ctx + q, n)`` inside);
printed and kept in the result (``consistency``), never a failure (the GGUF quantized in depthkv,
dequantized to float32 in transformers; depthkv's KV cache is --kv-type, f16 by default as run.py).

  python benchmarks/ruler/kvpress_run.py --model SmolLM2.gguf --lengths 2048 --samples 4 \\
      --profile docs/results/smollm2.profile.json --out kvpress.json
  python benchmarks/ruler/report.py --out smollm2.2k.outside depthkv.json kvpress.json

Needs torch, transformers, kvpress (python/requirements-hf.txt), gguf (for GGUF files) and the
depthkv package.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import depthkv  # noqa: E402
import run as ruler  # noqa: E402  (run.py: MAX_NEW, METHODS, SELECTION)
from tasks import CALIBRATION_SEEDS, REPORT_SEEDS, make_sample, string_match_all  # noqa: E402

#: every press this script knows, in table order; DEFAULT_PRESSES run unless --presses says otherwise
PRESSES = ("snapkv", "tova", "keydiff", "expected-attention", "criticalkv", "adakv", "pyramidkv", "streamingllm",
           "depthkv", "criticaladakv", "kvzip")
DEFAULT_PRESSES = PRESSES[:9]
#: presses whose memory reduction is only a mask (the cache keeps its length)
MASKED = ("adakv", "criticaladakv", "kvzip")
PREFIX = "kvpress-"
FULL = PREFIX + "full"


def load_peer():
    """benchmarks/kvpress_peer/run.py as a module (its llama2.c -> HF conversion and its masking patch)."""
    path = os.path.join(ROOT, "benchmarks", "kvpress_peer", "run.py")
    spec = importlib.util.spec_from_file_location("kvpress_peer_run", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_model(path, peer):
    """The model file in transformers, float32, sdpa attention: a GGUF file dequantized by
    transformers, or a llama2.c checkpoint converted by the kvpress_peer harness."""
    import torch
    if path.endswith(".gguf"):
        import transformers
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
        gguf_utils.tqdm = lambda it, **kw: it  # no progress bar of the dequantization on stderr
        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path), dtype=torch.float32,
            attn_implementation="sdpa")
    else:
        model = peer.to_hf(path, "sdpa")
    return model.eval()


def stop_ids(eng, path):
    """The tokens before which depthkv's engine stops a generation: BOS, and for a byte-level BPE
    vocabulary EOS and EOT (bpe_tokenizer.hpp ``ends_generation``)."""
    stops = set() if eng.bos_id is None else {int(eng.bos_id)}
    if eng.format != "gguf":
        return stops
    import gguf
    fields = gguf.GGUFReader(path).fields
    if "tokenizer.ggml.model" not in fields or fields["tokenizer.ggml.model"].contents() != "gpt2":
        return stops
    if eng.eos_id is not None:
        stops.add(int(eng.eos_id))
    if "tokenizer.ggml.eot_token_id" in fields:
        stops.add(int(fields["tokenizer.ggml.eot_token_id"].contents()))
        return stops
    tokens = fields["tokenizer.ggml.tokens"].contents()
    index = {t: i for i, t in reversed(list(enumerate(tokens)))}
    for name in ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>"):
        if name in index:
            stops.add(index[name])
            break
    return stops


def make_press(name, comp, profile):
    """kvpress's press `name` at compression ratio `comp` (the module docstring's settings)."""
    import kvpress as kp
    sel = ruler.SELECTION
    snap = lambda: kp.SnapKVPress(compression_ratio=comp, window_size=sel["obs_window"], kernel_size=sel["kernel"])  # noqa: E731
    if name == "snapkv":
        return snap()
    if name == "tova":
        return kp.TOVAPress(compression_ratio=comp)
    if name == "keydiff":
        return kp.KeyDiffPress(compression_ratio=comp)
    if name == "expected-attention":
        return kp.ExpectedAttentionPress(compression_ratio=comp, n_sink=sel["sinks"])
    if name == "criticalkv":
        return kp.CriticalKVPress(snap())
    if name == "adakv":
        return kp.AdaKVPress(snap())
    if name == "criticaladakv":
        return kp.CriticalAdaKVPress(snap())
    if name == "pyramidkv":
        return kp.PyramidKVPress(compression_ratio=comp, window_size=sel["obs_window"], kernel_size=sel["kernel"])
    if name == "streamingllm":
        return kp.StreamingLLMPress(compression_ratio=comp, n_sink=sel["sinks"])
    if name == "kvzip":
        return kp.KVzipPress(compression_ratio=comp, n_sink=sel["sinks"])
    if name == "depthkv":
        from depthkv.kvpress import DepthKVPress
        return DepthKVPress(profile, keep=1.0 - comp, policy="optimal",
                            protection=(sel["sinks"], sel["recent"]))
    raise ValueError(f"unknown press {name!r}: one of {', '.join(PRESSES)}")


def kvzip_tokenizer(path):
    """KVzipPress loads ``AutoTokenizer.from_pretrained(model.config.name_or_path)`` for its chat
    template and its "Repeat the previous context" prompts: the GGUF file's tokenizer in
    transformers here (only those prompts; never the samples' ids)."""
    import kvpress.presses.kvzip_press as kz
    from transformers import AutoTokenizer

    class GGUFTokenizer:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            return AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)),
                                                 gguf_file=os.path.basename(path))
    kz.AutoTokenizer = GGUFTokenizer


_MASKS_INSTALLED = []


def install_masks(model, peer):
    """Once per process: the peer harness's exact masks for the head-wise presses, inside depthkv's
    per-layer masks (for caches of unequal layer lengths; neutral for equal ones)."""
    from depthkv.kvpress import install_attention
    if not _MASKS_INSTALLED:
        peer.install_mask_patch()
        _MASKS_INSTALLED.append(True)
    install_attention(model, "kvpress_run")  # idempotent


def attention_modules(model):
    return [layer.self_attn for layer in model.model.layers]


def cache_stats(model, cache, n):
    """(physical bytes, physical slots, unmasked slots, kept fraction) of the cache after an
    n-token prefill; masked slots are the (batch 0) pairs of the modules' ``masked_key_indices``."""
    nbytes = slots = masked = 0
    n_kv = 0
    for l, mod in enumerate(attention_modules(model)):
        k, v = cache.layers[l].keys, cache.layers[l].values
        nbytes += k.numel() * k.element_size() + v.numel() * v.element_size()
        slots += k.shape[1] * k.shape[2]
        n_kv = k.shape[1]
        idx = getattr(mod, "masked_key_indices", None)
        if idx is not None:
            masked += int((idx[0] == 0).sum())
    kept = slots - masked
    return nbytes, slots, kept, kept / (len(cache.layers) * n_kv * n)


def generate(model, press, ctx, q, max_new, stops, protocol):
    """Greedy tokens of (ctx, q) under `press` (None: the full cache) by `protocol`, and the row's
    measurements (prefill_ms, seconds, cache stats)."""
    import torch
    from transformers import DynamicCache
    for mod in attention_modules(model):
        mod.masked_key_indices = None
    cache = DynamicCache()
    prompt = ctx if protocol == "outside" else ctx + q
    n = len(prompt)
    t0 = time.time()
    with torch.no_grad():
        with press(model) if press is not None else contextlib.nullcontext():
            if protocol == "outside":
                model.model(input_ids=torch.tensor([prompt]), past_key_values=cache)
            else:
                out = model(input_ids=torch.tensor([prompt]), past_key_values=cache, logits_to_keep=1)
        prefill_ms = (time.time() - t0) * 1e3
        stats = cache_stats(model, cache, n)
        pos = n
        if protocol == "outside":
            out = model(input_ids=torch.tensor([q]), past_key_values=cache,
                        position_ids=torch.arange(n, n + len(q))[None], logits_to_keep=1)
            pos = n + len(q)
        tokens = []
        nxt = int(out.logits[0, -1].argmax())
        for i in range(max_new):
            if nxt in stops:
                break
            tokens.append(nxt)
            if i + 1 == max_new:
                break
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, position_ids=torch.tensor([[pos + i]]))
            nxt = int(out.logits[0, -1].argmax())
    return tokens, {"prefill_ms": round(prefill_ms, 1), "seconds": round(time.time() - t0, 3),
                    "kv_bytes_f32": stats[0], "kv_slots": stats[1], "kv_kept": stats[2],
                    "kept_fraction": round(stats[3], 4)}


def run(args) -> dict:
    import torch
    torch.set_num_threads(args.threads)
    import kvpress  # noqa: F401  (patches the attention functions; the peer's mask goes around it)
    logging.getLogger("kvpress").setLevel(logging.ERROR)  # "Model ... not tested" at every press call
    peer = load_peer()
    eng = depthkv.Engine(args.model, n_threads=args.threads, kv_type=args.kv_type)
    count = lambda text: len(eng.tokenize(text))  # noqa: E731
    t0 = time.time()
    model = load_model(args.model, peer)
    print(f"kvpress_run: {os.path.basename(args.model)} in transformers ({type(model).__name__}) in "
          f"{time.time() - t0:.1f} s", file=sys.stderr)
    install_masks(model, peer)
    failed = {}
    if "kvzip" in args.presses:
        if args.model.endswith(".gguf"):
            kvzip_tokenizer(args.model)
        else:
            failed["kvzip"] = ("KVzipPress needs the model's tokenizer in transformers (its chat template and "
                               "repeat prompts): GGUF models only")
    profile = depthkv.load_profile(args.profile) if args.profile else None
    presses = [p for p in args.presses if p != "depthkv" or profile is not None]
    if len(presses) < len(args.presses):
        print("kvpress_run: no --profile: press depthkv skipped", file=sys.stderr)
    stops = stop_ids(eng, args.model)
    seeds = (CALIBRATION_SEEDS if args.seeds == "calibration" else REPORT_SEEDS)[: args.samples]
    rows, checks = [], []
    cache = {}
    for length in args.lengths:
        for task in args.tasks:
            for seed in seeds:
                s = make_sample(task, length, seed, count)
                ctx = eng.tokenize(s["context"])
                q = eng.tokenize(s["question"], bos=False)
                n_new = ruler.MAX_NEW[task]
                if args.protocol == "outside":
                    dk = eng.generate(ctx, n_new, suffix_ids=q).tokens
                else:
                    dk = eng.generate(ctx + q, n_new).tokens
                cells = [("full", 0.0)] + [(p, c) for p in presses for c in args.compressions]
                for press_name, comp in cells:
                    if press_name in failed:
                        continue
                    try:
                        press = None
                        if press_name != "full":
                            if (press_name, comp) not in cache:
                                cache[(press_name, comp)] = make_press(press_name, comp, profile)
                            press = cache[(press_name, comp)]
                        tokens, m = generate(model, press, ctx, q, n_new, stops, args.protocol)
                    except Exception as e:  # a press that does not run on this model: reported, left out
                        failed[press_name] = f"{type(e).__name__}: {e}"
                        print(f"kvpress_run: {press_name} failed: {failed[press_name]}", file=sys.stderr)
                        continue
                    text = eng.detokenize(tokens)
                    score = 100.0 * string_match_all(text, s["answers"])
                    row = {"length": length, "task": task, "seed": seed, "method": PREFIX + press_name,
                           "compression": comp, "score": score, "n_context": len(ctx), "n_question": len(q),
                           "answers": s["answers"], "output": text, "tokens": tokens,
                           "masked": press_name in MASKED or m["kv_kept"] < m["kv_slots"], **m}
                    if press_name == "full":
                        same = tokens == dk
                        first = next((i for i, (a, b) in enumerate(zip(tokens, dk)) if a != b), min(len(tokens), len(dk)))
                        row.update(depthkv_output=eng.detokenize(dk), same_as_depthkv=same)
                        checks.append({"length": length, "task": task, "seed": seed, "equal": same,
                                       "first_difference": None if same else first})
                    rows.append(row)
                    print(f"kvpress_run: {length} {task} seed {seed} {PREFIX + press_name} c={comp:g}: {score:.0f} "
                          f"{text.strip()[:60]!r} ({m['seconds']:.1f} s, kept {m['kept_fraction']:.3f})",
                          file=sys.stderr)
    equal = sum(c["equal"] for c in checks)
    print(f"kvpress_run: consistency: transformers' full-cache greedy output equals depthkv's on {equal} of "
          f"{len(checks)} samples", file=sys.stderr)
    for c in checks:
        if not c["equal"]:
            print(f"kvpress_run:   differs: {c['length']} {c['task']} seed {c['seed']} from token {c['first_difference']}",
                  file=sys.stderr)
    for p, why in failed.items():
        print(f"kvpress_run: press {p} failed and is left out: {why}", file=sys.stderr)
    return {"model": os.path.basename(args.model), "protocol": args.protocol, "seeds": args.seeds,
            "profile": args.profile, "presses": presses, "failed": failed, "threads": args.threads,
            "versions": versions(), "consistency": {"equal": equal, "samples": len(checks), "checks": checks},
            "rows": rows}


def versions():
    from importlib.metadata import version
    out = {}
    for p in ("torch", "transformers", "kvpress", "gguf"):
        try:
            out[p] = version(p)
        except Exception:
            out[p] = None
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " (tables of run.py's and this "
                                "script's result files: report.py)")
    p.add_argument("--model", required=True, help="a GGUF file or a llama2.c checkpoint (as run.py's)")
    p.add_argument("--profile", help="the model's SnapKV curves (press depthkv: DepthKVPress, policy optimal)")
    p.add_argument("--presses", type=lambda s: s.split(","), default=list(DEFAULT_PRESSES),
                   help=f"of {', '.join(PRESSES)} (default: {', '.join(DEFAULT_PRESSES)})")
    p.add_argument("--kvzip", action="store_true", help="also KVzipPress (slow)")
    ruler.add_sample_args(p, "the press is applied to context + question")
    p.add_argument("--threads", type=int, default=2, help="torch's threads and depthkv's (the consistency check)")
    p.add_argument("--kv-type", default="f16", help="depthkv's KV cache type in the consistency check (as run.py: f16)")
    args = p.parse_args(argv)
    ruler.check_sample_args(p, args)
    ruler.check_names(p, args.presses, PRESSES, "press")
    if args.kvzip and "kvzip" not in args.presses:
        args.presses.append("kvzip")
    ruler.write_result(run(args), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
