#!/usr/bin/env python3
"""docs/results/untouched.md from the rows of scripts/untouched-windows.sh (folder argv[1]) and, when
present, the kvpress side-by-side results on both window sets (docs/results/kvpress_peer.json,
docs/results/kvpress_peer_untouched.json)."""
import csv
import json
import os
import sys

d = sys.argv[1]
RES = os.path.dirname(os.path.abspath(d))
KEEPS = (0.1, 0.2, 0.3, 0.5)
SETS = {"stories260K": {"eval": "24..87", "untouched": "216..279", "n": 64, "size": "384 + 128"},
        "aidreams260K": {"eval": "48..175", "untouched": "176..303", "n": 128, "size": "96 + 32"}}


def rows(path):
    with open(path) as f:
        return {(r["scorer"], r["policy"], float(r["keep"])): r for r in csv.DictReader(f)}


def kl(r):
    return float(r["kl"])


def pct(a, b):
    return f"{100 * (a / b - 1):+.0f}%"


out = []
p = out.append
p("# Headline figures on the untouched windows\n")
p("Written by `scripts/untouched-windows.sh` (tables: `scripts/untouched-table.py`; rows in "
  "`docs/results/untouched/`). The same commands on two window sets of `tinystories_valid.txt` "
  "(`docs/results/windows.md`): **eval**, the evaluation windows every earlier figure was measured on and that "
  "several revisions of `--preset best` were scored on (stories260K 24..87, aidreams260K 48..175), and "
  "**untouched**, windows that no revision and no choice has seen (stories260K 216..279, aidreams260K 176..303). "
  "Cells read *eval / untouched*. Curves: the main job's profiles (`docs/results/<model>.profile.json`, "
  "`<model>.best.profile.json`, calibration windows stories260K 0..23, aidreams260K 0..47).\n")

# the main job's comparison
p("## The main job's comparison: KL against uniform budgets at the same keep\n")
p("Main job protection (stories260K 4/16 sinks/recent, aidreams260K 2/4), safeguard floor default. "
  "Negative = lower KL than uniform.\n")
checks = []
for name, s in SETS.items():
    ev, un = rows(os.path.join(d, f"eval.{name}.main.csv")), rows(os.path.join(d, f"untouched.{name}.main.csv"))
    p(f"### {name} ({s['n']} windows of {s['size']} tokens each set)\n")
    p("| scorer | policy | " + " | ".join(f"keep {k:g}" for k in KEEPS) + " |")
    p("|---|---|" + "---|" * len(KEEPS))
    for sc in ("h2o", "snapkv"):
        p(f"| {sc} | uniform (KL) | " + " | ".join(
            f"{kl(ev[(sc, 'uniform', k)]):.5f} / {kl(un[(sc, 'uniform', k)]):.5f}" for k in KEEPS) + " |")
        for pol in ("pyramid", "proportional", "middle", "optimal"):
            p(f"| {sc} | {pol} | " + " | ".join(
                f"{pct(kl(ev[(sc, pol, k)]), kl(ev[(sc, 'uniform', k)]))} / "
                f"{pct(kl(un[(sc, pol, k)]), kl(un[(sc, 'uniform', k)]))}" for k in KEEPS) + " |")
    p("")
    main_csv = os.path.join(RES, f"{name}.eval.csv")
    if os.path.exists(main_csv):
        ref = rows(main_csv)
        same = all(ref[k]["kl"] == ev[k]["kl"] and ref[k]["budgets"] == ev[k]["budgets"] for k in ev)
        checks.append(f"{name}: the eval-window rows {'equal' if same else 'DIFFER from'} the main job's "
                      f"`docs/results/{name}.eval.csv`")
if checks:
    p("Check: " + "; ".join(checks) + ".\n")

# the preset against uniform budgets
p("## `--preset best` against uniform budgets\n")
p("The rows of `scripts/preset-heldout.sh` with the preset's protection (stories260K 4/16, aidreams260K 0/4): "
  "the preset's KL, and its change against uniform budgets with the scorer it chose (output-aware, with its "
  "32-token lookahead and without), and against plain SnapKV uniform.\n")
