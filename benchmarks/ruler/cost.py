"""The prefill cost of scoring and of the preset's extra work on depthkv's engine, at one context
length: a RULER sample's context (niah_single_1, report seed 1000) through ``Engine.generate``
with one new token, per method the median wall time of --repeat runs (each run one prefill):

  full     no spec (the plain prefill);
  snapkv   SnapKV keep 0.5 (the prompt's attention observed: the last obs_window rows);
  preset   ``--preset best`` keep 0.5 (its scorers, the per-input rule, the 32-token lookahead
           and output-aware norms), with its lookahead's share from the driver's report.

  python benchmarks/ruler/cost.py --model SmolLM2.gguf --best-profile docs/results/smollm2.best.profile.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import depthkv  # noqa: E402
from run import SELECTION  # noqa: E402
from tasks import REPORT_SEEDS, make_sample  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--best-profile", required=True)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    eng = depthkv.Engine(a.model, n_threads=a.threads)
    s = make_sample("niah_single_1", a.length, REPORT_SEEDS[0], lambda t: len(eng.tokenize(t)))
    ctx = eng.tokenize(s["context"])
    best = depthkv.load_profile(a.best_profile)
    snap = dict(SELECTION, scorer="snapkv", policy="uniform", budget={"keep": 0.5})
    preset = depthkv.preset("best", best, keep=0.5, lengths=len(ctx), protection=(SELECTION["sinks"],
                            SELECTION["recent"]), obs_window=SELECTION["obs_window"])
    runs = {"full": {}, "snapkv": {"spec": snap}, "preset": {"spec": preset, "profile": best, "preset": "best"}}
    times = {m: [] for m in runs}
    lookahead = []
    for _ in range(a.repeat):
        for m, kw in runs.items():
            t0 = time.perf_counter()
            g = eng.generate(ctx, 1, **kw)
            times[m].append(time.perf_counter() - t0)
            if m == "preset":
                lookahead.append(g.report["lookahead_ms"] / 1e3)
    base = statistics.median(times["full"])
    print(f"{os.path.basename(a.model)}, {len(ctx)} context tokens, {a.threads} threads, median of {a.repeat} runs "
          f"(each: one prefill and one new token)\n")
    print("| method | seconds | x the plain prefill |\n|---|---|---|")
    for m in runs:
        t = statistics.median(times[m])
        print(f"| {m} | {t:.2f} | {t / base:.2f} |")
    la = statistics.median(lookahead)
    print(f"\nthe preset's lookahead: {la:.2f} s = {100 * la / base:.0f}% of the plain prefill; its extra work "
          f"in all: {100 * (statistics.median(times['preset']) - base) / base:.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
