#!/usr/bin/env python3
"""The table of benchmarks/real_long_context.sh's runs (standard library only).

Usage: real_long_context_table.py OUT [--md]

Also writes OUT/llamacpp-MODEL-CONTEXT.record.json, llama.cpp's figures in the form
benchmarks/long_context_plot.py reads beside long_context_bench's --json files.

Per model and context: prefill tok/s (depthkv full cache against llama.cpp from an empty cache),
decode tok/s at the end of the context (depthkv full / keep 0.2 / keep 0.1, llama.cpp full), peak
RSS in MiB and KV bytes in MiB (depthkv: at the peak, before an eviction, and at the end; llama.cpp:
the cells it allocates, from its log), and the ratios the issue's targets read: keep 0.1's decode
over llama.cpp's full cache, and keep 0.1's peak RSS over llama.cpp's.
"""
import glob
import json
import os
import re
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def llamacpp(out, name, ctx):
    pre = load(os.path.join(out, "llamacpp-%s-prefill-%d.json" % (name, ctx)))[0]
    dec = load(os.path.join(out, "llamacpp-%s-decode-%d.json" % (name, ctx)))[0]
    with open(os.path.join(out, "llamacpp-%s-decode-%d.log" % (name, ctx))) as f:
        log = f.read()
    kv = sum(float(x) for x in re.findall(r"llama_kv_cache: size = *([0-9.]+) MiB", log))
    rss = int(re.findall(r"MAXRSS_KB (\d+)", log)[-1]) / 1024.0
    return dict(prefill=pre["avg_ts"], decode=dec["avg_ts"], rss=rss, kv=kv, build=dec.get("build_commit", ""))


def main():
    out = sys.argv[1]
    md = "--md" in sys.argv
    rows = []
    for name in ("smollm2", "gemma3"):
        ctxs = sorted({int(m.group(1)) for p in glob.glob(os.path.join(out, "depthkv-%s-keep1-*.json" % name))
                       for m in [re.search(r"-(\d+)\.json$", p)]})
        for ctx in ctxs:
            try:
                d = {k: load(os.path.join(out, "depthkv-%s-keep%s-%d.json" % (name, k, ctx))) for k in ("1", "0.2", "0.1")}
                lc = llamacpp(out, name, ctx)
            except (OSError, ValueError, IndexError) as e:  # a run missing or not finished
                print("real_long_context_table: %s %d left out: %s" % (name, ctx, e), file=sys.stderr)
                continue
            with open(os.path.join(out, "llamacpp-%s-%d.record.json" % (name, ctx)), "w") as f:
                json.dump(dict(engine="llama.cpp", mode="full", keep=1.0, context=ctx, decode_tok_s=lc["decode"],
                               decode_tok_s_best_window=lc["decode"], peak_rss_mb=lc["rss"],
                               kv_peak_bytes=lc["kv"] * 1048576.0, kv_end_bytes=lc["kv"] * 1048576.0,
                               llama_cpp_build=lc["build"], repack=False), f)
            mib = 1048576.0
            rows.append([name, ctx, "%.0f" % d["1"]["prefill_tok_s"], "%.0f" % lc["prefill"],
                         "%.2fx" % (d["1"]["prefill_tok_s"] / lc["prefill"]),
                         "%.1f / %.1f / %.1f" % tuple(d[k]["decode_tok_s"] for k in ("1", "0.2", "0.1")),
                         "%.1f" % lc["decode"], "%.2fx" % (d["0.1"]["decode_tok_s"] / lc["decode"]),
                         "%.0f / %.0f / %.0f" % tuple(d[k]["peak_rss_mb"] for k in ("1", "0.2", "0.1")),
                         "%.0f" % lc["rss"], "%.2fx" % (d["0.1"]["peak_rss_mb"] / lc["rss"]),
                         "%.1f / %.1f (%.1f / %.1f)" % (d["1"]["kv_peak_bytes"] / mib, d["0.1"]["kv_peak_bytes"] / mib,
                                                       d["1"]["kv_end_bytes"] / mib, d["0.1"]["kv_end_bytes"] / mib),
                         "%.1f" % lc["kv"]])
    head = ["model", "context", "prefill depthkv", "prefill llama.cpp", "ratio", "decode depthkv full / 0.2 / 0.1",
            "decode llama.cpp", "0.1 / llama.cpp", "peak RSS MiB full / 0.2 / 0.1", "RSS llama.cpp",
            "0.1 / llama.cpp", "KV MiB peak full / 0.1 (end)", "KV MiB llama.cpp"]
    if md:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(str(x) for x in r) + " |")
    else:
        print("\t".join(head))
        for r in rows:
            print("\t".join(str(x) for x in r))


if __name__ == "__main__":
    main()
