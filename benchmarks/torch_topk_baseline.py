#!/usr/bin/env python3
"""torch.topk + gather baseline (the way kvpress evicts) on the shapes of evict_cuda_bench.

Same method and output format as benchmarks/evict_cuda_bench.cu, so both can be compared in one
run: device-to-device copy bandwidth first (bytes read + written per second), then for
32 layers x 8 KV heads x {4K, 32K, 128K} tokens x head_dim 128 (bf16 K/V, float32 scores),
keep 10/20/50 %, uniform and layer-varying k: CUDA-event timing of select-only
(`scores.topk(k).indices`) and select+compact (topk, then `keys.gather` / `values.gather` of the
kept rows, as kvpress does; kvpress does not sort the indices, so neither do we), warm-up runs,
then the median of --runs runs, with fresh random scores before every run (not timed).
Bytes moved = score bytes + 2 x kept K/V bytes; ideal time = bytes / copy bandwidth.

Usage: python3 benchmarks/torch_topk_baseline.py [--tokens 4096,32768,131072] [--runs 15]
"""

import argparse
import statistics
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="4096,32768,131072")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        print("SKIP: torch is not installed")
        return 77
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device visible to torch")
        return 77

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    L, H, hd = args.layers, args.heads, args.head_dim
    print(f"# torch_topk_baseline: {props.name}, {props.multi_processor_count} SMs, "
          f"{props.total_memory / 2**30:.1f} GiB, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"# shape: {L} layers x {H} KV heads x head_dim {hd}, bf16 K/V, float scores; "
          f"median of {args.runs} runs after {args.warmup} warm-up, fresh scores per run")

    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)

    def timed(fn, regen):
        times = []
        for r in range(args.warmup + args.runs):
            regen()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            if r >= args.warmup:
                times.append(start.elapsed_time(stop) * 1e-3)
        return statistics.median(times)

    # 1. copy bandwidth
    nbytes = 1 << 30
    a = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    t = timed(lambda: b.copy_(a), lambda: None)
    copy_bw = 2.0 * nbytes / t
    print(f"copy: tensor.copy_ D2D {nbytes / 2**30:.2f} GiB, median {t * 1e3:.3f} ms, "
          f"{copy_bw * 1e-9:.1f} GB/s (read + write)")
    del a, b

    tokens = sorted(int(x) for x in args.tokens.split(",") if x)
    print(f"{'impl':<8} {'mode':<15} {'tokens':>7} {'keep':>5} {'k':<7} {'time_ms':>10} {'bytes_GB':>9} "
          f"{'eff_GBps':>9} {'frac_copy':>10} {'x_ideal':>8}  path")
    for n in tokens:
        try:
            keys = torch.empty((L, H, n, hd), dtype=torch.bfloat16, device=dev).normal_()
            values = torch.empty_like(keys).normal_()
            scores = torch.empty((L, H, n), dtype=torch.float32, device=dev)
        except torch.cuda.OutOfMemoryError:
            print(f"# skipping {n} tokens: out of memory")
            continue

        def regen():
            scores.uniform_(1e-6, 1.0)

        for keep in (0.10, 0.20, 0.50):
            for varying in (False, True):
                if varying:
                    ks = [min(n, int(keep * (0.5 + (l / (L - 1) if L > 1 else 0.5)) * n + 0.5)) for l in range(L)]
                else:
                    ks = [min(n, int(keep * n + 0.5))] * L
                kept_tokens = sum(ks) * H
                for compact in (False, True):
                    if not varying:
                        k = ks[0]
                        if compact:
                            def fn():
                                idx = scores.topk(k, dim=-1).indices.unsqueeze(-1).expand(-1, -1, -1, hd)
                                return keys.gather(2, idx), values.gather(2, idx)
                        else:
                            def fn():
                                return scores.topk(k, dim=-1).indices
                    else:
                        if compact:
                            def fn():
                                out = []
                                for l in range(L):
                                    idx = scores[l].topk(ks[l], dim=-1).indices.unsqueeze(-1).expand(-1, -1, hd)
                                    out.append((keys[l].gather(1, idx), values[l].gather(1, idx)))
                                return out
                        else:
                            def fn():
                                return [scores[l].topk(ks[l], dim=-1).indices for l in range(L)]
                    try:
                        tm = timed(fn, regen)
                    except torch.cuda.OutOfMemoryError:
                        print(f"# out of memory at {n} tokens keep {keep}")
                        torch.cuda.empty_cache()
                        continue
                    nbytes = L * H * n * 4.0 + (2.0 * kept_tokens * hd * 2 * 2 if compact else 0.0)
                    eff = nbytes / tm
                    mode = "select+compact" if compact else "select-only"
                    kname = "layer" if varying else "uniform"
                    print(f"{'torch':<8} {mode:<15} {n:>7} {keep * 100:>4.0f}% {kname:<7} {tm * 1e3:>10.4f} "
                          f"{nbytes * 1e-9:>9.4f} {eff * 1e-9:>9.1f} {eff / copy_bw:>10.3f} "
                          f"{tm / (nbytes / copy_bw):>8.2f}  topk+gather")
                    sys.stdout.flush()
                    torch.cuda.empty_cache()
        del keys, values, scores
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