for name, s in SETS.items():
    t = {st: {kind: rows(os.path.join(d, f"{st}.{name}.{kind}.csv")) for kind in ("plain", "oa", "oa0", "best")}
         for st in ("eval", "untouched")}
    best = {st: {float(r["keep"]): r for r in t[st]["best"].values()} for st in t}
    p(f"### {name}\n")
    p("| | " + " | ".join(f"keep {k:g}" for k in KEEPS) + " |")
    p("|---|" + "---|" * len(KEEPS))
    p("| --preset best (KL; the scorer it chose) | " + " | ".join(
        f"{kl(best['eval'][k]):.5f} / {kl(best['untouched'][k]):.5f} ({best['eval'][k]['scorer']}"
        + ("" if best['eval'][k]['scorer'] == best['untouched'][k]['scorer'] else f" / {best['untouched'][k]['scorer']}")
        + ")" for k in KEEPS) + " |")
    for label, kind in (("vs uniform, the scorer it chose, lookahead 32", "oa"),
                        ("vs uniform, the scorer it chose, no lookahead", "oa0")):
        p(f"| {label} | " + " | ".join(" / ".join(
            pct(kl(best[st][k]), kl(t[st][kind][(best[st][k]["scorer"], "uniform", k)])) for st in ("eval", "untouched"))
            for k in KEEPS) + " |")
    p("| vs plain snapkv uniform | " + " | ".join(" / ".join(
        pct(kl(best[st][k]), kl(t[st]["plain"][("snapkv", "uniform", k)])) for st in ("eval", "untouched"))
        for k in KEEPS) + " |")
    p("")

# head-level budgets
p("## Head-level budgets\n")
p("Main job step 7's story-text rows (`heads.eval.txt`): SnapKV, output-aware, with the preset's 32-token "
  "lookahead and protection, the `<model>.best.profile.json` curves: mean KL of uniform, optimal per layer and "
  "head-optimal per KV head budgets, and head-optimal against optimal per layer.\n")
for name, s in SETS.items():
    t = {st: rows(os.path.join(d, f"{st}.{name}.heads.csv")) for st in ("eval", "untouched")}
    p(f"### {name}\n")
    p("| | " + " | ".join(f"keep {k:g}" for k in KEEPS) + " |")
    p("|---|" + "---|" * len(KEEPS))
    for pol in ("uniform", "optimal", "head-optimal"):
        p(f"| {pol} (KL) | " + " | ".join(" / ".join(f"{kl(t[st][('snapkv', pol, k)]):.5f}" for st in t)
                                         for k in KEEPS) + " |")
    for ref in ("optimal", "uniform"):
        p(f"| head-optimal vs {ref} | " + " | ".join(" / ".join(
            pct(kl(t[st][("snapkv", "head-optimal", k)]), kl(t[st][("snapkv", ref, k)])) for st in t)
            for k in KEEPS) + " |")
    p("")

# kvpress
kv = {}
for st, f in (("eval", "kvpress_peer.json"), ("untouched", "kvpress_peer_untouched.json")):
    path = os.path.join(RES, f)
    if os.path.exists(path):
        kv[st] = {r["model"]: r for r in json.load(open(path))}
if len(kv) == 2:
    p("## Against kvpress\n")
    p("From `benchmarks/kvpress_peer/run.py` on each set (`docs/results/kvpress_peer.md` and "
      "`kvpress_peer_untouched.md`): KL of the best of kvpress's own presses at each keep (named), and depthkv's "
      "rows as a ratio of it (target: 0.7 or lower). A press or row missing from the untouched run "
      "(a subset of the presses may have run there, see its file) leaves a blank.\n")

    def best_press(res, k):
        b = None
        for label, dd in res["kl"].items():
            v = dd.get(str(k))
            if label.startswith("kvpress ") and "depthkv" not in label and v is not None and (b is None or v < b[1]):
                b = (label[len("kvpress "):], v)
        return b

    for name in SETS:
        if name not in kv["eval"] or name not in kv["untouched"]:
            continue
        r = {st: kv[st][name] for st in kv}
        p(f"### {name}\n")
        p(f"Presses run: eval {sum(1 for l in r['eval']['kl'] if l.startswith('kvpress ') and 'depthkv' not in l)}, "
          f"untouched {sum(1 for l in r['untouched']['kl'] if l.startswith('kvpress ') and 'depthkv' not in l)}.\n")
        p("| | " + " | ".join(f"keep {k:g}" for k in KEEPS) + " |")
        p("|---|" + "---|" * len(KEEPS))
        bp = {st: [best_press(r[st], k) for k in KEEPS] for st in r}
        p("| best kvpress press | " + " | ".join(
            f"{bp['eval'][i][1]:.5f} ({bp['eval'][i][0]}) / {bp['untouched'][i][1]:.5f} ({bp['untouched'][i][0]})"
            for i in range(len(KEEPS))) + " |")
        labels = [l for l in r["eval"]["kl"] if l.startswith("depthkv ")]
        for label in labels:
            cells = []
            for i, k in enumerate(KEEPS):
                vals = []
                for st in ("eval", "untouched"):
                    v = r[st]["kl"].get(label, {}).get(str(k))
                    vals.append(f"{v / bp[st][i][1]:.2f}" if v is not None and bp[st][i] else "")
                cells.append(" / ".join(vals))
            p(f"| ratio {label} | " + " | ".join(cells) + " |")
        p("")
print("\n".join(out))
