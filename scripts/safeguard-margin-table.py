#!/usr/bin/env python3
"""The table and the decision of scripts/safeguard-margin.sh from its CSV rows (folder argv[1]).

Rebuilds "margin m as the default runs it" (halved until the floors fit the budget) from the
explicit-floor runs, checks that rebuild against the default's own run (`--min-tokens -1`, margin
8), and applies the decision rule stated in scripts/safeguard-margin.sh."""
import csv
import math
import os
import sys

d = sys.argv[1]
SHOWN = (0, 4, 8, 16)     # the margins compared
STANDING = 8              # depthkv::kSafeguardMargin before this measurement
KEEPS = (0.1, 0.2, 0.3, 0.5)
MODELS = ("stories260K", "aidreams260K")


def rows(path):
    with open(path) as f:
        return {(r["scorer"], r["policy"], float(r["keep"])): r for r in csv.DictReader(f)}


def fits(n_layers, length, prot, margin, keep):
    """Whether every layer's floor max(F, min(F + margin, length)) fits the global budget (the
    allocator's test, budget_allocator.hpp safeguard_floors; head-optimal: the same per head)."""
    f = min(length, prot)
    floor = max(f, min(f + margin, length))
    return n_layers * floor <= round(keep * length * n_layers)


def effective(n_layers, length, prot, margin, keep):
    """The margin the default runs: halved (integer division) until the floors fit."""
    m = margin
    while m > 0 and not fits(n_layers, length, prot, m, keep):
        m //= 2
    return m


setup, data = {}, {}
for name in MODELS:
    _, half, ctx, ps, pr, bs, br, look = open(os.path.join(d, name + ".setup")).read().split()
    setup[name] = dict(half=int(half), ctx=int(ctx), plain=int(ps) + int(pr), best=int(bs) + int(br), look=int(look),
                       sel=(f"{ps}/{pr}", f"{bs}/{br}"))
    for fam in ("plain", "best"):
        for m in (0, 2, 4, 8, 16, "default"):
            data[(name, fam, m)] = rows(os.path.join(d, f"{name}.{fam}.m{m}.csv"))
    data[(name, "best-uniform")] = rows(os.path.join(d, f"{name}.best-uniform.csv"))

# the cells: (model, method) -> per keep: (family, scorer, policy)
METHODS = (("h2o optimal", "plain", "h2o", "optimal"), ("snapkv optimal", "plain", "snapkv", "optimal"),
           ("--preset best", "best", None, None))


def n_layers_of(name):
    r = next(iter(data[(name, "plain", 0)].values()))
    return len(r["budgets"].split(";"))


def cell(name, fam, m, keep, scorer, policy):
    tab = data[(name, fam, m)]
    if fam == "best":
        (r,) = [v for (s, p, k), v in tab.items() if k == keep]
        return r
    return tab[(scorer, policy, keep)]


def uniform(name, fam, keep, scorer):
    if fam == "best":
        return data[(name, "best-uniform")][(scorer, "uniform", keep)]
    return data[(name, "plain", 0)][(scorer, "uniform", keep)]


def kl(r):
    return float(r["kl"]), float(r["kl_stderr"])


out = []
p = out.append
p("# The safeguard margin, on calibration windows\n")
p("Written by `scripts/safeguard-margin.sh` (table and decision: `scripts/safeguard-margin-table.py`; rows in "
  "`docs/results/safeguard-margin/`). Calibration data only, the split of `scripts/preset-selection.sh`: curves "
  "profiled on the first half of each main profile's calibration windows, mean KL(full || pruned) +- standard error "
  "on the second half (stories260K: profile 0..11, evaluate 12..23, 384 + 128 tokens; aidreams260K: profile 0..23, "
  "evaluate 24..47, 96 + 32 tokens). No evaluation window of the reported results, no untouched window "
  "(`docs/results/windows.md`) and no GPL-3 text is used. The safeguard floor is sinks + recent + margin tokens per "
  "layer (per KV head for `--preset best`'s head-optimal budgets). Protection: h2o/snapkv rows the main job's "
  f"(stories260K {setup['stories260K']['sel'][0]}, aidreams260K {setup['aidreams260K']['sel'][0]} sinks/recent), "
  f"`--preset best` its own (stories260K {setup['stories260K']['sel'][1]}, aidreams260K "
  f"{setup['aidreams260K']['sel'][1]}, lookahead {setup['stories260K']['look']}); uniform rows: the same scorer "
  "with uniform budgets (for the preset: the output-aware scorer it chose, with its lookahead).\n")
p("**Decision rule, fixed before the runs.** Each margin m is scored as the default would run it (the margin "
  "halved until the floors fit the budget) on 24 cells: 2 models x {h2o optimal, snapkv optimal, `--preset best`} "
  "x keep {0.1, 0.2, 0.3, 0.5}; score = geometric mean of the mean KL. A margin is out if in any cell its KL "
  "exceeds uniform budgets with the same scorer by more than two standard errors of its own row. The default "
  f"stays {STANDING} unless another margin that is not out scores at least 3% lower (these in-domain windows "
  "cannot show the out-of-domain collapse the margin guards against, so the standing value keeps the benefit "
  "of the doubt); among several such, the lowest score.\n")

