#!/usr/bin/env python3
"""Cross-check of depthkv's GGUF engine against llama.cpp on the same files (issue 14).

Not part of CI. Needs a virtual environment outside the repository with requirements.txt
(`llama-cpp-python` builds llama.cpp's CPU library while it installs) and a Release build of
depthkv's `gguf_engine_bench`:

    python3 -m venv /tmp/venv-llamacpp
    CMAKE_BUILD_PARALLEL_LEVEL=2 /tmp/venv-llamacpp/bin/pip install -r benchmarks/llamacpp_check/requirements.txt
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build --target gguf_engine_bench
    /tmp/venv-llamacpp/bin/python benchmarks/llamacpp_check/run.py --bench build/benchmarks/gguf_engine_bench

For each shape it writes a synthetic GGUF of the real model's shape (random weights, normal with
standard deviation 0.02, norms 1; the real model's vocabulary from ../shared/vocab, so llama.cpp
loads it) as F16 with the `gguf` package, quantizes it with llama.cpp's own quantizer
(`llama_cpp.llama_model_quantize`) to each type, and on every file runs, back to back with the
same thread count:
- the next-token distributions of the same fixed random token ids (no tokenizer involved) from
  both engines: mean KL(llama.cpp || depthkv) per position; also KL(llama.cpp F16 || llama.cpp T),
  what the quantization itself changes, for scale;
- prefill (--prompt tokens, one batch) and decode (--decode tokens, one at a time, teacher-forced)
  tokens/s, each engine run --repeat times, the fastest kept;
- depthkv's peak resident memory (VmHWM, before its logits run) against the file size and the
  KV cache of prompt + decode tokens (float32).
The floor of the KL: llama.cpp multiplies F16 weights with activations rounded to F16 and block
types with activations rounded to 8 bits (Q8_0 per 32, Q8_K per 256 values), depthkv keeps F16
activations in float and rounds to 8 bits per 32 values; the type "F32" (llama.cpp's quantizer
writing F32 from the F16 file, the same values) checks the two forward passes without either
rounding.

Raw results are appended to --results (JSON lines); the table is rendered from that file into
benchmarks/RESULTS.md between the markers of its llama.cpp section (--write-results), so shapes
can be run one at a time (--shapes) and rendered together.

Long contexts (--contexts 2048,4096,...): for each shape and type, llama.cpp's full cache (F16 K
and V, its default) prefills each context and decodes --decode tokens after it, each context in
its own process (its peak RSS is the run's: ru_maxrss, which includes the Python interpreter);
with --lc-bench, depthkv's benchmarks/long_context_bench runs on the same GGUF with the same
threads for each --lc-keeps ratio (1 = full cache). Every run writes one --json file into
--lc-out in long_context_bench's field names, for benchmarks/long_context_plot.py:

    /tmp/venv-llamacpp/bin/python benchmarks/llamacpp_check/run.py --shapes tinyllama-1.1b --types Q4_K_M \
        --contexts 2048,4096,8192,16384,32768 --decode 64 --threads 2 --lc-bench build/benchmarks/long_context_bench

(a shape's vocabulary must be in ../shared/vocab: llama-spm and llama-bpe are, qwen2 is not)

--repack on|off sets llama.cpp's weight repacking (`use_extra_bufts` of the model parameters;
llama-cpp-python 0.3.36 crashed on AVX-512 machines in the repacking path): off by default, and
every long-context figure records which.
"""

