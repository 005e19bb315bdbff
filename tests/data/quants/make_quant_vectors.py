#!/usr/bin/env python3
"""Writes the dequantization test vectors of tests/llama/quant/dequantize_test.cpp.

For each ggml type: random blocks (random bytes, with every fp16 scale field replaced by a
random finite half, subnormals and zero included) in `<type>.blocks`, and the float32 values
`gguf.quants.dequantize` (the gguf Python package, llama.cpp's reference) gives for them in
`<type>.f32` (little-endian). Fixed seed: running it again writes the same files.

    python3 -m venv /tmp/venv-gguf && /tmp/venv-gguf/bin/pip install gguf numpy
    /tmp/venv-gguf/bin/python tests/data/quants/make_quant_vectors.py
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

OUT = os.path.dirname(os.path.abspath(__file__))

# type -> (number of blocks, byte offsets of the fp16 fields inside a block)
TYPES = {
    T.F32: (512, []),
    T.F16: (512, []),
    T.BF16: (512, []),
    T.Q4_0: (16, [0]),
    T.Q4_1: (16, [0, 2]),
    T.Q5_0: (16, [0]),
    T.Q5_1: (16, [0, 2]),
    T.Q8_0: (16, [0]),
    T.Q2_K: (4, [80, 82]),
    T.Q3_K: (4, [108]),
    T.Q4_K: (4, [0, 2]),
    T.Q5_K: (4, [0, 2]),
    T.Q6_K: (4, [208]),
    T.IQ4_NL: (16, [0]),
    T.IQ4_XS: (4, [0]),
}


def random_half(rng, n, exp_lo=0, exp_hi=17):
    """Random finite half bits: exponent field in [exp_lo, exp_hi] (0: zero/subnormal)."""
    sign = rng.integers(0, 2, n, dtype=np.uint16) << 15
    exp = rng.integers(exp_lo, exp_hi + 1, n, dtype=np.uint16) << 10
    mant = rng.integers(0, 1024, n, dtype=np.uint16)
    return (sign | exp | mant).astype(np.uint16)


def main():
    rng = np.random.default_rng(20261201)
    for qtype, (n_blocks, half_fields) in TYPES.items():
        block_size, type_size = quants.GGML_QUANT_SIZES[qtype]
        name = qtype.name.lower()
        if qtype == T.F32:
            raw = rng.standard_normal(n_blocks).astype(np.float32).view(np.uint8)
        elif qtype == T.F16:
            raw = random_half(rng, n_blocks, 0, 30).view(np.uint8)
        elif qtype == T.BF16:
            sign = rng.integers(0, 2, n_blocks, dtype=np.uint16) << 15
            exp = rng.integers(0, 255, n_blocks, dtype=np.uint16) << 7
            mant = rng.integers(0, 128, n_blocks, dtype=np.uint16)
            raw = (sign | exp | mant).astype(np.uint16).view(np.uint8)
        else:
            blocks = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
            for off in half_fields:
                h = random_half(rng, n_blocks)
                h[0] = 0  # a zero scale
                blocks[:, off:off + 2] = h.view(np.uint8).reshape(n_blocks, 2)
            raw = blocks.reshape(-1)
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        expected = quants.dequantize(raw.reshape(-1, type_size) if block_size > 1 else raw.reshape(1, -1), qtype)
        expected = np.ascontiguousarray(expected.reshape(-1), dtype="<f4")
        assert expected.size == n_blocks * block_size, (name, expected.size)
        assert np.all(np.isfinite(expected)), name
        raw.tofile(os.path.join(OUT, name + ".blocks"))
        expected.tofile(os.path.join(OUT, name + ".f32"))
        print(f"{name}: {n_blocks} blocks, {raw.size} bytes -> {expected.size} values", file=sys.stderr)


if __name__ == "__main__":
    main()
