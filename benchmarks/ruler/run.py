"""The RULER-style suite on depthkv's engine (``depthkv.Engine``, the library's driver).

For every sample (benchmarks/ruler/tasks.py, sized in the model's own tokens), the context is
prefilled once (``Engine.generate_many``); every method and compression ratio prunes its own copy
of that cache (the chunked schedule, which evicts during its prefill, prefills on its own). Then
(protocol ``outside``, kvpress's query-agnostic one) the question and answer prefix follow
uncompressed (``suffix_ids``), or (protocol ``inside``) the question is part of the pruned prompt,
as ``depthkv generate`` prunes a whole prompt; then greedy decoding. Scored by ``string_match_all`` x 100; the table gives each
cell's mean and its standard error over the samples.

Methods (4 sink and 16 recent tokens, observation window 16, kernel 7, max pooling):
  full      the full cache;
  snapkv    SnapKV, uniform budgets;
  tova      TOVA (the last context position's attention), uniform budgets;
  keydiff   KeyDiff (each key's cosine distance from the head's mean key direction), uniform budgets;
  snapkv-keydiff  the larger of each slot's SnapKV and KeyDiff rank fractions, uniform budgets;
  optimal   SnapKV, depthkv's per-layer budgets (a --profile with SnapKV curves);
  keydiff-optimal, snapkv-keydiff-optimal  those scorers with depthkv's per-layer budgets (a
            --profile with their curves);
  preset    ``--preset best`` (--best-profile: head curves; the per-input rule inside);
  retrieval ``--preset retrieval`` (--retrieval-profile: snapkv-keydiff head curves; the rule inside);
  retrieval-fF  "retrieval" with each KV head's floor at F times the uniform per-layer budget
            instead of the preset's 0.5 (F = 0: the automatic floor alone), the study that chose it;
  chunked   SnapKV uniform, evicting after every 512-token prefill chunk to the same budget;
  *-span    the same with span pooling (``span_pooling``: each word and digit run of the context
            scored as its best token, kept or dropped whole).

  python benchmarks/ruler/run.py --model SmolLM2.gguf --lengths 2048 --samples 4 \\
      --profile docs/results/smollm2.profile.json --best-profile docs/results/smollm2.best.profile.json

Seeds: --seeds report (1000..) for figures, calibration (0..) for choices; never both.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import depthkv  # noqa: E402
from tasks import CALIBRATION_SEEDS, REPORT_SEEDS, TASKS, make_sample, string_match_all  # noqa: E402

#: Tokens generated per task (enough for the answers in the tokenizers of the reference models).
MAX_NEW = {"niah_single_1": 24, "niah_single_2": 24, "niah_multikey_1": 24, "niah_multivalue": 64,
           "niah_multiquery": 64, "vt": 40, "cwe": 96}
METHODS = ("full", "snapkv", "snapkv-span", "tova", "keydiff", "snapkv-keydiff", "optimal", "keydiff-optimal",
           "snapkv-keydiff-optimal", "preset", "preset-span", "retrieval", "chunked")
#: The floors of the study behind "retrieval"'s (method retrieval-fF).
RETRIEVAL_FLOORS = ("0", "0.25", "0.75")
SELECTION = {"sinks": 4, "recent": 16, "obs_window": 16, "kernel": 7, "pooling": "max"}


def method_spec(method: str, keep: float, n_context: int, profiles, best_profile):
    """(spec, profile, preset) of `method` at keep ratio `keep` for a context of `n_context` tokens
    (`profiles`: {scorer: the first --profile with its curves})."""
    if method == "full":
        return None, None, None
    if method.endswith("-span"):
        spec, prof, preset = method_spec(method[: -len("-span")], keep, n_context, profiles, best_profile)
        return dict(spec, span_pooling=True), prof, preset
    base = dict(SELECTION, scorer="snapkv", budget={"keep": keep})
    if method == "snapkv":
        return dict(base, policy="uniform"), None, None
    if method in ("tova", "keydiff", "snapkv-keydiff"):
        return dict(base, scorer=method, policy="uniform"), None, None
    if method.endswith("optimal"):
        scorer = "snapkv" if method == "optimal" else method[: -len("-optimal")]
        return dict(base, scorer=scorer, policy="optimal"), profiles[scorer], None
    if method == "chunked":
        return (dict(base, policy="uniform", budget={"tokens": max(1, round(keep * n_context))},
                     schedule={"mode": "chunked", "chunk": 512, "interval": 512}), None, None)
    if method in ("preset", "retrieval"):
        name, prof = ("best", best_profile) if method == "preset" else ("retrieval", profiles["retrieval"])
        spec = depthkv.preset(name, prof, keep=keep, lengths=n_context,
                              protection=(SELECTION["sinks"], SELECTION["recent"]), obs_window=SELECTION["obs_window"])
        return spec, prof, name
    if method.startswith("retrieval-f"):
        spec, prof, name = method_spec("retrieval", keep, n_context, profiles, best_profile)
        floor = int(float(method[len("retrieval-f"):]) * keep * n_context)
        auto = SELECTION["sinks"] + SELECTION["recent"] + 8  # the automatic floor (margin 8)
        return dict(spec, safeguard={"margin": 8, "min_tokens": floor if floor > auto else -1}), prof, name
    raise ValueError(f"unknown method {method!r}: one of {', '.join(METHODS)}")


def run(args) -> dict:
    eng = depthkv.Engine(args.model, n_threads=args.threads)
    count = lambda text: len(eng.tokenize(text))  # noqa: E731
    profiles = {}
    for path in args.profile or []:
        prof = depthkv.load_profile(path)
        for scorer in prof.scorers:
            profiles.setdefault(scorer, prof)
    best = depthkv.load_profile(args.best_profile) if args.best_profile else None
    if args.retrieval_profile:
        profiles["retrieval"] = depthkv.load_profile(args.retrieval_profile)
    for m in args.methods:
        need = "snapkv" if m == "optimal" else m[: -len("-optimal")] if m.endswith("-optimal") else None
        if need and need not in profiles:
            sys.exit(f"ruler: method {m} needs a --profile with {need} curves")
        if m.startswith("preset") and best is None:
            sys.exit(f"ruler: method {m} needs --best-profile")
        if m.startswith("retrieval") and "retrieval" not in profiles:
            sys.exit(f"ruler: method {m} needs --retrieval-profile")
    seeds = (CALIBRATION_SEEDS if args.seeds == "calibration" else REPORT_SEEDS)[: args.samples]
    rows = []
    for length in args.lengths:
        for task in args.tasks:
            for seed in seeds:
                s = make_sample(task, length, seed, count)
                ctx = eng.tokenize(s["context"])
                q = eng.tokenize(s["question"], bos=False)
                cells = [(m, c) for m in args.methods for c in ([0.0] if m == "full" else args.compressions)]
                runs = []
                for method, comp in cells:
                    spec, prof, preset = method_spec(method, 1.0 - comp, len(ctx), profiles, best)
                    runs.append({"spec": spec, "profile": prof, "preset": preset})
                t0 = time.time()
                # one prefill of the sample shared by every oneshot run (each prunes its own copy)
                if args.protocol == "outside":
                    gens = eng.generate_many(ctx, MAX_NEW[task], runs, suffix_ids=q)
                else:
                    gens = eng.generate_many(ctx + q, MAX_NEW[task], runs)
                seconds = round(time.time() - t0, 3)
                for (method, comp), g in zip(cells, gens):
                    text = eng.detokenize(g.tokens)
                    score = 100.0 * string_match_all(text, s["answers"])
                    rows.append({"length": length, "task": task, "seed": seed, "method": method,
                                 "compression": comp, "score": score, "n_context": len(ctx),
                                 "n_question": len(q), "answers": s["answers"], "output": text,
                                 "kv_bytes": g.report["cache_bytes"], "prefill_ms": round(g.report["prefill_ms"], 1),
                                 "lookahead_ms": round(g.report["lookahead_ms"], 1), "sample_seconds": seconds})
                    print(f"ruler: {length} {task} seed {seed} {method} c={comp:g}: {score:.0f} "
                          f"{text.strip()[:60]!r}", file=sys.stderr)
    return {"model": os.path.basename(args.model), "protocol": args.protocol, "seeds": args.seeds,
            "profile": args.profile, "best_profile": args.best_profile, "rows": rows}


def method_order(method: str):
    """Sort key: depthkv's methods in METHODS order, then the others (kvpress_run.py's) by name,
    its full cache first."""
    return (0, METHODS.index(method), "") if method in METHODS else (1, 0 if method.endswith("-full") else 1, method)


def table(result: dict) -> str:
    """Markdown: per length, task and method the mean score +- its standard error per compression;
    a full cache's rows (compression 0) stand in every column; methods whose rows are only masked
    (kvpress_run.py's head-wise presses) are marked " (masked)"."""
    rows = result["rows"]
    comps = sorted({r["compression"] for r in rows if r["compression"] > 0})
    masked = {r["method"] for r in rows if r.get("masked")}
    out = [f"{result['model']}, protocol {result['protocol']}, {result['seeds']} seeds; "
           "string_match_all x 100, mean +- standard error over the samples", ""]
    head = "| length | task | method | " + " | ".join(f"c={c:g}" for c in comps) + " |"
    out += [head, "|" + "---|" * (3 + len(comps))]
    keys = sorted({(r["length"], r["task"], r["method"]) for r in rows},
                  key=lambda k: (k[0], TASKS.index(k[1]), method_order(k[2])))
    for length, task, method in keys:
        cells = []
        for c in comps:
            v = [r["score"] for r in rows if (r["length"], r["task"], r["method"]) == (length, task, method)
                 and r["compression"] in (0, c)]
            n = len(v)
            mean = sum(v) / n if n else float("nan")
            se = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1) / n) if n > 1 else 0.0
            cells.append(f"{mean:.0f} +- {se:.0f}" if n else "")
        label = method + (" (masked)" if method in masked else "")
        out.append(f"| {length} | {task} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " (tables of several result files: "
                                "report.py)")
    p.add_argument("--model", required=True)
    p.add_argument("--profile", action="append",
                   help="a profile of this model (methods optimal: SnapKV curves, keydiff-optimal: KeyDiff curves); "
                        "repeatable")
    p.add_argument("--best-profile", help="a profile made with --preset best (method preset)")
    p.add_argument("--retrieval-profile", help="a profile made with --preset retrieval (methods retrieval*)")
    p.add_argument("--methods", type=lambda s: s.split(","), default=list(METHODS))
    add_sample_args(p, "it is part of the pruned prompt")
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args(argv)
    check_sample_args(p, args)
    check_names(p, args.methods, METHODS + tuple(f"retrieval-f{f}" for f in RETRIEVAL_FLOORS), "method")
    write_result(run(args), args.out)
    return 0


def add_sample_args(p: argparse.ArgumentParser, inside: str) -> None:
    """The options of the samples and the output, shared with kvpress_run.py (`inside`: what the
    inside protocol does with the question)."""
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[2048])
    p.add_argument("--tasks", type=lambda s: s.split(","), default=list(TASKS))
    p.add_argument("--compressions", type=lambda s: [float(x) for x in s.split(",")], default=[0.25, 0.5, 0.75, 0.875],
                   help="fractions of the context removed (kvpress's compression ratio; keep = 1 - c)")
    p.add_argument("--samples", type=int, default=4, help="samples per task and length")
    p.add_argument("--seeds", choices=("report", "calibration"), default="report")
    p.add_argument("--protocol", choices=("outside", "inside"), default="outside",
                   help="outside: the question follows the compressed context uncompressed (kvpress's); "
                        f"inside: {inside}")
    p.add_argument("--out", help="write the rows (JSON) here, and the table beside it (.md)")


def check_names(p: argparse.ArgumentParser, names, known, what: str) -> None:
    for n in names:
        if n not in known:
            p.error(f"unknown {what} {n!r}: one of {', '.join(known)}")


def check_sample_args(p: argparse.ArgumentParser, args) -> None:
    check_names(p, args.tasks, TASKS, "task")
    for c in args.compressions:
        if not 0.0 < c < 1.0:
            p.error(f"compression {c} is outside (0, 1)")


def write_result(result: dict, out) -> None:
    """Prints the result's table; with `out`, writes the rows there (JSON) and the table beside it (.md)."""
    md = table(result)
    print(md)
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.splitext(out)[0] + ".md", "w") as f:
            f.write(md)


if __name__ == "__main__":
    sys.exit(main())
