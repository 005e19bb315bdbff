#!/usr/bin/env python3
"""Decode tok/s and peak memory against the context length, one line per mode, from the --json
files of benchmarks/long_context_bench (full cache, keep R) and of
benchmarks/llamacpp_check/run.py --contexts (llama.cpp's full cache).

Writes OUT.dat (one gnuplot block per mode: context, decode tok/s, peak RSS MiB, peak KV MiB,
decode tok/s of the fastest window of consecutive steps (`decode_tok_s_best_window`; --window
plots it instead of the mean, which other processes' load disturbs more)),
OUT.gp (the gnuplot script; it reads OUT.dat) and, when gnuplot is found, OUT.svg (or the
--terminal's file); prints a Markdown table with each keep run's measured decode speedup over the
full cache of the same context and the work bound (bytes-only .. FLOPs-only) it reaches.
Standard library only:

    python3 benchmarks/long_context_plot.py benchmarks/results/long_context/*.json \\
        --out docs/results/long_context --title "Qwen2.5-0.5B shape, Q8_0, 2 threads"
"""

import argparse
import json
import os
import shutil
import subprocess
import sys


def mode_of(r):
    if r.get("engine") == "llama.cpp":
        return "llama.cpp full"
    return "full" if r["mode"] == "full" else "keep %g" % r["keep"]


def load(paths):
    runs = {}
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        runs[(mode_of(r), r["context"])] = r  # the last file of a cell wins
    return runs


def order(mode):
    if mode == "full":
        return (0, 0)
    if mode.startswith("keep"):
        return (1, -float(mode.split()[1]))
    return (2, 0)


def write_dat(runs, modes, path):
    with open(path, "w") as f:
        f.write("# context decode_tok_s peak_rss_mib peak_kv_mib decode_tok_s_best_window; one block per mode: %s\n"
                % ", ".join(modes))
        for m in modes:
            f.write("# %s\n" % m)
            for ctx in sorted(c for (mm, c) in runs if mm == m):
                r = runs[(m, ctx)]
                kv = r.get("kv_peak_bytes", 0) / 1048576.0
                win = r.get("decode_tok_s_best_window", r["decode_tok_s"])
                f.write("%d %.4f %.1f %.2f %.4f\n" % (ctx, r["decode_tok_s"], r["peak_rss_mb"], kv, win))
            f.write("\n\n")


def write_gp(modes, contexts, dat, out, terminal, title, window):
    ext = "png" if terminal.startswith("png") else "svg"
    size = "1800,560" if ext == "png" else "1500,480"
    lines = [
        'set terminal %s size %s noenhanced font "sans,11" background rgb "white"' % (terminal, size),
        'set output "%s.%s"' % (out, ext),
        'set multiplot layout 1,3 title "%s"' % title,
        "set logscale x 2",
        "set xrange [%d:%d]" % (min(contexts) * 0.83, max(contexts) * 1.22),  # the runs' contexts
        "set xtics (%s)" % ", ".join(str(c) for c in contexts),
        'set xlabel "context tokens"',
        "set key below horizontal",  # under each panel: never over the data
        "set grid",
        "set yrange [0:*]",
    ]
    def plot(col, ylabel, ptitle):
        parts = []
        for i, m in enumerate(modes):
            parts.append('%s index %d using 1:%d with linespoints title "%s"' % ('"%s"' % dat if i == 0 else '""', i, col, m))
        return ['set ylabel "%s"' % ylabel, 'set title "%s"' % ptitle, "plot " + ", ".join(parts)]
    lines += plot(5 if window else 2, "decode tokens/s",
                  "decode speed after the context" + (" (fastest window of steps)" if window else ""))
    lines += plot(3, "peak RSS MiB", "peak resident memory")
    lines += plot(4, "peak KV MiB", "peak KV cache bytes")
    lines.append("unset multiplot")
    with open(out + ".gp", "w") as f:
        f.write("\n".join(lines) + "\n")
    return out + "." + ext


def table(runs):
    out = ["| context | mode | decode tok/s (fastest window) | measured speedup over full | bound (bytes .. FLOPs) | measured / bytes bound "
           "| peak RSS MiB | KV peak / end MiB | scoring+alloc+evict, % of decode |",
           "|---|---|---|---|---|---|---|---|---|"]
    for (m, ctx) in sorted(runs, key=lambda k: (k[1], order(k[0]))):
        r = runs[(m, ctx)]
        full = runs.get(("full", ctx))
        meas = r["decode_tok_s"] / full["decode_tok_s"] if full else None
        if r.get("engine") == "llama.cpp":
            bound = "-"
            frac = "-"
            kv = "-"
            over = "-"
        else:
            bound = "%.2f .. %.2f" % (r["bound_speedup_bytes"], r["bound_speedup_flops"])
            frac = "%.2f" % (meas / r["bound_speedup_bytes"]) if meas else "-"
            kv = "%.1f / %.1f" % (r["kv_peak_bytes"] / 1048576.0, r["kv_end_bytes"] / 1048576.0)
            over = "%.1f" % (100 * r["decode_overhead_fraction"])
        out.append("| %d | %s | %.2f (%.2f) | %s | %s | %s | %.0f | %s | %s |" % (
            ctx, m, r["decode_tok_s"], r.get("decode_tok_s_best_window", float("nan")), "%.2fx" % meas if meas else "-", bound, frac, r["peak_rss_mb"], kv, over))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="--json files of long_context_bench and llamacpp_check --contexts")
    ap.add_argument("--out", default="docs/results/long_context", help="path without extension")
    ap.add_argument("--title", default="decode speed and peak memory against the context")
    ap.add_argument("--terminal", default="svg", help="gnuplot terminal: svg, png or pngcairo")
    ap.add_argument("--window", action="store_true", help="plot decode_tok_s_best_window instead of decode_tok_s")
    a = ap.parse_args()
    runs = load(a.json)
    modes = sorted({m for (m, _) in runs}, key=order)
    dat = a.out + ".dat"
    write_dat(runs, modes, dat)
    contexts = sorted({c for (_, c) in runs})
    image = write_gp(modes, contexts, dat, a.out, a.terminal, a.title, a.window)
    print(table(runs))
    if shutil.which("gnuplot"):
        subprocess.run(["gnuplot", a.out + ".gp"], check=True)
        print("wrote", image, file=sys.stderr)
    else:
        print("gnuplot not found: run gnuplot %s.gp" % a.out, file=sys.stderr)


if __name__ == "__main__":
    main()