import argparse
import ctypes
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# Shapes of the real models (hyper-parameters from their config.json files).
SHAPES = {
    "tinyllama-1.1b": dict(arch="llama", name="TinyLlama-1.1B", layers=22, dim=2048, ffn=5632, heads=32, kv_heads=4,
                           head_dim=64, vocab="llama-spm", rope_base=10000.0, eps=1e-5, ctx=2048, tied=False),
    "llama-3.2-1b": dict(arch="llama", name="Llama-3.2-1B", layers=16, dim=2048, ffn=8192, heads=32, kv_heads=8,
                         head_dim=64, vocab="llama-bpe", rope_base=500000.0, eps=1e-5, ctx=131072, tied=True,
                         llama3_rope=dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context=8192)),
    "qwen2.5-0.5b": dict(arch="qwen2", name="Qwen2.5-0.5B", layers=24, dim=896, ffn=4864, heads=14, kv_heads=2,
                         head_dim=64, vocab="qwen2", rope_base=1000000.0, eps=1e-6, ctx=32768, tied=True, biases=True),
    "qwen3-0.6b": dict(arch="qwen3", name="Qwen3-0.6B", layers=28, dim=1024, ffn=3072, heads=16, kv_heads=8,
                       head_dim=128, vocab="qwen2", rope_base=1000000.0, eps=1e-6, ctx=40960, tied=True, qk_norm=True),
    # small, for a smoke test and for trying the CLI on a llama.cpp-quantized file (not in the default list)
    "small-llama": dict(arch="llama", name="small llama (dim 256)", layers=4, dim=256, ffn=768, heads=8, kv_heads=4,
                        head_dim=32, vocab="llama-spm", rope_base=10000.0, eps=1e-5, ctx=2048, tied=False),
}
DEFAULT_SHAPES = ["tinyllama-1.1b", "llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b"]
# first id of the special tokens per vocabulary (the fixed random ids stay below)
VOCAB_PLAIN = {"llama-spm": 32000, "llama-bpe": 128000, "qwen2": 151643}
TYPES = ["F32", "F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0"]
DEFAULT_TYPES = ["F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0"]
FTYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}

BEGIN = "<!-- llamacpp_check:begin (written by benchmarks/llamacpp_check/run.py) -->"
END = "<!-- llamacpp_check:end -->"


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def llama3_rope_factors(head_dim, base, factor, low_freq_factor, high_freq_factor, original_context):
    """rope_freqs.weight as llama.cpp's convert_hf_to_gguf.py writes it for rope_type llama3."""
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    low_wavelen = original_context / low_freq_factor
    high_wavelen = original_context / high_freq_factor
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def copy_tokenizer(w, vocab_path):
    """Copies every tokenizer.* key of a vocabulary-only GGUF into writer w."""
    r = gguf.GGUFReader(vocab_path)
    n_tokens = 0
    for key, field in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        val = field.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            if key == "tokenizer.ggml.tokens":
                n_tokens = len(val)
            w.add_key_value(key, val, vtype, sub_type=sub)
        else:
            w.add_key_value(key, val, vtype)
    return n_tokens


