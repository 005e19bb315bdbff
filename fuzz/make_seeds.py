#!/usr/bin/env python3
"""Writes small valid seed inputs for the depthkv fuzz targets (standard library only).

usage: make_seeds.py OUT_DIR [DATA_DIR]
Creates OUT_DIR/llama2c, OUT_DIR/gguf, OUT_DIR/tokenizer. DATA_DIR (the shared/ folder,
optional) adds the real tok512.bin and the cases of vocab/ggml-vocab-{llama-bpe,qwen2,gpt-2}.gguf.inp
as tokenizer seeds.
"""
import os
import struct
import sys


def f32s(n, k=0):
    return b"".join(struct.pack("<f", ((i + k) % 17) * 0.125 - 1.0) for i in range(n))


def llama2c(dim, hidden, layers, heads, kv, vocab, seq):
    hs = dim // heads
    n = (abs(vocab) * dim + layers * dim + 2 * layers * dim * dim + 2 * layers * kv * hs * dim
         + layers * dim + 3 * layers * hidden * dim + dim + seq * hs + (abs(vocab) * dim if vocab < 0 else 0))
    return struct.pack("<7i", dim, hidden, layers, heads, kv, vocab, seq) + f32s(n)


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


# ggml block types: type id -> (elements per block, bytes per block)
BLOCKS = {2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 10: (256, 84), 11: (256, 110),
          12: (256, 144), 13: (256, 176), 14: (256, 210), 20: (32, 18), 23: (256, 136)}


