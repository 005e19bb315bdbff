#!/usr/bin/env python3
"""depthkv's engine against Hugging Face's model on the same GGUF file and the same token ids.

transformers loads the GGUF file dequantized to float32 (LlamaForCausalLM for SmolLM2,
Gemma3ForCausalLM for Gemma 3); depthkv runs the quantized weights in place with int8
activations (build/release/benchmarks/reference_logits). Both get depthkv's token ids (the
Gemma 3 tokenizer transformers builds from the GGUF file is wrong).

  hf_parity.py --model M.gguf --text FILE [--positions 2048] [--prompts 5] [--steps 64]

prints (and with --json-out writes) per-position NLL of both, mean KL(HF || depthkv), top-1
agreement, and greedy continuations of --prompts prompts (cut from --prompt-text) for --steps
steps: equal tokens, or the first step where they differ with the gap between HF's top two
logits there (a difference inside the quantization error shows as a small gap).
Needs torch, transformers and gguf (python/requirements-hf.txt plus gguf).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
import numpy as np
import torch
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def depthkv_ids(cli, model, text_file):
    out = subprocess.run([cli, "tokenize", "-m", model, "--text-file", text_file, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def hf_model(path):
    m = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                             torch_dtype=torch.float32)
    m.eval()
    return m


def hf_greedy(model, ids, steps):
    """HF's greedy tokens and the logits of each step."""
    toks, rows = [], []
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1]
        for s in range(steps):
            t = int(torch.argmax(logits))
            toks.append(t)
            rows.append(logits.clone())
            if s + 1 < steps:
                out = model(torch.tensor([[t]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1]
    return toks, rows


def compare_logits(model, ids, ours, vocab, block=256):
    """Per-position NLL of both, KL(HF || depthkv) and top-1 agreement over positions 0..n-2
    (in blocks of rows: a 262K vocabulary in double is 2 MB a row)."""
    with torch.no_grad():
        ref_all = model(torch.tensor([ids])).logits[0]
    n = len(ids) - 1
    nll_ref, nll_got, kl, top1, swing = [], [], [], [], []
    for r0 in range(0, n, block):
        r1 = min(n, r0 + block)
        lr = torch.log_softmax(ref_all[r0:r1, :vocab].double(), -1)
        lg = torch.log_softmax(torch.from_numpy(np.asarray(ours[r0:r1, :vocab], dtype=np.float64)), -1)
        tgt = torch.tensor(ids[r0 + 1:r1 + 1])
        nll_ref.append(-lr.gather(1, tgt[:, None])[:, 0])
        nll_got.append(-lg.gather(1, tgt[:, None])[:, 0])
        kl.append((lr.exp() * (lr - lg)).sum(-1))
        top1.append((lr.argmax(-1) == lg.argmax(-1)).double())
        # how much the two disagree on the logit gap between HF's top two tokens a, b:
        # |(hf[a] - hf[b]) - (dk[a] - dk[b])|, the swing a near-tie can take
        ab = torch.topk(lr, 2, -1).indices
        d_ref = lr.gather(1, ab[:, :1]) - lr.gather(1, ab[:, 1:])
        d_got = lg.gather(1, ab[:, :1]) - lg.gather(1, ab[:, 1:])
        swing.append((d_ref - d_got).abs()[:, 0])
    nll_ref, nll_got, kl, top1, swing = (torch.cat(x) for x in (nll_ref, nll_got, kl, top1, swing))
    return {
        "positions": n,
        "nll_hf": float(nll_ref.mean()), "nll_depthkv": float(nll_got.mean()),
        "nll_abs_diff_mean": float((nll_ref - nll_got).abs().mean()),
        "nll_abs_diff_max": float((nll_ref - nll_got).abs().max()),
        "kl_mean": float(kl.mean()), "kl_p99": float(torch.quantile(kl, 0.99)), "kl_max": float(kl.max()),
        "top1_agreement": float(top1.mean()),
        "top2_swing_median": float(swing.median()), "top2_swing_p99": float(torch.quantile(swing, 0.99)),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True, help="real text: the first --positions tokens are compared")
    ap.add_argument("--prompt-text", help="text the greedy prompts are cut from (default: --text)")
    ap.add_argument("--positions", type=int, default=2048)
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default=os.path.join(ROOT, "build/release"))
    ap.add_argument("--json-out")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cli = os.path.join(a.build, "tools/depthkv")
    ref = os.path.join(a.build, "benchmarks/reference_logits")
    model = hf_model(a.model)
    vocab = model.config.vocab_size
    ids = depthkv_ids(cli, a.model, a.text)[: a.positions + 1]
    res = {"model": os.path.basename(a.model), "text": a.text}
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "ids"), "w") as f:
            f.write(" ".join(map(str, ids)))
        subprocess.run([ref, "--model", a.model, "--ids", os.path.join(tmp, "ids"), "--logits-out",
                        os.path.join(tmp, "logits"), "--threads", str(a.threads)], check=True, stdout=subprocess.DEVNULL)
        ours = np.memmap(os.path.join(tmp, "logits"), dtype=np.float32, mode="r").reshape(len(ids), -1)
        res["logits"] = compare_logits(model, ids, ours, min(vocab, ours.shape[1]))
        print(json.dumps(res["logits"]), flush=True)
        pids = depthkv_ids(cli, a.model, a.prompt_text or a.text)
        bos = [ids[0]] if ids and ids[0] == pids[0] else []
        stride = max(1, (len(pids) - 1) // max(1, a.prompts))
        prompts = [bos + pids[1 + i * stride: 1 + i * stride + a.prompt_len] for i in range(a.prompts)]
        with open(os.path.join(tmp, "prompts"), "w") as f:
            f.write("\n".join(" ".join(map(str, p)) for p in prompts) + "\n")
        out = subprocess.run([ref, "--model", a.model, "--prompts", os.path.join(tmp, "prompts"), "--greedy",
                              str(a.steps), "--threads", str(a.threads)], check=True, capture_output=True, text=True)
        ours_greedy = [json.loads(l) for l in out.stdout.splitlines() if l.strip()]
    res["greedy"] = []
    for p, g in zip(prompts, ours_greedy):
        toks, rows = hf_greedy(model, p, a.steps)
        first = next((i for i, (x, y) in enumerate(zip(toks, g["tokens"])) if x != y), None)
        row = {"prompt_tokens": len(p), "steps": a.steps, "equal_steps": a.steps if first is None else first}
        if first is not None:
            # the swing: how far the two implementations disagree on HF's top token a against
            # depthkv's b, (hf[a] - hf[b]) + (dk[b] - dk[a]) (a lower bound when a is not in
            # depthkv's top five)
            a_tok, b_tok = toks[first], g["tokens"][first]
            dk = {int(t): float(v) for t, v in g["top5"][first]}
            hf = rows[first]
            row["hf_gap_at_divergence"] = float(hf[a_tok] - hf[b_tok])
            swing = row["hf_gap_at_divergence"] + dk[b_tok] - dk.get(a_tok, min(dk.values()))
            row["swing"] = swing
            row["swing_exact"] = a_tok in dk
            row["within_quant_error"] = swing <= res["logits"]["top2_swing_p99"]
        res["greedy"].append(row)
        print(json.dumps(row), flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
