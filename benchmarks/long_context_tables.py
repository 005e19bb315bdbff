#!/usr/bin/env python3
"""The tables of benchmarks/long_context_runs.sh's sets B (decode against the work bound), C (a
real 16K prefill) and E (OpenMP's wait policy), from the --json files in one folder (set A:
benchmarks/long_context_plot.py; set D: benchmarks/parity_table.py). Standard library only.

    python3 benchmarks/long_context_tables.py benchmarks/results/long_context/quiet
"""
import glob
import json
import os
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def bound_table(d):
    """Set B: each keep 0.1 run against its own full cache at the same shape, type and context."""
    out = ["| shape | type | context | scorer | full tok/s | keep 0.1 tok/s | measured speedup | bound (bytes .. FLOPs) | "
           "measured / bytes bound | scoring+alloc+evict, % of decode | peak RSS full / keep 0.1 MiB |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in sorted(glob.glob(os.path.join(d, "bound-*-keep0.1*.json"))):
        k = load(p)
        base = os.path.basename(p).replace("keep0.1-preset", "keep1").replace("keep0.1", "keep1")
        fp = os.path.join(d, base)
        if not os.path.exists(fp):
            continue
        f = load(fp)
        sp = k["decode_tok_s"] / f["decode_tok_s"]
        out.append(f"| {k['shape']} | {k['type']} | {k['context']} | {k['scorer']} | {f['decode_tok_s']:.2f} | "
                   f"{k['decode_tok_s']:.2f} | {sp:.2f}x | {k['bound_speedup_bytes']:.2f} .. "
                   f"{k['bound_speedup_flops']:.2f} | {sp / k['bound_speedup_bytes']:.2f} | "
                   f"{100 * k['decode_overhead_fraction']:.1f} | {f['peak_rss_mb']:.0f} / {k['peak_rss_mb']:.0f} |")
    return out


def prefill_table(d):
    """Set C: the real prefill of the full cache against keep 0.1's chunked eviction."""
    runs = {r["keep"]: r for r in (load(p) for p in glob.glob(os.path.join(d, "prefill-*.json")))}
    if 1.0 not in runs or 0.1 not in runs:
        return []
    f, k = runs[1.0], runs[0.1]
    return ["| run | prefill tok/s | prefill s | peak KV MiB | peak RSS MiB | scoring+alloc+evict, % of prefill |",
            "|---|---|---|---|---|---|"] + [
        f"| {name} | {r['prefill_tok_s']:.1f} | {r['prefill_s']:.1f} | {r['kv_peak_bytes'] / 2**20:.1f} | "
        f"{r['peak_rss_mb']:.0f} | {100 * r['prefill_overhead_fraction']:.1f} |" for name, r in
        (("full cache", f), ("keep 0.1 (chunked, interval 32)", k))] + [
        "", f"keep 0.1 / full prefill speed: {k['prefill_tok_s'] / f['prefill_tok_s']:.2f}x "
            f"(context {f['context']}, {f['shape']} {f['type']}, {f['threads']} threads)"]


def wait_table(d):
    """Set E: decode and prefill tok/s with OMP_WAIT_POLICY unset / passive, quiet and beside a busy process."""
    out = ["| beside | depthkv prefill / decode tok/s (OMP_WAIT_POLICY unset) | depthkv, passive | "
           "llama.cpp prefill / decode tok/s |", "|---|---|---|---|"]
    for hog, label in (("none", "nothing (quiet)"), ("one", "one busy process")):
        cells = []
        for pol in ("default", "passive"):
            p = os.path.join(d, f"wait-depthkv-{pol}-hog{hog}.json")
            if not os.path.exists(p):
                return []
            r = load(p)
            cells.append(f"{r['prefill_tok_s']:.1f} / {r['decode_tok_s']:.1f}")
        lc = {("pp" if t["n_prompt"] > 0 else "tg"): t["avg_ts"] for t in load(os.path.join(d, f"wait-llamacpp-hog{hog}.json"))}
        cells.append(f"{lc['pp']:.1f} / {lc['tg']:.1f}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


def main(d):
    for title, rows in (("Set B: decode against the work bound", bound_table(d)),
                        ("Set C: a real prefill with and without chunked eviction", prefill_table(d)),
                        ("Set E: OpenMP's wait policy", wait_table(d))):
        if rows:
            print(f"### {title}\n")
            print("\n".join(rows) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/long_context/quiet")