# 1. explicit floors
p("## Explicit floors (`--min-tokens sinks+recent+m`)\n")
p("A floor that does not fit the budget gives uniform budgets (marked *uniform fallback*).\n")
for name in MODELS:
    s = setup[name]
    nl = n_layers_of(name)
    p(f"### {name}\n")
    p("| method | margin | " + " | ".join(f"keep {k:g}" for k in KEEPS) + " |")
    p("|---|---|" + "---|" * len(KEEPS))
    for label, fam, sc, pol in METHODS:
        prot = s[fam]
        ref = []
        for k in KEEPS:
            scorer = cell(name, fam, 0, k, sc, pol)["scorer"]
            ref.append(f"{kl(uniform(name, fam, k, scorer))[0]:.5f} +- {kl(uniform(name, fam, k, scorer))[1]:.5f}"
                       + (f" ({scorer})" if fam == "best" else ""))
        p(f"| {label.split()[0] if fam == 'plain' else label}: uniform budgets | | " + " | ".join(ref) + " |")
        for m in SHOWN:
            cells = []
            for k in KEEPS:
                r = cell(name, fam, m, k, sc, pol)
                v, e = kl(r)
                extra = "" if fits(nl, s["ctx"], prot, m, k) else " *uniform fallback*"
                cells.append(f"{v:.5f} +- {e:.5f}" + (f" ({r['scorer']})" if fam == "best" else "") + extra)
            p(f"| {label} | {m} | " + " | ".join(cells) + " |")
    p("")

# 2. as the default runs each margin
p("## Each margin as the default runs it (halved until the floors fit)\n")
check = []
for name in MODELS:
    s = setup[name]
    nl = n_layers_of(name)
    for label, fam, sc, pol in METHODS:
        for k in KEEPS:
            e = effective(nl, s["ctx"], s[fam], STANDING, k)
            a, b = cell(name, fam, e, k, sc, pol), cell(name, fam, "default", k, sc, pol)
            check.append(a["kl"] == b["kl"] and a["budgets"] == b["budgets"])
p(f"Rebuilt from the explicit runs (margin m >> j, the smallest j that fits; margin 2 was run for this). Check: "
  f"the rebuilt margin {STANDING} equals the default's own run (`--min-tokens -1`) in "
  f"{sum(check)} of {len(check)} cells (KL and budgets).\n")
if not all(check):
    raise SystemExit("safeguard-margin-table: the rebuilt default differs from --min-tokens -1")
score, worst, losses = {}, {}, {}
for m in SHOWN:
    logs, bad = [], []
    for name in MODELS:
        s = setup[name]
        nl = n_layers_of(name)
        for label, fam, sc, pol in METHODS:
            for k in KEEPS:
                e = effective(nl, s["ctx"], s[fam], m, k)
                if (name, fam, e) not in data:
                    raise SystemExit(f"safeguard-margin-table: margin {e} (margin {m} halved) was not run")
                r = cell(name, fam, e, k, sc, pol)
                v, se = kl(r)
                u = kl(uniform(name, fam, k, r["scorer"]))[0]
                logs.append(math.log(v))
                if v > u + 2 * se:
                    bad.append(f"{name} {label} keep {k:g} ({v:.5f} against uniform {u:.5f})")
    score[m] = math.exp(sum(logs) / len(logs))
    losses[m] = bad
for name in MODELS:
    s = setup[name]
    nl = n_layers_of(name)
    p(f"### {name}\n")
    p("| method | margin | " + " | ".join(f"keep {k:g}" for k in KEEPS) + " |")
    p("|---|---|" + "---|" * len(KEEPS))
    for label, fam, sc, pol in METHODS:
        for m in SHOWN:
            cells = []
            for k in KEEPS:
                e = effective(nl, s["ctx"], s[fam], m, k)
                r = cell(name, fam, e, k, sc, pol)
                u = kl(uniform(name, fam, k, r["scorer"]))[0]
                v = kl(r)[0]
                cells.append(f"{v:.5f} ({100 * (v / u - 1):+.0f}%)" + (f" [margin {e}]" if e != m else ""))
            p(f"| {label} | {m} | " + " | ".join(cells) + " |")
    p("")
p("Percentages: against uniform budgets with the same scorer. [margin e]: the margin after halving.\n")
p("## Scores and decision\n")
p("| margin | geometric-mean KL (24 cells) | against margin " + str(STANDING) + " | cells worse than uniform by > 2 s.e. |")
p("|---|---|---|---|")
for m in SHOWN:
    p(f"| {m} | {score[m]:.6f} | {100 * (score[m] / score[STANDING] - 1):+.1f}% | "
      + ("; ".join(losses[m]) if losses[m] else "none") + " |")
p("")
cands = [m for m in SHOWN if m != STANDING and not losses[m] and score[m] <= 0.97 * score[STANDING]]
if losses[STANDING]:
    p(f"Margin {STANDING} itself is out by the rule's collapse test.")
if cands:
    best = min(cands, key=lambda m: score[m])
    p(f"**Decision: the default margin changes from {STANDING} to {best}** (score {100 * (score[best] / score[STANDING] - 1):+.1f}% "
      f"against {STANDING}, not out).")
else:
    p(f"**Decision: the default margin stays {STANDING}**: no other margin that is not out scores at least 3% lower.")
print("\n".join(out))
