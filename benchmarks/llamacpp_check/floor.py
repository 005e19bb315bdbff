#!/usr/bin/env python3
"""The KL floor of benchmarks/llamacpp_check/run.py on a small file (not part of CI).

    floor.py SMALL-F16.gguf TYPE   [IDS]  (TYPE: Q8_0, Q4_K_M, Q4_0; IDS: a file of token ids)

Quantizes the F16 file with llama.cpp's quantizer and prints, over 32 positions of the same ids:
KL(llama.cpp F16 || llama.cpp TYPE), the quantization's own effect; KL(llama.cpp TYPE || depthkv
TYPE) with depthkv's int8-activation products (the default) and with the exact float products of
the same weights (`gguf_engine_bench --dequantize`), and KL(depthkv exact || depthkv int8): if
depthkv and llama.cpp agree up to their activation rounding, the second is about the sum of the
third (llama.cpp's rounding) and the fourth (depthkv's). Same environment as run.py; the
benchmark program from $DEPTHKV_BENCH (default build/benchmarks/gguf_engine_bench).
"""
import ctypes
import os
import subprocess
import sys

import numpy as np
import llama_cpp
from llama_cpp import Llama
src, t = sys.argv[1], sys.argv[2]
FT = {"Q8_0": 7, "Q4_K_M": 15, "Q4_0": 2, "F32": 0}
dst = src.replace("-F16", "-" + t) if "-F16" in src else src + "." + t
if not os.path.exists(dst):
    p = llama_cpp.llama_model_quantize_default_params(); p.nthread = 2; p.ftype = FT[t]
    assert llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p)) == 0
IDS = sys.argv[3] if len(sys.argv) > 3 else "/tmp/h14x_ids.txt"
ids = [int(x) for x in open(IDS).read().split()]
N = 32
def ls(x):
    x = x.astype(np.float64); m = x.max(-1, keepdims=True); return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))
def kl(a, b):
    a, b = ls(a), ls(b); return (np.exp(a) * (a - b)).sum(-1).mean()
def lcpp(path):
    llm = Llama(model_path=path, n_ctx=256, n_batch=N, n_ubatch=N, n_threads=2, n_threads_batch=2, logits_all=True, verbose=False)
    llm.eval(ids[:N]); return np.array(llm.scores[:N])
def dkv(path, extra):
    subprocess.run([os.environ.get("DEPTHKV_BENCH", "build/benchmarks/gguf_engine_bench"), path, "--tokens", IDS, "--prompt", "8", "--decode", "0",
                    "--threads", "2", "--logits-out", "/tmp/h14x_fl.f32", "--logits-tokens", str(N)] + extra, check=True, capture_output=True)
    return np.fromfile("/tmp/h14x_fl.f32", dtype=np.float32).reshape(N, -1)
L16, Lt = lcpp(src), lcpp(dst)
Dq, Dx, D16 = dkv(dst, []), dkv(dst, ["--dequantize"]), dkv(src, [])
print(t, "KL(lcpp F16||lcpp T)", kl(L16, Lt), "KL(dkv F16||dkv exact T)", kl(D16, Dx))
print(t, "KL(lcpp T||dkv q8act T)", kl(Lt, Dq), "KL(lcpp T||dkv exact T)", kl(Lt, Dx), "KL(dkv exact||dkv q8act)", kl(Dx, Dq))
print("F16: KL(lcpp||dkv)", kl(L16, D16))
