#!/usr/bin/env python3
"""The table of docs/results/preset.md from the CSVs of scripts/preset-selection.sh.

Rule: the preset is the candidate (scorer, setting, budget policy: optimal per layer or
head-optimal per KV head) with the lowest geometric mean, over both models and every keep ratio,
of its KL divided by one reference per cell, the plain SnapKV (max pooling) uniform KL (depthkv's
default scorer). Standard library only.
Usage: scripts/preset-table.py docs/results/preset > docs/results/preset.md
"""

import csv
import math
import os
import sys

SETTINGS = {"plain": "plain", "oa": "output-aware", "ada": "adaptive heads", "oa_ada": "output-aware + adaptive heads"}
POLICIES = ["optimal", "head-optimal"]


def read(path):
    rows = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            rows[(r["policy"], float(r["keep"]))] = float(r["kl"])
    return rows


def main():
    d = sys.argv[1]
    data = {}
    preset = {}  # model -> {keep: (chosen scorer, KL)}: `--preset best` (choosing by predicted loss)
    for fn in sorted(os.listdir(d)):
        if not fn.endswith(".csv"):
            continue
        model, scorer, setting = fn[:-4].split(".")
        if (scorer, setting) == ("preset", "best"):
            with open(os.path.join(d, fn)) as f:
                preset[model] = {float(r["keep"]): (r["scorer"], float(r["kl"])) for r in csv.DictReader(f)}
            continue
        data[(model, scorer, setting)] = read(os.path.join(d, fn))
    models = sorted({k[0] for k in data}, key=lambda m: m != "stories260K")
    keeps = sorted({k[1] for v in data.values() for k in v})
    settings = sorted({(k[1], k[2]) for k in data}, key=lambda c: (c[0], list(SETTINGS).index(c[1])))
    policies = [p for p in POLICIES if any((p, k) in v for v in data.values() for k in keeps)]
    cands = [(sc, st, p) for sc, st in settings for p in policies]

    def base(model, keep):  # the same reference for every candidate
        return data[(model, "snapkv-max", "plain")][("uniform", keep)]

    score = {}
    for c in cands:
        logs = [math.log(data[(m, c[0], c[1])][(c[2], k)] / base(m, k)) for m in models for k in keeps
                if (m, c[0], c[1]) in data]
        score[c] = math.exp(sum(logs) / len(logs))
    choice = ("snapkv-max or h2o, the lower predicted loss per keep", "oa", "head-optimal")
    if len(preset) == len(models):
        logs = [math.log(preset[m][k][1] / base(m, k)) for m in models for k in keeps]
        score[choice] = math.exp(sum(logs) / len(logs))
        cands.append(choice)
    best = min(cands, key=lambda c: score[c])

    out = ["# `--preset best`: chosen on calibration windows", "",
           "Written by `scripts/preset-selection.sh` (table: `scripts/preset-table.py`; rows in `preset/`). "
           "Each main profile's calibration windows are split in two: the candidates are profiled on the first "
           "half and evaluated on the second (stories260K: profile windows 0..11, select on 12..23, 384 + 128 "
           "tokens, selection 4/16/16; aidreams260K: 0..23 and 24..47, 96 + 32 tokens, 2/4/4). The reported "
           "evaluation windows (stories260K 24..87, aidreams260K 48..175) and the GPL-3 text are not used.", "",
           "Rule: the lowest geometric mean over both models and keep "
           + ", ".join(f"{k:g}" for k in keeps) + " of (KL of the candidate) / (plain SnapKV uniform KL, "
           "max pooling: one reference per cell for every candidate). A candidate is a scorer, a setting and a "
           "budget policy: optimal per-layer budgets (curves measured under the candidate's own setting) or "
           "head-optimal per-(layer, KV head) budgets (head curves measured alongside; with adaptive heads each "
           "layer's head-optimal total is re-split by the scores). (A first version divided each candidate by the "
           "uniform KL of its own scorer, which ranks scorers against different references; its top three were "
           "the same.)", ""]
    for m in models:
        out += [f"## {m}: mean KL on the selection windows", "",
                "| scorer | setting | " + " | ".join(f"{p} {k:g}" for p in ["uniform"] + policies for k in keeps) + " |",
                "|---|---|" + "---|" * ((1 + len(policies)) * len(keeps))]
        for c in settings:
            r = data.get((m, *c))
            if r is None:
                continue
            cells = [f"{r[(p, k)]:.5f}" for p in ["uniform"] + policies for k in keeps]
            out.append(f"| {c[0]} | {SETTINGS[c[1]]} | " + " | ".join(cells) + " |")
        out.append("")
    if choice in score:
        out += ["## `--preset best`: per keep, the output-aware scorer of the lower predicted loss", "",
                "Both output-aware candidates (SnapKV with max pooling, H2O) profiled together on the first half "
                "(`profile --preset best`); `eval --preset best` picks per keep the scorer whose head-optimal "
                "budgets have the lower predicted loss on those curves. Mean KL on the selection windows (chosen "
                "scorer):", "",
                "| model | " + " | ".join(f"keep {k:g}" for k in keeps) + " |", "|---|" + "---|" * len(keeps)]
        for m in models:
            out.append(f"| {m} | " + " | ".join(f"{preset[m][k][1]:.5f} ({preset[m][k][0]})" for k in keeps) + " |")
        out.append("")
    out += ["## The rule's scores (lower is better)", "", "| scorer | setting | budgets | geometric mean KL ratio |",
            "|---|---|---|---|"]
    for c in sorted(cands, key=lambda c: score[c]):
        out.append(f"| {c[0]} | {SETTINGS[c[1]]} | {c[2]} | {score[c]:.3f}{' (chosen)' if c == best else ''} |")
    what = "optimal per-layer budgets" if best[2] == "optimal" else "head-optimal per-(layer, KV head) budgets"
    out += ["", f"Chosen: **{best[0]}, {SETTINGS[best[1]]}, {what}**.", ""]
    print("\n".join(out))


if __name__ == "__main__":
    main()
