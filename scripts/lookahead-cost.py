#!/usr/bin/env python3
"""The lookahead's cost per prompt in `depthkv generate --preset best`: its decode steps and time
against the prompt's prefill, beside the KL it buys (docs/results/robust.md: the preset with and
without its lookahead on the calibration kinds, both protocols).

For each model, 8 consecutive prompts cut from tinystories_valid.txt from character 600,000 on,
each near the model's evaluation context in tokens (384 and 96) (a timing only: no setting is chosen on it), `generate --keep 0.3 --preset best --threads 1 -t 0`, 3 runs per prompt
(the fastest kept); the prefill and lookahead times come from generate's own lines.

Usage: scripts/lookahead-cost.py [build dir] > docs/results/lookahead-cost.md
(DEPTHKV_DATA_DIR: the data folder, default ../shared)"""
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "release")
DK = os.path.join(BUILD, "tools", "depthkv")
DATA = os.environ.get("DEPTHKV_DATA_DIR", os.path.join(ROOT, "..", "shared"))
TEXT = open(os.path.join(DATA, "text", "tinystories_valid.txt"), encoding="utf-8").read()
# model, prompt characters (about its evaluation context: 384 and 96 tokens)
MODELS = (("stories260K", 850), ("aidreams260K", 145))
N_PROMPTS, RUNS, OFFSET = 8, 3, 600_000
PREFILL = re.compile(r"prefill: (\d+) tokens in ([0-9.]+) ms")
LOOK = re.compile(r"lookahead: (\d+) decode steps on the full prompt cache .* in ([0-9.]+) ms")
TRUST = re.compile(r"normalized NLL of the prompt's last \d+ tokens ([0-9.]+)")


def run(model, prompt):
    profile = os.path.join(ROOT, "docs", "results", model + ".best.profile.json")
    cmd = [DK, "generate", "--model", os.path.join(DATA, "models", model, model + ".bin"), "--prompt", prompt,
           "-t", "0", "-n", "0", "--keep", "0.3", "--preset", "best", "--profile", profile, "--threads", "1"]
    err = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    p, lk = PREFILL.search(err), LOOK.search(err)
    if not lk:
        return None  # the per-input rule fell back: no lookahead ran
    return int(p.group(1)), float(p.group(2)), int(lk.group(1)), float(lk.group(2)), float(TRUST.search(err).group(1))


out = ["# The lookahead's cost per prompt (`generate --preset best`)\n",
       "Written by `scripts/lookahead-cost.py` (Release build, one thread, fastest of "
       f"{RUNS} runs per prompt; {N_PROMPTS} consecutive prompts of tinystories_valid.txt from character "
       f"{OFFSET:,} on, `--keep 0.3`). The lookahead is the preset's 32 greedy decode steps on the full "
       "prompt cache before the eviction; its time is generate's `lookahead:` line, the prefill's its "
       "`prefill:` line.\n",
       "| model | prompt tokens (mean) | prefill ms (median) | lookahead steps | lookahead ms (median) | "
       "lookahead / prefill (median, range) | prompts served by the fallback |",
       "|---|---|---|---|---|---|---|"]
for model, chars in MODELS:
    res, fell = [], 0
    for i in range(N_PROMPTS):
        prompt = TEXT[OFFSET + i * chars: OFFSET + (i + 1) * chars]
        runs = [run(model, prompt) for _ in range(RUNS)]
        if runs[0] is None:
            fell += 1
            continue
        res.append((runs[0][0], min(r[1] for r in runs), runs[0][2], min(r[3] for r in runs)))
        assert runs[0][2] == 32, f"{model} prompt {i}: lookahead {runs[0][2]} (prompt too long for the model)"
    frac = [r[3] / r[1] for r in res]
    out.append(f"| {model} | {statistics.mean(r[0] for r in res):.0f} | {statistics.median(r[1] for r in res):.1f} | "
               f"{res[0][2]} | {statistics.median(r[3] for r in res):.1f} | {statistics.median(frac):.2f} "
               f"({min(frac):.2f}-{max(frac):.2f}) | {fell} of {N_PROMPTS} |")
out.append(f"\nLoad average (1/5/15 min) at the end: {' / '.join(f'{x:.1f}' for x in os.getloadavg())} on "
           f"{os.cpu_count()} cores.")
print("\n".join(out))
