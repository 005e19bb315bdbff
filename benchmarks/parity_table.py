#!/usr/bin/env python3
"""The parity table of benchmarks/long_context_runs.sh's set D: depthkv (gguf_engine_bench --json)
against llama.cpp (llama-bench -o json, repacking off and on) on the same files, prefill and decode
tok/s at each thread count, and depthkv's ratio to each llama.cpp setting. Standard library only.

    python3 benchmarks/parity_table.py benchmarks/results/long_context/quiet [PROMPT]

PROMPT (default 512) picks the files of that prompt length (PARITY_PROMPT of the run script).
"""
import json
import os
import sys

TYPES = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")


def llama(path):
    """{(repack, 'pp'|'tg'): tok/s} of one llama-bench JSON file."""
    out = {}
    for t in json.load(open(path)):
        kind = "pp" if t["n_prompt"] > 0 else "tg"
        out[(bool(t["repack"]), kind)] = t["avg_ts"]
    return out


def main(d, prompt=512):
    sfx = "" if prompt == 512 else f"-p{prompt}"
    rows = [f"| type | threads | prefill {prompt} tok/s depthkv / llama.cpp repack off / on | ratio (off / on) | "
            "decode tok/s depthkv / llama.cpp off / on | ratio (off / on) |", "|---|---|---|---|---|---|"]
    for typ in TYPES:
        for t in (1, 2):
            dk_path, lc_path = (os.path.join(d, f"parity-{e}-{typ}-t{t}{sfx}.json") for e in ("depthkv", "llamacpp"))
            if not (os.path.exists(dk_path) and os.path.exists(lc_path)):
                continue
            dk, lc = json.load(open(dk_path)), llama(lc_path)
            cells = []
            for kind, key in (("pp", "prefill_tok_s"), ("tg", "decode_tok_s")):
                off, on = lc.get((False, kind)), lc.get((True, kind))
                fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731 (a setting not run)
                cells.append(f"{dk[key]:.1f} / {fmt(off, '.1f')} / {fmt(on, '.1f')}")
                cells.append(" / ".join("-" if v is None else f"{dk[key] / v:.2f}x" for v in (off, on)))
            rows.append(f"| {typ} | {t} | " + " | ".join(cells) + " |")
    print("\n".join(rows))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/long_context/quiet",
         int(sys.argv[2]) if len(sys.argv) > 2 else 512)
