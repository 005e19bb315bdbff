#!/usr/bin/env python3
"""Writes a synthetic Llama-shaped GGUF with random, valid quantized blocks (no real weights).

For benchmarks/gguf_engine_bench.cpp: resident memory against the file size, and prefill /
decode speed of the engine on weights kept in their stored blocks. Every weight matrix is
stored as --type (Q4_K by default; the classifier as Q6_K, as llama.cpp's Q4_K_M does), the
norms as F32. The blocks are random bytes with fixed fp16 scales chosen so that |w| <= ~0.15:
the values mean nothing, the layout and the cost of the products are those of a real file.

Needs the `gguf` and `numpy` packages (a virtual environment outside the repository):

    python3 -m venv /tmp/venv-gguf && /tmp/venv-gguf/bin/pip install gguf numpy
    /tmp/venv-gguf/bin/python benchmarks/synthetic_gguf.py /tmp/tinyllama-q4k.gguf

Default shape: TinyLlama-1.1B (dim 2048, hidden 5632, 22 layers, 32 heads / 4 KV heads,
vocab 32000).
"""

import argparse

import numpy as np
import gguf

Q = gguf.GGMLQuantizationType
# (block size, bytes per block, byte offsets of the fp16 scales, each scale's value)
LAYOUTS = {
    "Q4_0": (32, 18, [(0, 0.15 / 8)]),
    "Q8_0": (32, 34, [(0, 0.15 / 128)]),
    "Q4_K": (256, 144, [(0, 0.15 / 945), (2, 0.05 / 63)]),
    "Q6_K": (256, 210, [(208, 1e-4)]),
}


def blocks(rng, type_name, rows, cols):
    bs, nbytes, scales = LAYOUTS[type_name]
    assert cols % bs == 0
    raw = rng.integers(0, 256, size=(rows, cols // bs, nbytes), dtype=np.uint8)
    for off, value in scales:
        raw[:, :, off:off + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
    return raw.reshape(rows, cols // bs * nbytes)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--type", default="Q4_K", choices=sorted(LAYOUTS))
    ap.add_argument("--output-type", default="Q6_K", choices=sorted(LAYOUTS))
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=5632)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--context", type=int, default=2048, help="the file's context_length")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    hd = a.dim // a.heads
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_context_length(a.context)
    w.add_embedding_length(a.dim)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.hidden)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)

    def quant(name, rows, cols, t=a.type):
        w.add_tensor(name, blocks(rng, t, rows, cols), raw_dtype=getattr(Q, t))

    def norm(name, n):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    quant("token_embd.weight", a.vocab, a.dim)
    for l in range(a.layers):
        b = f"blk.{l}."
        norm(b + "attn_norm.weight", a.dim)
        quant(b + "attn_q.weight", a.heads * hd, a.dim)
        quant(b + "attn_k.weight", a.kv_heads * hd, a.dim)
        quant(b + "attn_v.weight", a.kv_heads * hd, a.dim)
        quant(b + "attn_output.weight", a.dim, a.heads * hd)
        norm(b + "ffn_norm.weight", a.dim)
        quant(b + "ffn_gate.weight", a.hidden, a.dim)
        quant(b + "ffn_down.weight", a.dim, a.hidden)
        quant(b + "ffn_up.weight", a.hidden, a.dim)
    norm("output_norm.weight", a.dim)
    quant("output.weight", a.vocab, a.dim, a.output_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