def write_synthetic(shape, path, seed, scale):
    s = SHAPES[shape]
    rng = np.random.default_rng(seed)
    arch = s["arch"]
    w = gguf.GGUFWriter(path, arch)
    w.add_name("synthetic " + s["name"] + " shape (random weights)")
    w.add_file_type(1)
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["dim"])
    w.add_feed_forward_length(s["ffn"])
    w.add_block_count(s["layers"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_rope_dimension_count(s["head_dim"])
    if s["head_dim"] * s["heads"] != s["dim"]:
        w.add_key_length(s["head_dim"])
        w.add_value_length(s["head_dim"])
    n_vocab = copy_tokenizer(w, os.path.join(args.shared, "vocab", "ggml-vocab-%s.gguf" % s["vocab"]))
    w.add_vocab_size(n_vocab)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * scale).astype(np.float16)

    def ones(n):
        return np.ones(n, dtype=np.float32)

    qd, kd = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    w.add_tensor("token_embd.weight", mat(n_vocab, s["dim"]))
    if "llama3_rope" in s:
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(s["head_dim"], s["rope_base"], **s["llama3_rope"]))
    for l in range(s["layers"]):
        b = "blk.%d." % l
        w.add_tensor(b + "attn_norm.weight", ones(s["dim"]))
        w.add_tensor(b + "attn_q.weight", mat(qd, s["dim"]))
        w.add_tensor(b + "attn_k.weight", mat(kd, s["dim"]))
        w.add_tensor(b + "attn_v.weight", mat(kd, s["dim"]))
        if s.get("biases"):
            for n, d in (("q", qd), ("k", kd), ("v", kd)):
                w.add_tensor(b + "attn_%s.bias" % n, (rng.standard_normal(d, dtype=np.float32) * scale).astype(np.float32))
        if s.get("qk_norm"):
            w.add_tensor(b + "attn_q_norm.weight", ones(s["head_dim"]))
            w.add_tensor(b + "attn_k_norm.weight", ones(s["head_dim"]))
        w.add_tensor(b + "attn_output.weight", mat(s["dim"], qd))
        w.add_tensor(b + "ffn_norm.weight", ones(s["dim"]))
        w.add_tensor(b + "ffn_gate.weight", mat(s["ffn"], s["dim"]))
        w.add_tensor(b + "ffn_down.weight", mat(s["dim"], s["ffn"]))
        w.add_tensor(b + "ffn_up.weight", mat(s["ffn"], s["dim"]))
    w.add_tensor("output_norm.weight", ones(s["dim"]))
    if not s["tied"]:
        w.add_tensor("output.weight", mat(n_vocab, s["dim"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return n_vocab


def quantize(llama_cpp, src, dst, type_name, threads):
    p = llama_cpp.llama_model_quantize_default_params()
    p.nthread = threads
    p.ftype = FTYPE[type_name]
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    if rc != 0:
        raise RuntimeError("llama_model_quantize %s -> %s failed (%d)" % (src, type_name, rc))


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def kl_mean(p_logits, q_logits):
    """Mean over positions of KL(P || Q), natural log."""
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum(axis=-1).mean())


def run_llamacpp(Llama, path, ids, a):
    """(logits [n_logits x vocab], best prefill tok/s, best decode tok/s, runs)."""
    n_logits = a.logits_tokens
    llm = Llama(model_path=path, n_ctx=max(256, n_logits), n_batch=n_logits, n_ubatch=n_logits, n_threads=a.threads,
                n_threads_batch=a.threads, logits_all=True, verbose=False)
    llm.eval(ids[:n_logits])
    logits = np.array(llm.scores[:n_logits], dtype=np.float32)
    del llm
    ctx = a.prompt + a.decode + 16
    llm = Llama(model_path=path, n_ctx=ctx, n_batch=a.prompt, n_ubatch=a.prompt, n_threads=a.threads,
                n_threads_batch=a.threads, logits_all=False, verbose=False)
    pre, dec = [], []
    for _ in range(a.repeat):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids[:a.prompt])
        pre.append(a.prompt / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for i in range(a.decode):
            llm.eval([ids[a.prompt + i]])
        dec.append(a.decode / (time.perf_counter() - t0))
    del llm
    return logits, max(pre), max(dec), pre, dec


def run_depthkv(path, ids_path, vocab, a, tmp):
    out = os.path.join(tmp, "depthkv_logits.f32")
    js = os.path.join(tmp, "depthkv.json")
    cmd = [a.bench, path, "--tokens", ids_path, "--prompt", str(a.prompt), "--decode", str(a.decode), "--threads",
           str(a.threads), "--chunk", str(a.prompt), "--repeat", str(a.repeat), "--logits-out", out, "--logits-tokens",
           str(a.logits_tokens), "--json", js]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("gguf_engine_bench failed:\n" + r.stdout + r.stderr)
    logits = np.fromfile(out, dtype=np.float32).reshape(a.logits_tokens, vocab)
    with open(js) as f:
        figures = json.load(f)
    os.remove(out)
    return logits, figures, r.stdout


def check_shape(shape, a, llama_cpp, Llama):
    tmp = a.tmp
    os.makedirs(tmp, exist_ok=True)
    s = SHAPES[shape]
    base = os.path.join(tmp, "%s-F16.gguf" % shape)
    if not os.path.exists(base):
        log(shape, ": writing", base)
        write_synthetic(shape, base, a.seed, a.scale)
    vocab = gguf.GGUFReader(base).fields["tokenizer.ggml.tokens"].data.__len__()
    rng = np.random.default_rng(a.seed + 1)
    ids = [int(x) for x in rng.integers(3, VOCAB_PLAIN[s["vocab"]], size=max(a.prompt + a.decode, a.logits_tokens))]
    ids_path = os.path.join(tmp, "%s-ids.txt" % shape)
    with open(ids_path, "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    ref = None  # llama.cpp F16 logits
    rows = []
    for t in a.types:
        path = base if t == "F16" else os.path.join(tmp, "%s-%s.gguf" % (shape, t))
        if not os.path.exists(path):
            log(shape, t, ": quantizing with llama.cpp")
            t0 = time.time()
            quantize(llama_cpp, base, path, t, a.threads)
            log("   quantized in %.0f s" % (time.time() - t0))
        log(shape, t, ": llama.cpp")
        l_logits, l_pre, l_dec, l_pre_runs, l_dec_runs = run_llamacpp(Llama, path, ids, a)
        log(shape, t, ": depthkv")
        d_logits, fig, _ = run_depthkv(path, ids_path, vocab, a, tmp)
        if t == "F16":
            ref = l_logits
        row = dict(shape=shape, name=s["name"], type=t, file_mb=os.path.getsize(path) / 1048576.0,
                   kl_llamacpp_depthkv=kl_mean(l_logits, d_logits),
                   kl_f16_type=(kl_mean(ref, l_logits) if ref is not None else None),
                   top1_agree=float((l_logits.argmax(-1) == d_logits.argmax(-1)).mean()),
                   llamacpp_prefill=l_pre, llamacpp_decode=l_dec, llamacpp_prefill_runs=l_pre_runs,
                   llamacpp_decode_runs=l_dec_runs, depthkv_prefill=fig["prefill_tok_s"],
                   depthkv_decode=fig["decode_tok_s"], depthkv_prefill_runs=fig["prefill_runs"],
                   depthkv_decode_runs=fig["decode_runs"], vmhwm_mb=fig["vmhwm_mb"], kv_cache_mb=fig["kv_cache_mb"],
                   threads=a.threads, prompt=a.prompt, decode=a.decode, logits_tokens=a.logits_tokens,
                   repeat=a.repeat, when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   load=os.getloadavg()[0])
        log("   KL %.3g (F16->%s %.3g), prefill %.1f vs %.1f, decode %.2f vs %.2f tok/s, peak RSS %.0f MiB / file %.0f MiB"
            % (row["kl_llamacpp_depthkv"], t, row["kl_f16_type"] or 0, row["depthkv_prefill"], l_pre,
               row["depthkv_decode"], l_dec, row["vmhwm_mb"], row["file_mb"]))
        with open(a.results, "a") as f:
            f.write(json.dumps(row) + "\n")
        rows.append(row)
        if t != "F16" and not a.keep:
            os.remove(path)
    return rows


def set_repack(llama_cpp, on):
    """Makes every model llama-cpp-python loads from now on use (or not) llama.cpp's repacked
    weight buffers (`use_extra_bufts`); returns False when this llama.cpp has no such setting."""
    low = llama_cpp.llama_cpp
    fields = [f[0] for f in low.llama_model_params._fields_]
    if "use_extra_bufts" not in fields:
        return False
    default = low.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = bool(on)
        return p
    low.llama_model_default_params = params
    llama_cpp.llama_model_default_params = params
    return True


def best_window(step_s, w):
    """tok/s of the fastest w consecutive steps (all of them when fewer)."""
    n = min(len(step_s), w)
    return n / min(sum(step_s[i:i + n]) for i in range(len(step_s) - n + 1))


def lc_one(a):
    """One long-context run of llama.cpp's full cache (in its own process): prints its JSON."""
    import resource
    import llama_cpp
    from llama_cpp import Llama
    repack_set = set_repack(llama_cpp, a.repack == "on")
    s = SHAPES[a.lc_shape]
    n_ctx = a.lc_context + a.decode + 16
    llm = Llama(model_path=a.lc_one, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=a.threads,
                n_threads_batch=a.threads, logits_all=False, verbose=False)
    rng = np.random.default_rng(a.seed + 2)
    ids = [int(x) for x in rng.integers(3, VOCAB_PLAIN[s["vocab"]], size=a.lc_context + a.decode)]
    t0 = time.perf_counter()
    llm.eval(ids[:a.lc_context])
    prefill_s = time.perf_counter() - t0
    steps = []
    for i in range(a.decode):
        t = time.perf_counter()
        llm.eval([ids[a.lc_context + i]])
        steps.append(time.perf_counter() - t)
    kv_bytes = 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * 2 * n_ctx  # F16 K and V, n_ctx cells allocated
    row = dict(engine="llama.cpp", input=a.lc_one, shape=a.lc_shape, mode="full", keep=1.0, context=a.lc_context,
               decode=a.decode, threads=a.threads, prefill="real", prefill_s=prefill_s,
               prefill_tok_s=a.lc_context / prefill_s, decode_s=sum(steps), decode_tok_s=a.decode / sum(steps),
               decode_tok_s_best_window=best_window(steps, 32),
               peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, kv_peak_bytes=kv_bytes,
               kv_end_bytes=kv_bytes, repack=(a.repack == "on") if repack_set else "default (no use_extra_bufts)",
               llama_cpp_python=llama_cpp.__version__, load_avg=os.getloadavg()[0], unix_time=int(time.time()))
    print(json.dumps(row))


def quantize_with_binary(bin_dir, src, dst, type_name, threads):
    """llama.cpp's own `llama-quantize` program (--llama-bench's folder) instead of the Python binding."""
    subprocess.run([os.path.join(bin_dir, "llama-quantize"), src, dst, type_name, str(threads)], check=True,
                   capture_output=True)


def lc_llama_bench(a, path, shape, ctx):
    """One long-context run of llama.cpp's full cache with its own `llama-bench` program (--llama-bench):
    the context is filled by a real prefill of `ctx` tokens (`-d`, not timed), then --decode tokens are
    generated one at a time (`-n`, timed; llama-bench reports their mean rate, so the fastest window is
    that mean); the peak RSS is the process's (GNU time's maximum resident set size)."""
    s = SHAPES[shape]
    cmd = ["/usr/bin/time", "-f", "MAXRSS_KB %M", os.path.join(a.llama_bench, "llama-bench"), "-m", path, "-p", "0",
           "-n", str(a.decode), "-d", str(ctx), "-t", str(a.threads), "-r", "1", "--repack",
           "1" if a.repack == "on" else "0", "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("llama-bench failed:\n" + r.stdout + r.stderr)
    test = json.loads(r.stdout)[0]
    rss_kb = int(r.stderr.split("MAXRSS_KB")[-1].split()[0])
    decode_s = test["avg_ns"] / 1e9
    n_ctx = ctx + a.decode
    kv_bytes = 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * 2 * n_ctx  # F16 K and V of the cells in use
    return dict(engine="llama.cpp", input=path, shape=shape, mode="full", keep=1.0, context=ctx, decode=a.decode,
                threads=a.threads, prefill="real (llama-bench -d, not timed)", decode_s=decode_s,
                decode_tok_s=test["avg_ts"], decode_tok_s_best_window=test["avg_ts"], peak_rss_mb=rss_kb / 1024.0,
                kv_peak_bytes=kv_bytes, kv_end_bytes=kv_bytes, repack=a.repack == "on",
                llama_cpp_build=test.get("build_commit", ""), llama_cpp_program="llama-bench",
                load_avg=os.getloadavg()[0], unix_time=int(time.time()))


def long_contexts(a, llama_cpp):
    """--contexts: llama.cpp's full cache (and depthkv's runs with --lc-bench) per context."""
    os.makedirs(a.lc_out, exist_ok=True)
    for shape in a.shapes.split(","):
        base = os.path.join(a.tmp, "%s-F16.gguf" % shape)
        if not os.path.exists(base):
            os.makedirs(a.tmp, exist_ok=True)
            write_synthetic(shape, base, a.seed, a.scale)
        for t in a.types:
            path = base if t == "F16" else os.path.join(a.tmp, "%s-%s.gguf" % (shape, t))
            if not os.path.exists(path):
                if a.llama_bench:
                    quantize_with_binary(a.llama_bench, base, path, t, a.threads)
                else:
                    quantize(llama_cpp, base, path, t, a.threads)
            for ctx in [int(c) for c in a.contexts.split(",")]:
                stem = os.path.join(a.lc_out, "%s-%s-%%s-%d.json" % (shape, t, ctx))
                log(shape, t, ctx, ": llama.cpp full cache, repack", a.repack)
                if a.llama_bench:
                    if not a.lc_skip_llamacpp:
                        row = lc_llama_bench(a, path, shape, ctx)  # no file unless the run succeeded
                        with open(stem % "llamacpp", "w") as f:
                            f.write(json.dumps(row) + "\n")
                    run_lc_bench(a, path, ctx, stem)
                    continue
                r = subprocess.run([sys.executable, os.path.abspath(__file__), "--lc-one", path, "--lc-shape", shape,
                                    "--lc-context", str(ctx), "--decode", str(a.decode), "--threads", str(a.threads),
                                    "--repack", a.repack, "--seed", str(a.seed)], capture_output=True, text=True)
                if r.returncode != 0:
                    raise RuntimeError("llama.cpp run failed:\n" + r.stdout + r.stderr)
                with open(stem % "llamacpp", "w") as f:
                    f.write(r.stdout.strip().splitlines()[-1] + "\n")
                run_lc_bench(a, path, ctx, stem)


def run_lc_bench(a, path, ctx, stem):
    """depthkv's long_context_bench on the same file and threads, per --lc-keeps ratio (--lc-bench)."""
    for keep in ([] if not a.lc_bench else a.lc_keeps.split(",")):
        log(os.path.basename(path), ctx, ": depthkv keep", keep)
        cmd = [a.lc_bench, "--model", path, "--context", str(ctx), "--decode", str(a.decode), "--threads",
               str(a.threads), "--keep", keep, "--prefill", a.lc_prefill, "--scorer", a.lc_scorer,
               "--json", stem % ("keep" + keep)] + a.lc_extra.split()
        subprocess.run(cmd, check=True)


def render(results_path):
    rows = {}
    with open(results_path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                rows[(r["shape"], r["type"])] = r  # the latest run of a cell
    order = {k: i for i, k in enumerate(SHAPES)}
    out = ["| shape | type | file MiB | KL(llama.cpp \\|\\| depthkv) | top-1 agree | KL(F16 \\|\\| type), llama.cpp | "
           "prefill tok/s depthkv / llama.cpp (ratio) | decode tok/s depthkv / llama.cpp (ratio) | peak RSS / (file + KV) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for (shape, t), r in sorted(rows.items(), key=lambda kv: (order[kv[0][0]], TYPES.index(kv[0][1]))):
        kl16 = "-" if r["kl_f16_type"] is None or t == "F16" else "%.2e" % r["kl_f16_type"]
        out.append("| %s | %s | %.0f | %.2e | %.3f | %s | %.1f / %.1f (%.2fx) | %.2f / %.2f (%.2fx) | %.3f |" % (
            r["name"], t, r["file_mb"], r["kl_llamacpp_depthkv"], r["top1_agree"], kl16, r["depthkv_prefill"],
            r["llamacpp_prefill"], r["depthkv_prefill"] / r["llamacpp_prefill"], r["depthkv_decode"], r["llamacpp_decode"],
            r["depthkv_decode"] / r["llamacpp_decode"], r["vmhwm_mb"] / (r["file_mb"] + r["kv_cache_mb"])))
    any_row = next(iter(rows.values()))
    head = ("Settings: %d threads for both engines, prompt %d tokens (one batch), %d decode tokens (teacher-forced), "
            "KL over the first %d positions, fastest of %d runs per engine; runs %s to %s."
            % (any_row["threads"], any_row["prompt"], any_row["decode"], any_row["logits_tokens"], any_row["repeat"],
               min(r["when"] for r in rows.values()), max(r["when"] for r in rows.values())))
    return head + "\n\n" + "\n".join(out)


def write_results_md(table):
    md = os.path.join(REPO, "benchmarks", "RESULTS.md")
    text = open(md).read()
    if BEGIN not in text:
        raise SystemExit("benchmarks/RESULTS.md has no llama.cpp section markers (%s)" % BEGIN)
    i, j = text.index(BEGIN) + len(BEGIN), text.index(END)
    open(md, "w").write(text[:i] + "\n" + table + "\n" + text[j:])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=os.path.join(REPO, "build", "benchmarks", "gguf_engine_bench"))
    ap.add_argument("--shared", default=os.path.join(REPO, "..", "shared"))
    ap.add_argument("--tmp", default="/tmp/depthkv-llamacpp-check", help="folder for the GGUF files (not the repo)")
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma-separated, of: " + ", ".join(SHAPES))
    ap.add_argument("--types", default=",".join(DEFAULT_TYPES), help="comma-separated, of: " + ", ".join(TYPES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--logits-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--scale", type=float, default=0.02)
    ap.add_argument("--keep", action="store_true", help="keep the quantized files")
    ap.add_argument("--quick", action="store_true", help="F16, Q8_0, Q4_K_M; prompt 128, 8 decode, 32 positions")
    ap.add_argument("--results", default=os.path.join(REPO, "benchmarks", "results", "llamacpp_check.jsonl"))
    ap.add_argument("--write-results", action="store_true", help="render --results into benchmarks/RESULTS.md")
    ap.add_argument("--render-only", action="store_true", help="only render (no runs)")
    ap.add_argument("--contexts", default="", help="long contexts, comma-separated (e.g. 2048,4096,8192,16384,32768)")
    ap.add_argument("--repack", choices=["on", "off"], default="off", help="llama.cpp's weight repacking (use_extra_bufts)")
    ap.add_argument("--lc-out", default=os.path.join(REPO, "benchmarks", "results", "long_context"))
    ap.add_argument("--lc-bench", default="", help="depthkv's long_context_bench, run on the same files")
    ap.add_argument("--lc-keeps", default="1,0.2,0.1")
    ap.add_argument("--lc-prefill", choices=["real", "synthetic"], default="synthetic")
    ap.add_argument("--lc-scorer", default="snapkv")
    ap.add_argument("--lc-extra", default="", help="more long_context_bench flags (space-separated)")
    ap.add_argument("--llama-bench", default="",
                    help="folder of llama.cpp's llama-bench and llama-quantize programs: --contexts runs them "
                         "instead of llama-cpp-python (no Python binding needed)")
    ap.add_argument("--lc-skip-llamacpp", action="store_true", help="--contexts: depthkv's runs only")
    ap.add_argument("--lc-one", default="", help=argparse.SUPPRESS)
    ap.add_argument("--lc-shape", default="", help=argparse.SUPPRESS)
    ap.add_argument("--lc-context", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.lc_one:
        lc_one(args)
        sys.exit(0)
    if args.quick:
        args.types, args.prompt, args.decode, args.logits_tokens = "F16,Q8_0,Q4_K_M", 128, 8, 32
    args.types = args.types.split(",")
    for t in args.types:
        if t not in TYPES:
            ap.error("unknown type " + t)
    if "F16" in args.types:  # the reference of KL(F16 || type) comes first
        args.types = ["F16"] + [t for t in args.types if t != "F16"]
    if args.contexts:
        if args.llama_bench:
            long_contexts(args, None)
        else:
            import llama_cpp
            long_contexts(args, llama_cpp)
        sys.exit(0)
    if not args.render_only:
        import llama_cpp
        from llama_cpp import Llama
        log("llama-cpp-python", llama_cpp.__version__, "on", platform.processor() or platform.machine(),
            "%d CPUs" % os.cpu_count())
        for shape in args.shapes.split(","):
            check_shape(shape, args, llama_cpp, Llama)
    table = render(args.results)
    print(table)
    if args.write_results:
        write_results_md(table)
