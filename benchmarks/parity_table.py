#!/usr/bin/env python3
"""The parity table of benchmarks/long_context_runs.sh's set D: depthkv (gguf_engine_bench --json)
against llama.cpp (llama-bench -o json, repacking off and on) on the same files, prefill and decode
tok/s at each thread count, and depthkv's ratio to each llama.cpp setting. Standard library only.

    python3 benchmarks/parity_table.py benchmarks/results/long_context/quiet [PROMPT]
    python3 benchmarks/parity_table.py --real benchmarks/results/real_parity
    python3 benchmarks/parity_table.py --busy benchmarks/results/busy_decode

PROMPT (default 512) picks the files of that prompt length (PARITY_PROMPT of the run script).
--real: the files of benchmarks/real_parity.sh (the real models), with the same statistic on both
sides: the mean tok/s of the runs after the first (llama-bench's avg_ts after its warm-up run).
--busy: the files of benchmarks/busy_decode.sh (decode alone and beside a busy process), the same
statistic; the BASE build's column where its files are present.
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


REAL_MODELS = ("SmolLM2-135M-Instruct.Q4_1", "gemma-3-270m-q4_k_m")


def real_llama(d, stem):
    """{(repack, 'pp'|'tg'): mean tok/s} of real_parity.sh's llama-bench files for `stem` (a missing
    setting, e.g. a failed run, is absent)."""
    out = {}
    for rp in (0, 1):
        for kind in ("pp", "tg"):
            path = os.path.join(d, f"llamacpp-{stem}-repack{rp}-{kind}.json")
            if os.path.exists(path) and os.path.getsize(path) > 0:
                out[(bool(rp), kind)] = json.load(open(path))[0]["avg_ts"]
    return out


def real_table(d):
    rows = ["| model | prompt | threads | prefill tok/s depthkv / llama.cpp repack off / on | ratio (off / on) | "
            "decode tok/s at that depth, depthkv / llama.cpp off / on | ratio (off / on) |",
            "|---|---|---|---|---|---|---|"]
    for model in REAL_MODELS:
        for p in (512, 4096):
            for t in (1, 2):
                stem = f"{model}-p{p}-t{t}"
                dk_path = os.path.join(d, f"depthkv-{stem}.json")
                if not os.path.exists(dk_path):
                    continue
                dk, lc = json.load(open(dk_path)), real_llama(d, stem)
                cells = []
                for kind, key in (("pp", "prefill_runs"), ("tg", "decode_runs")):
                    runs = dk[key][1:]  # after the warm-up run
                    mean = sum(runs) / len(runs)
                    off, on = lc.get((False, kind)), lc.get((True, kind))
                    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731 (a setting that failed)
                    cells.append(f"{mean:.1f} / {fmt(off)} / {fmt(on)}")
                    cells.append(" / ".join("-" if v is None else f"{mean / v:.2f}x" for v in (off, on)))
                rows.append(f"| {model} | {p} | {t} | " + " | ".join(cells) + " |")
    print("\n".join(rows))


def mean_after_warmup(path, key):
    runs = json.load(open(path))[key][1:]
    return sum(runs) / len(runs)


def busy_table(d):
    rows = ["| model | threads | busy process | decode tok/s depthkv | base build | llama.cpp (repack 0) | "
            "depthkv / llama.cpp |", "|---|---|---|---|---|---|---|"]
    for model in REAL_MODELS:
        for busy in (0, 1):
            for t in (1, 2):
                stem = f"{model}-t{t}-busy{busy}"
                dk_path, base_path, lc_path = (os.path.join(d, f"{e}-{stem}.json") for e in ("depthkv", "base", "llamacpp"))
                if not os.path.exists(dk_path):
                    continue
                dk = mean_after_warmup(dk_path, "decode_runs")
                base = f"{mean_after_warmup(base_path, 'decode_runs'):.1f}" if os.path.exists(base_path) else "-"
                lc = json.load(open(lc_path))[0]["avg_ts"] if os.path.exists(lc_path) else None
                ratio = "-" if lc is None else f"{dk / lc:.2f}x"
                lcs = "-" if lc is None else f"{lc:.1f}"
                rows.append(f"| {model} | {t} | {'yes' if busy else 'no'} | {dk:.1f} | {base} | {lcs} | {ratio} |")
    print("\n".join(rows))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--busy":
        busy_table(sys.argv[2] if len(sys.argv) > 2 else "benchmarks/results/busy_decode")
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--real":
        real_table(sys.argv[2] if len(sys.argv) > 2 else "benchmarks/results/real_parity")
        sys.exit(0)
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/long_context/quiet",
         int(sys.argv[2]) if len(sys.argv) > 2 else 512)
