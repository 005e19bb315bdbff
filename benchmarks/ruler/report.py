"""Tables and the plot of RULER-style results (run.py's depthkv rows, kvpress_run.py's kvpress rows).

  python benchmarks/ruler/report.py [--tasks T1,T2] --out docs/results/ruler/smollm2.4k.outside A.json B.json ...

writes OUT.md: per task and method the mean score +- its standard error at each compression
(run.py's table of all files' rows), then the mean over the tasks (each task's mean, averaged;
its standard error combines the tasks' standard errors); and OUT.svg (gnuplot): the mean over
the tasks against the compression, one line per method, at most 8 per panel: depthkv's methods,
then kvpress's presses beside depthkv's preset and the full cache. The files must be of one
model, protocol and seed range.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import METHODS, method_order, table  # noqa: E402

MAX_SERIES = 8


def load(paths) -> dict:
    """One result of the rows of several files of one model, protocol and seed range."""
    results = [json.load(open(p)) for p in paths]
    key = lambda r: (r["model"], r["protocol"], r["seeds"])  # noqa: E731
    for p, r in zip(paths, results):
        if key(r) != key(results[0]):
            sys.exit(f"report: {p} is of another model, protocol or seed range than {paths[0]}")
    return dict(results[0], rows=[row for r in results for row in r["rows"]])


def task_means(rows):
    """{(length, method, compression): {task: (mean, standard error, n)}}; the full cache's row
    (compression 0) stands at every compression."""
    comps = sorted({r["compression"] for r in rows if r["compression"] > 0})
    cells = defaultdict(list)
    for r in rows:
        for c in (comps if r["compression"] == 0 else [r["compression"]]):
            cells[(r["length"], r["method"], c, r["task"])].append(r["score"])
    out = defaultdict(dict)
    for (length, method, c, task), v in cells.items():
        n = len(v)
        m = sum(v) / n
        se = math.sqrt(sum((x - m) ** 2 for x in v) / (n - 1) / n) if n > 1 else 0.0
        out[(length, method, c)][task] = (m, se, n)
    return out, comps


def summary(result: dict) -> str:
    """Markdown: per length and method the mean over the tasks at each compression."""
    means, comps = task_means(result["rows"])
    tasks = sorted({r["task"] for r in result["rows"]})
    out = [f"Mean over the {len(tasks)} tasks ({', '.join(tasks)}) of each task's mean score, +- the combined "
           "standard error; a method without every task at a compression shows nothing there", "",
           "| length | method | " + " | ".join(f"c={c:g}" for c in comps) + " |", "|" + "---|" * (2 + len(comps))]
    for length, method in sorted({(k[0], k[1]) for k in means}, key=lambda k: (k[0], method_order(k[1]))):
        cells = []
        for c in comps:
            t = means.get((length, method, c), {})
            if len(t) < len(tasks):
                cells.append("")
                continue
            m = sum(v[0] for v in t.values()) / len(t)
            se = math.sqrt(sum(v[1] ** 2 for v in t.values())) / len(t)
            cells.append(f"{m:.1f} +- {se:.1f}")
        out.append(f"| {length} | {method} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def series(result: dict, length: int):
    """{method: [(compression, mean over tasks)]} for the methods with every task at every compression."""
    means, comps = task_means(result["rows"])
    tasks = {r["task"] for r in result["rows"]}
    out = {}
    for method in {k[1] for k in means if k[0] == length}:
        pts = []
        for c in comps:
            t = means.get((length, method, c), {})
            if len(t) == len(tasks):
                pts.append((c, sum(v[0] for v in t.values()) / len(t)))
        if len(pts) == len(comps):
            out[method] = pts
    return out


def plot(result: dict, out: str) -> None:
    """OUT.svg and OUT.svg.gp: per length two panels (depthkv's methods; kvpress's presses beside
    the preset and the full cache), at most 8 series each, legends below the plot area."""
    lengths = sorted({r["length"] for r in result["rows"]})
    panels = []
    for length in lengths:
        s = series(result, length)
        ours = sorted((m for m in s if m in METHODS), key=method_order)[:MAX_SERIES]
        theirs = sorted((m for m in s if m not in METHODS and not m.endswith("-full")),  # "full" stands for both
                        key=lambda m: -sum(v for _, v in s[m]))
        anchor = [m for m in ("full", "preset") if m in s]
        theirs = theirs[:MAX_SERIES - len(anchor)] + anchor
        panels.append((f"{result['model']} {length} tokens: depthkv", ours, s))
        if len(theirs) > len(anchor):
            panels.append((f"{result['model']} {length} tokens: kvpress presses, depthkv preset, full cache", theirs, s))
    name = os.path.basename(out)
    style = {"full": "lp lw 2 dt 2 pt 1 lc rgb 'gray40'", "preset": "lp lw 3 pt 7 ps 1.2 lc rgb 'black'"}
    cols = min(2, len(panels))
    rows = (len(panels) + cols - 1) // cols
    comps = sorted({r["compression"] for r in result["rows"] if r["compression"] > 0})
    gp = [f"set terminal svg size {700 * cols + 100},{560 * rows} dynamic noenhanced font 'sans,11' "
          "background rgb 'white'", f"set output '{name}.svg'",
          f"set xrange [{min(comps) - 0.03}:{max(comps) + 0.03}]",
          f"set multiplot layout {rows},{cols} title 'RULER-style tasks, {result['protocol']} protocol: "
          f"mean string_match_all x 100 over the tasks against compression (every cell: {name}.md)'",
          "set xlabel 'compression (fraction of the context removed)'", "set ylabel 'mean score'",
          "set yrange [-5:105]", "set key below Left reverse horizontal maxcols 4 font ',9'", "set grid"]
    data = []
    for title, methods, s in panels:
        cmds = []
        for i, m in enumerate(methods):
            idx = len(data)
            data.append((f"{title} | {m}", s[m]))
            st = style.get(m, f"lp lw 2 pt {4 + i} dt {1 if m in METHODS else 3}")
            cmds.append(f"'{name}.dat' index {idx} with {st} title '{m}'")
        assert len(cmds) <= MAX_SERIES, title
        gp += [f"set title '{title}'", "plot " + ", ".join(cmds)]
    gp.append("unset multiplot")
    with open(out + ".dat", "w") as f:
        for label, pts in data:
            f.write(f"# {label}\n" + "".join(f"{c} {v}\n" for c, v in pts) + "\n\n")
    with open(out + ".svg.gp", "w") as f:
        f.write("\n".join(gp) + "\n")
    subprocess.run(["gnuplot", name + ".svg.gp"], check=True, cwd=os.path.dirname(out) or ".")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="OUT.md and OUT.svg (no extension)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--tasks", type=lambda s: s.split(","), help="only these tasks' rows (default: all)")
    p.add_argument("files", nargs="+")
    a = p.parse_args(argv)
    result = load(a.files)
    if a.tasks:
        result["rows"] = [r for r in result["rows"] if r["task"] in a.tasks]
    with open(a.out + ".md", "w") as f:
        f.write(table(result) + "\n" + summary(result))
    if not a.no_plot:
        plot(result, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
