#!/usr/bin/env python3
"""docs/results/robust.md from the rows of scripts/robust.sh.
Usage: robust-table.py ROWS_DIR WINDOWS"""
import csv
import math
import os
import sys

MODELS = ("stories260K", "aidreams260K")
KINDS = (("stories", "calibration kind"), ("legal", "calibration kind"), ("code", "held out"),
         ("markup", "held out"), ("changelog", "held out"))
SOURCES = ("text", "model")


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def by_keep(rs, pick):  # keep -> (KL, standard error, scorer)
    return {float(r["keep"]): (float(r["kl"]), float(r["kl_stderr"]), r["scorer"]) for r in rs if pick(r)}


def ratio(a, b):  # a / b with its standard error (delta method, the two means taken as independent)
    r = a[0] / b[0]
    return r, r * math.sqrt((a[1] / a[0]) ** 2 + (b[1] / b[0]) ** 2) if a[0] > 0 else 0.0


def methods(d, name, kind, src):
    tag = os.path.join(d, f"{name}.{kind}.{src}")
    plain, best, best0 = rows(tag + ".plain.csv"), rows(tag + ".best.csv"), rows(tag + ".best0.csv")
    return {
        "preset": by_keep(best, lambda r: not r["scorer"].endswith("+oracle")),
        "snapkv uniform": by_keep(plain, lambda r: r["scorer"] == "snapkv"),
        "h2o uniform": by_keep(plain, lambda r: r["scorer"] == "h2o"),
        "oracle (preset's budgets)": by_keep(best, lambda r: r["scorer"].endswith("+oracle")),
        "preset without lookahead": by_keep(best0, lambda r: True),
    }


def table(m, keeps, worst):
    out = ["| method | " + " | ".join(f"keep {k:g}" for k in keeps) + " |", "|---|" + "---|" * len(keeps)]
    base = m["snapkv uniform"]
    for name, v in m.items():
        out.append(f"| {name} (KL) | " + " | ".join(f"{v[k][0]:.5f} +- {v[k][1]:.5f}" for k in keeps) + " |")
    for name, v in m.items():
        if name == "snapkv uniform":
            continue
        cells = []
        for k in keeps:
            r, se = ratio(v[k], base[k])
            flag = " **>1**" if r - se > 1.0 else ""
            cells.append(f"{r:.2f} +- {se:.2f}{flag}")
            worst.setdefault(name, []).append((r, se, k))
        out.append(f"| {name} / snapkv uniform | " + " | ".join(cells) + " |")
    return out


def main():
    d, n = sys.argv[1], sys.argv[2]
    print("# `--preset best` on many kinds of text and both continuation protocols\n")
    print(f"Written by `scripts/robust.sh` (table: `scripts/robust-table.py`; rows: `docs/results/robust/`; windows "
          f"and files: `robust-windows.md`). Mean KL(full || pruned) +- its standard error over {n} windows per kind, "
          "and each method's KL as a multiple of plain SnapKV with uniform budgets at the same keep, +- the standard "
          "error of that ratio (delta method, the two means taken as independent, which overstates it for paired "
          "windows). **>1** marks a cell more than one standard error above 1.0x. Protocols: `text` teacher-forces "
          "the true continuation, `model` the model's own greedy continuation (`eval --continuation-source model`). "
          "The oracle uses the preset's budgets and scorer with scores from the continuation's own attention "
          "(`eval --oracle`, a measurement only). Protection as the preset's: stories260K --sinks 4 --recent 16 "
          "--obs-window 16, aidreams260K --sinks 0 --recent 4 --obs-window 4. Curves: `<model>.profile.json` (plain "
          "rows), `<model>.best.profile.json` (preset rows). Kinds: the preset's settings are chosen on calibration "
          "kinds (stories, licences) but on other windows than these (`preset-calibration.md`); the windows here "
          "(`robust-windows.md`) choose nothing.\n")
    summary = []
    for name in MODELS:
        for kind, role in KINDS:
            for src in SOURCES:
                try:
                    m = methods(d, name, kind, src)
                except FileNotFoundError:
                    continue
                keeps = sorted(m["preset"])
                worst = {}
                print(f"## {name}, {kind} ({role}), continuation: {src}\n")
                print("\n".join(table(m, keeps, worst)) + "\n")
                r, se, k = max(worst["preset"])
                summary.append((name, kind, role, src, r, se, k,
                                sum(1 for x in worst["preset"] if x[0] - x[1] > 1.0)))
    print("## Summary: the preset's worst cell per (model, kind, protocol)\n")
    print("| model | kind | role | continuation | worst preset / snapkv uniform | at keep | cells >1 beyond one s.e. |")
    print("|---|---|---|---|---|---|---|")
    for name, kind, role, src, r, se, k, bad in summary:
        print(f"| {name} | {kind} | {role} | {src} | {r:.2f} +- {se:.2f} | {k:g} | {bad} of 6 |")


if __name__ == "__main__":
    main()