def gguf(arch="llama", dim=8, hidden=8, layers=1, heads=2, kv=1, vocab=6, bias=False, tied=False, qtype=0,
         qk_norm=False):
    kvs = []

    def kv_u32(k, v):
        kvs.append(gstr(k) + struct.pack("<II", 4, v))

    def kv_f32(k, v):
        kvs.append(gstr(k) + struct.pack("<If", 6, v))

    kvs.append(gstr("general.architecture") + struct.pack("<I", 8) + gstr(arch))
    p = arch + "."
    kv_u32(p + "embedding_length", dim)
    kv_u32(p + "feed_forward_length", hidden)
    kv_u32(p + "block_count", layers)
    kv_u32(p + "attention.head_count", heads)
    kv_u32(p + "attention.head_count_kv", kv)
    kv_u32(p + "context_length", 16)
    kv_f32(p + "rope.freq_base", 10000.0)
    kv_f32(p + "attention.layer_norm_rms_epsilon", 1e-5)
    toks = ["<unk>", "<s>", "</s>", "\u2581", "\u2581a", "a"][:vocab]
    kvs.append(gstr("tokenizer.ggml.model") + struct.pack("<I", 8) + gstr("llama"))
    kvs.append(gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, len(toks)) + b"".join(gstr(t) for t in toks))
    kvs.append(gstr("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, len(toks))
               + b"".join(struct.pack("<f", -i) for i in range(len(toks))))
    kv_u32("tokenizer.ggml.bos_token_id", 1)
    kv_u32("tokenizer.ggml.eos_token_id", 2)
    hd = dim // heads
    tensors = [("token_embd.weight", [dim, vocab])]
    for l in range(layers):
        b = "blk.%d." % l
        tensors += [(b + "attn_norm.weight", [dim]), (b + "attn_q.weight", [dim, heads * hd]),
                    (b + "attn_k.weight", [dim, kv * hd]), (b + "attn_v.weight", [dim, kv * hd]),
                    (b + "attn_output.weight", [heads * hd, dim])]
        if bias:
            tensors += [(b + "attn_q.bias", [heads * hd]), (b + "attn_k.bias", [kv * hd]), (b + "attn_v.bias", [kv * hd])]
        if qk_norm:
            tensors += [(b + "attn_q_norm.weight", [hd]), (b + "attn_k_norm.weight", [hd])]
        tensors += [(b + "ffn_norm.weight", [dim]), (b + "ffn_gate.weight", [dim, hidden]),
                    (b + "ffn_down.weight", [hidden, dim]), (b + "ffn_up.weight", [dim, hidden])]
    tensors.append(("output_norm.weight", [dim]))
    if not tied:
        tensors.append(("output.weight", [dim, vocab]))
    infos, blobs, off = b"", [], 0
    for i, (name, dims) in enumerate(tensors):
        n = 1
        for d in dims:
            n *= d
        t = qtype if (len(dims) == 2 and i % 2 == 0) else 0
        if t == 1:
            data = b"".join(struct.pack("<H", 0x3C00 + (j % 7)) for j in range(n))
        elif t == 30:
            data = b"".join(struct.pack("<H", 0x3F80 + (j % 7)) for j in range(n))
        elif t in BLOCKS and dims[0] % BLOCKS[t][0] == 0:
            # blocks whose first two bytes (the fp16 scale d of every type but Q2_K..Q5_K, where it
            # follows the scales) are 1.0 and the rest small patterns: finite weights
            per, nb = BLOCKS[t]
            blk = bytes([0x00, 0x3C] + [(k * 37) & 0x77 for k in range(nb - 2)])
            data = blk * (n // per)
        else:
            t, data = 0, f32s(n, i)
        infos += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", t, off)
        blobs.append((off, data))
        off = (off + len(data) + 31) // 32 * 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + infos
    head += b"\0" * ((32 - len(head) % 32) % 32)
    body = bytearray()
    for o, d in blobs:
        body += b"\0" * (o - len(body)) + d
    return head + bytes(body)


def tokfile(pieces):
    out = struct.pack("<i", max(len(p) for p in pieces))
    for i, p in enumerate(pieces):
        out += struct.pack("<fi", -float(i), len(p)) + p
    return out


def main():
    out = sys.argv[1]
    data = sys.argv[2] if len(sys.argv) > 2 else None
    for d in ("llama2c", "gguf", "tokenizer"):
        os.makedirs(os.path.join(out, d), exist_ok=True)

    def w(d, name, b):
        with open(os.path.join(out, d, name), "wb") as f:
            f.write(b)

    w("llama2c", "raw_shared", b"\0" + llama2c(4, 4, 1, 2, 1, 3, 2))
    w("llama2c", "raw_unshared", b"\0" + llama2c(8, 6, 2, 4, 2, -5, 3))
    w("llama2c", "sized", b"\1" + llama2c(8, 6, 2, 4, 2, 5, 3)[:64])
    w("gguf", "llama_f32", gguf())
    w("gguf", "llama_f16", gguf(qtype=1))
    w("gguf", "llama_bf16_tied", gguf(qtype=30, tied=True))
    w("gguf", "qwen2", gguf(arch="qwen2", bias=True, tied=True))
    w("gguf", "qwen3", gguf(arch="qwen3", qk_norm=True))
    for t in (2, 3, 6, 7, 8, 20):
        w("gguf", "llama_q%d" % t, gguf(dim=32, hidden=32, heads=4, kv=2, qtype=t))
    for t in (10, 11, 12, 13, 14, 23):
        w("gguf", "llama_q%d" % t, gguf(dim=256, hidden=256, heads=4, kv=2, qtype=t))
    w("tokenizer", "text", b"\0Once upon a time, there was a little girl named Lily. \xe2\x82\xac\xf0\x9f\x98\x80 \x80")
    w("tokenizer", "tokfile", b"\1" + tokfile([b"<unk>", b"\n<s>\n", b"\n</s>\n", b" ", b"a", b" a", b"<0x41>"]))
    w("tokenizer", "vocab", b"\2" + b"\xff".join([b"<unk>", b"<s>", b"</s>", b"\xe2\x96\x81", b"a", b"\xe2\x96\x81a", b"<0x62>"])
      + b"\xfe" + b"a b a")
    w("tokenizer", "ids", b"\3" + b"1, 403 407\n261 378")
    # Byte-level BPE: the real vocabularies (0xF0 llama-bpe, 0xF2 qwen2, 0xF4 gpt-2; +1 with
    # special tokens), and a vocabulary built from the input (0xF8, then a byte picking the
    # pre-tokenizer, extra tokens, 0xFE, merges, 0xFD, text), one seed per pre-tokenizer name
    # (31 names). GPT-2 maps "h"->h, " "->\u0120 (C4 A0).
    for first, name in ((0xF0, "llama_bpe"), (0xF2, "qwen2"), (0xF4, "gpt2")):
        w("tokenizer", "bpe_%s_text" % name,
          bytes([first]) + b"Hello world! I'm 3.14159 sure\n\n\tit's \xe2\x82\xac\xf0\x9f\x98\x80 \x80\xc3(")
        w("tokenizer", "bpe_%s_special" % name, bytes([first + 1])
          + b"<|begin_of_text|>Hi <|eot_id|> there<|end_of_text|><|im_start|>user\n<|endoftext|>")
    body = (b"\xff".join([b"he", b"hel", b"hell", b"hello", b"\xc4\xa0w", b"<|x|>"])
            + b"\xfe" + b"\n".join([b"h e", b"he l", b"hel l", b"hell o", b"\xc4\xa0 w"])
            + b"\xfd" + b"hello world<|x|> 123 4567 \xe4\xbd\xa0\xe5\xa5\xbd it's \xff")
    for pre in range(31):
        w("tokenizer", "bpe_vocab%02d" % pre, b"\xf8" + bytes([pre]) + body)
    if data:
        p = os.path.join(data, "models", "stories260K", "tok512.bin")
        if os.path.exists(p):
            with open(p, "rb") as f:
                w("tokenizer", "tok512", b"\1" + f.read())
        # llama.cpp's own test cases of the three byte-level vocabularies, one seed each.
        for first, name in ((0xF0, "llama-bpe"), (0xF2, "qwen2"), (0xF4, "gpt-2")):
            p = os.path.join(data, "vocab", "ggml-vocab-%s.gguf.inp" % name)
            if os.path.exists(p):
                with open(p, "rb") as f:
                    cases = f.read().split(b"\n__ggml_vocab_test__\n")
                for i, c in enumerate(cases):
                    if c:
                        w("tokenizer", "bpe_%s_case%02d" % (name, i), bytes([first]) + c)


if __name__ == "__main__":
    main()
