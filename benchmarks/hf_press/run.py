#!/usr/bin/env python3
"""DepthKVPress beside kvpress's presses, measured by depthkv.hf.evaluate: docs/results/hf_press.md.

For each model (stories260K, aidreams260K from the data folder):
 1. `depthkv eval --windows-out` writes the evaluation windows of benchmarks/kvpress_peer: those
    after the profile's calibration windows (stories260K: calibration 0..23, evaluation 24..87;
    aidreams260K: calibration 0..47, evaluation 48..175), context + continuation as profiled
    (384 + 128; 96 + 32). Calibration and evaluation windows are disjoint.
 2. The llama2.c checkpoint is converted to Hugging Face Llama by benchmarks/kvpress_peer/run.py
    (`to_hf`, sdpa attention), whose attention-mask patch is installed as there (kvpress's
    head-wise presses apply their pruned pairs as an additive mask; DepthKVPress is physical).
 3. `depthkv.hf.evaluate` runs every press on every window at every keep ratio: the context
    prefilled under the press, the continuation teacher-forced on the compressed cache; mean
    KL(full || pruned) over the continuation rows and the windows. Presses: DepthKVPress with the
    profile's optimal budgets, ranking by kvpress's SnapKV (the library's protection inside the
    budget; and with `select_protection=(0, 0)`, ranking by kvpress's scores alone, which is what
    kvpress_peer's "depthkv optimal budgets + kvpress SnapKV" row does by masking) and by depthkv's
    own scorers (press="snapkv", "h2o"); DepthKVPress with head-optimal budgets from the head
    curves of <model>.best.profile.json (its protection and observation window); and every
    kvpress press of kvpress_peer (`depthkv.hf.KVPRESS_NAMES`).
 4. The rows that kvpress_peer also measured are compared with docs/results/kvpress_peer.json
    (the issue's 2% check), and DepthKVPress's per-layer cache lengths after compression are listed.
 5. The time of `depthkv.hf.profile` against `depthkv profile` on the same calibration windows
    (the committed profile's: scorers, ratios, protection), one thread each.

Needs the Python package, torch, transformers and kvpress (python/requirements-hf.txt) and a built
`depthkv` CLI; run from outside the checkout's python/ folder:

    OMP_WAIT_POLICY=passive python benchmarks/hf_press/run.py --depthkv build/release/tools/depthkv
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

import depthkv
import depthkv.hf
from depthkv.kvpress import DepthKVPress

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "docs", "results")
#: per model: the evaluation windows (kvpress_peer's), the selection of its main profile
MODELS = {"stories260K": {"windows": 64}, "aidreams260K": {"windows": 128}}
#: DepthKVPress rows -> the kvpress_peer.json row that measures the same thing
PEER_ROWS = {
    "DepthKVPress optimal + kvpress SnapKV, select_protection (0, 0)": "depthkv optimal budgets + kvpress SnapKV",
    "DepthKVPress head-optimal + kvpress SnapKV, select_protection (0, 0)":
        "depthkv head-optimal budgets + kvpress SnapKV",
    # depthkv's own scorers by name: `depthkv eval` of the C++ engine on the same windows
    "DepthKVPress optimal + depthkv snapkv": "depthkv snapkv optimal",
    "DepthKVPress optimal + depthkv h2o": "depthkv h2o optimal",
}


#: the issue's 2% check: DepthKVPress with depthkv's budgets, ranking by kvpress's SnapKV (per-window KL kept)
CHECK_ROW = "DepthKVPress optimal + kvpress SnapKV, select_protection (0, 0)"
#: kvpress rows whose per-layer cache lengths are listed
LENGTH_ROWS = ("kvpress SnapKV", "kvpress PyramidKV")


def load_peer():
    path = os.path.join(ROOT, "benchmarks", "kvpress_peer", "run.py")
    spec = importlib.util.spec_from_file_location("kvpress_peer_run", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_windows(a, name, profile, n_windows):
    """`depthkv eval --windows-out`: the windows after the profile's calibration windows."""
    out = os.path.join(a.work, name + ".windows.json")
    bin_path = os.path.join(a.data, "models", name, name + ".bin")
    text = os.path.join(a.data, "text", "tinystories_valid.txt")
    r = subprocess.run([a.depthkv, "eval", "--model", bin_path, "--text", text, "--profile", profile, "--windows",
                        str(n_windows), "--windows-out", out], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return out


def depthkv_presses(prof, best):
    """(label, PressMaker) of the DepthKVPress rows."""
    import kvpress as kp
    sel, bsel = prof.selection, best.selection if best is not None else None
    prot, w = (sel["sinks"], sel["recent"]), sel["obs_window"]

    def maker(label, profile, policy, press, protection, select=None):
        return label, depthkv.hf.PressMaker(label, lambda keep: DepthKVPress(
            profile, keep, policy, press() if callable(press) else press, protection=protection,
            select_protection=select))
    snap = (lambda win: (lambda: kp.SnapKVPress(window_size=win, kernel_size=7)))
    rows = [maker("DepthKVPress optimal + kvpress SnapKV", prof, "optimal", snap(w), prot),
            maker("DepthKVPress optimal + kvpress SnapKV, select_protection (0, 0)", prof, "optimal", snap(w), prot,
                  (0, 0)),
            maker("DepthKVPress optimal + depthkv snapkv", prof, "optimal", "snapkv", prot),
            maker("DepthKVPress optimal + depthkv h2o", prof, "optimal", "h2o", prot)]
    if best is not None and best.has_head_curves("snapkv"):
        bprot = (bsel["sinks"], bsel["recent"])
        rows += [maker("DepthKVPress head-optimal + kvpress SnapKV", best, "head-optimal", snap(bsel["obs_window"]),
                       bprot),
                 maker("DepthKVPress head-optimal + kvpress SnapKV, select_protection (0, 0)", best, "head-optimal",
                       snap(bsel["obs_window"]), bprot, (0, 0))]
    return rows


def run_model(a, name, peer):
    profile_path = os.path.join(RESULTS, name + ".profile.json")
    prof = depthkv.load_profile(profile_path)
    best_path = os.path.join(RESULTS, name + ".best.profile.json")
    best = depthkv.load_profile(best_path) if os.path.exists(best_path) else None
    windows = write_windows(a, name, profile_path, a.windows or MODELS[name]["windows"])
    model = peer.to_hf(os.path.join(a.data, "models", name, name + ".bin"), "sdpa")
    res = {"model": name, "rows": {}}
    presses = depthkv_presses(prof, best)
    presses += [(n, depthkv.hf.make_press(n, prof, kernel=7)) for n in depthkv.hf.KVPRESS_NAMES
                if not a.presses or n in a.presses]
    for label, maker in presses:
        t0 = time.time()
        try:
            r = depthkv.hf.evaluate(model, None, windows, maker, a.keep, n_windows=None)
        except Exception as e:  # a press that cannot run on this model is reported, not fatal
            print(f"  {label}: failed: {type(e).__name__}: {e}", flush=True)
            r = per_keep(model, windows, maker, a.keep)
        res["rows"][maker.label if label in depthkv.hf.KVPRESS_NAMES else label] = r
        res.update(windows=r["windows"], context=r["context"], continuation=r["continuation"],
                   nll_full=r["nll_full"])
        print(f"  {label:<62} KL {' '.join(f'{x:.5f}' if x is not None else 'failed' for x in r['kl'])}"
              f"  ({time.time() - t0:.1f} s)", flush=True)
    return res


def per_keep(model, windows, maker, keeps):
    """A press failing at some keep: evaluated keep by keep, None where it fails."""
    out = None
    for i, k in enumerate(keeps):
        try:
            r = depthkv.hf.evaluate(model, None, windows, maker, [k], n_windows=None)
        except Exception:
            r = None
        if out is None and r is not None:
            out = dict(r, keeps=list(keeps), kl=[None] * len(keeps), lengths=[None] * len(keeps))
        if r is not None:
            out["kl"][i], out["lengths"][i] = r["kl"][0], r["lengths"][0]
    return out or {"keeps": list(keeps), "kl": [None] * len(keeps), "lengths": [None] * len(keeps)}


def time_profiles(a, name, peer):
    """Seconds of `depthkv profile` and of depthkv.hf.profile on the committed profile's calibration
    windows, scorers, ratios and protection (one thread each), and the largest relative difference
    of their layer curves. The windows go to depthkv.hf.profile through `depthkv eval --windows-out`
    on a link of the text under another name (eval refuses the profile's calibration windows of its
    own text)."""
    prof = depthkv.load_profile(os.path.join(RESULTS, name + ".profile.json"))
    c, sel = prof.calibration, prof.selection
    bin_path = os.path.join(a.data, "models", name, name + ".bin")
    text = os.path.join(a.data, "text", "tinystories_valid.txt")
    link = os.path.join(a.work, "calibration-text.txt")
    if not os.path.exists(link):
        os.symlink(os.path.abspath(text), link)
    wfile = os.path.join(a.work, name + ".calib.json")
    flags = ["--model", bin_path, "--windows", str(c["samples"]), "--skip", str(c["skip"]), "--context",
             str(c["context"]), "--continuation", str(c["continuation"]), "--sinks", str(sel["sinks"]), "--recent",
             str(sel["recent"]), "--obs-window", str(sel["obs_window"]), "--threads", "1"]
    subprocess.run([a.depthkv, "eval", *flags, "--text", link, "--profile",
                    os.path.join(RESULTS, name + ".profile.json"), "--windows-out", wfile],
                   check=True, capture_output=True)
    ratios = ",".join(f"{r:g}" for r in prof.keep_ratios)
    cli_out = os.path.join(a.work, name + ".cli.profile.json")
    t0 = time.perf_counter()
    subprocess.run([a.depthkv, "profile", *flags, "--text", text, "--scorers", ",".join(prof.scorers), "--ratios",
                    ratios, "-o", cli_out], check=True, capture_output=True)
    t_cli = time.perf_counter() - t0
    model = peer.to_hf(bin_path, "sdpa")
    t0 = time.perf_counter()
    hf = depthkv.hf.profile(model, None, wfile, keep_ratios=prof.keep_ratios.tolist(), scorer=list(prof.scorers),
                            protection=(sel["sinks"], sel["recent"]), window=sel["obs_window"], kernel=sel["kernel"],
                            n_windows=None)
    t_hf = time.perf_counter() - t0
    cli = depthkv.load_profile(cli_out)
    rel = max(float(np.max(np.abs(hf.curves(s) - cli.curves(s)) / np.abs(cli.curves(s)))) for s in prof.scorers)
    runs = c["samples"] * prof.n_layers * len(prof.keep_ratios) * len(prof.scorers)
    print(f"  profile timing: depthkv profile {t_cli:.1f} s, depthkv.hf.profile {t_hf:.1f} s ({runs} runs; "
          f"curves within {rel:.2e})", flush=True)
    return {"windows": [c["skip"], c["skip"] + c["samples"]], "scorers": list(prof.scorers),
            "ratios": prof.keep_ratios.tolist(), "runs": runs, "cli_s": t_cli, "hf_s": t_hf, "max_rel_diff": rel}


def fmt(x):
    return "failed" if x is None else f"{x:.5f}"


def keep_header(first, keeps):
    return [f"| {first} | " + " | ".join(f"keep {k}" for k in keeps) + " |",
            "|---" * (first.count("|") + 1) + "|" + "---|" * len(keeps)]


def peer_check(res, peer_rows, keeps):
    """The rows kvpress_peer also measured, beside its figures (relative difference)."""
    same = peer_rows.get("windows") == res["windows"]
    where = ("the same windows." if same else
             f"kvpress_peer measured windows {peer_rows.get('windows')}, not these: no comparison.")
    md = ["", "Against docs/results/kvpress_peer.json (relative difference of the KL; the issue's 2% check is the "
          "first row): " + where, ""] + keep_header("row here | kvpress_peer row", keeps)
    for label, r in (res["rows"].items() if same else []):
        ref_label = PEER_ROWS.get(label, label)
        ref = peer_rows["kl"].get(ref_label)
        if ref is None:
            continue
        cells = [f"{fmt(x)} vs {fmt(ref.get(str(k)))} ({x / ref[str(k)] - 1:+.2e})"
                 if x is not None and ref.get(str(k)) else f"{fmt(x)} vs {fmt(ref.get(str(k)))}"
                 for k, x in zip(keeps, r["kl"])]
        md.append(f"| {label} | {ref_label} | " + " | ".join(cells) + " |")
    return md


def model_section(res, peer_rows, keeps):
    """The markdown of one model: the KL table, the 2% check, the cache lengths, the timing."""
    md = [f"## {res['model']}", "",
          f"Evaluation windows {res['windows'][0]}..{res['windows'][1] - 1} (context {res['context']} + continuation "
          f"{res['continuation']}), full-cache NLL {res['nll_full']:.5f}.", ""] + keep_header("press", keeps)
    md += [f"| {label} | " + " | ".join(fmt(x) for x in r["kl"]) + " |" for label, r in res["rows"].items()]
    md += peer_check(res, peer_rows, keeps)
    md += ["", "Per-layer cache lengths after compression (the cache tensors' length of every layer, last window):",
           ""] + keep_header("press", keeps)
    md += [f"| {label} | " + " | ".join(" ".join(map(str, x)) if x else "" for x in r["lengths"]) + " |"
           for label, r in res["rows"].items() if label.startswith("DepthKVPress") or label in LENGTH_ROWS]
    t = res.get("timing")
    if t:
        md += ["", f"Profile time on calibration windows {t['windows'][0]}..{t['windows'][1] - 1} (scorers "
               f"{', '.join(t['scorers'])}, ratios {', '.join(f'{x:g}' for x in t['ratios'])}: {t['runs']} pruned "
               f"runs, one thread each): `depthkv profile` {t['cli_s']:.1f} s, `depthkv.hf.profile` {t['hf_s']:.1f} s "
               f"({t['hf_s'] / t['cli_s']:.2f}x); their layer curves agree within {t['max_rel_diff']:.2e} "
               "relative per point."]
    return md + [""]


def slim(rows):
    """The results without the per-window KL, except for the issue's check row (CHECK_ROW)."""
    out = []
    for res in rows:
        res = dict(res, rows={label: {k: v for k, v in r.items() if k != "kl_windows" or label == CHECK_ROW}
                              for label, r in res["rows"].items()})
        out.append(res)
    return out


def write_results(a, rows):
    peer = {r["model"]: r for r in json.load(open(os.path.join(RESULTS, "kvpress_peer.json")))}
    from importlib.metadata import version
    md = ["# DepthKVPress beside kvpress's presses (depthkv.hf.evaluate)", "",
          f"Written by `benchmarks/hf_press/run.py` (kvpress {version('kvpress')}, torch {torch.__version__}, "
          f"transformers {version('transformers')}, CPU, float32, {a.torch_threads} torch thread). Mean KL(full || "
          "pruned) over the continuation rows of every evaluation window, by `depthkv.hf.evaluate` (the prefill "
          "under the press, the continuation teacher-forced on the compressed cache at its original positions). "
          "Data: the llama2.c checkpoints of shared/models converted to Hugging Face Llama (kvpress_peer's `to_hf`), "
          "text shared/text/tinystories_valid.txt cut into token windows by `depthkv eval --windows-out`. The "
          "evaluation windows follow the profiles' calibration windows (disjoint). DepthKVPress's budgets come from "
          "docs/results/<model>.profile.json (optimal) and <model>.best.profile.json's head curves (head-optimal); "
          "its caches hold their budgets physically (head-optimal: the per-head tails masked). \"select_protection "
          "(0, 0)\": the kept tokens ranked by kvpress's SnapKV scores alone, as kvpress_peer's rows with depthkv's "
          "budgets do; the other DepthKVPress rows keep the profile's sinks and recent tokens in every head "
          "(the library's rule). kvpress's presses as in kvpress_peer (head-wise ones by an additive mask). "
          "kvpress's PyramidKV gives its layers different lengths at keep 0.5 (see the lengths below); "
          "kvpress_peer's run fails there (transformers builds every layer's mask with layer 0's width), here it runs "
          "because DepthKVPress's per-layer mask rule (depthkv._attention, installed on sdpa process-wide by the "
          "DepthKVPress rows before it) handles any per-layer lengths. The profile times are wall times on a "
          "shared 2-core machine: a rough comparison.", ""]
    for res in rows:
        md += model_section(res, peer.get(res["model"], {"kl": {}}), a.keep)
    out = a.out if os.path.isabs(a.out) else os.path.join(RESULTS, a.out)
    open(out + ".md", "w").write("\n".join(md))
    json.dump(slim(rows), open(out + ".json", "w"), indent=1)
    print(f"wrote {out}.md, {out}.json")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--depthkv", default=os.path.join(ROOT, "build", "release", "tools", "depthkv"))
    ap.add_argument("--data", default=os.environ.get("DEPTHKV_DATA_DIR", os.path.join(ROOT, "..", "shared")))
    ap.add_argument("--models", default="stories260K,aidreams260K")
    ap.add_argument("--keep", default="0.1,0.2,0.3,0.5")
    ap.add_argument("--windows", type=int, default=0, help="evaluation windows (default: kvpress_peer's)")
    ap.add_argument("--presses", default="", help="kvpress presses to run (default: all), comma-separated names")
    ap.add_argument("--no-timing", action="store_true", help="leave out the profile timing")
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--work", default="/tmp/hf_press")
    ap.add_argument("--out", default="hf_press", help="results name under docs/results/ (or an absolute path)")
    ap.add_argument("--from-json", default="", help="only rewrite the table from this results JSON")
    a = ap.parse_args()
    a.keep = [float(k) for k in a.keep.split(",")]
    if a.from_json:
        write_results(a, json.load(open(a.from_json)))
        return 0
    a.presses = [p for p in a.presses.split(",") if p]
    os.makedirs(a.work, exist_ok=True)
    torch.set_num_threads(a.torch_threads)
    peer = load_peer()
    import kvpress  # noqa: F401  (patches the attention functions; kvpress_peer's mask goes around it)
    peer.install_mask_patch()
    rows = []
    for name in a.models.split(","):
        print(f"== {name}", flush=True)
        res = run_model(a, name, peer)
        if not a.no_timing:
            res["timing"] = time_profiles(a, name, peer)
        rows.append(res)
    write_results(a, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
