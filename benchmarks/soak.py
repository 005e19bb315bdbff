#!/usr/bin/env python3
"""Long runs keep their memory and their answers: `depthkv generate` decodes --tokens tokens
greedily past end-of-generation tokens (--ignore-eos) under a bounded KV cache (--max-kv-tokens B:
the schedule evicts after every --interval decoded tokens), once with 1 thread and once with 2,
and reports every --every decoded tokens (--stats-every) the resident memory, the KV bytes and
the tokens held. Standard library only.

Checks (each a line PASS or FAIL; exit 1 on any FAIL):
  bound   at every report the tokens held over all layers are at most B + layers x interval (the
          schedule's guarantee: B after each eviction, at most one interval more per layer before
          the next);
  flat    the resident memory at every report after the first stays within --rss-tolerance
          (default 5%) of the first report's (the cache reaches its budget before the first report
          when B <= layers x (prompt + every));
  same    the two runs print the same text (greedy decoding on 1 and 2 threads: the same tokens);
  length  each run decoded all --tokens tokens.

B defaults to --keep (0.1) x layers x (prompt + tokens): a cache of a tenth of the full one at the
end. --json writes the settings, the commit, every report and the verdicts.

A missing model fails with a message, or exits 77 after "SKIP: ..." with DEPTHKV_SKIP_MISSING_DATA=1.

usage: soak.py --bin DEPTHKV [--model GGUF] [--layers 30] [--tokens 8000] [--every 1000] [--keep 0.1]
               [--interval 32] [--scorer snapkv] [--prompt TEXT] [--rss-tolerance 0.05] [--json FILE]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

STATS = re.compile(r"^stats: decoded (\d+), position (\d+), rss ([0-9.]+) MiB, kv (\d+) bytes, held (\d+) tokens "
                   r"\(largest layer (\d+)\)(?:, bound (\d+))?$")
PROMPT = "The history of the printing press"


def default_model() -> str:
    d = os.environ.get("DEPTHKV_MODEL_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "depthkv", "models")
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def run(a, threads: int, budget: int) -> dict:
    cmd = [a.bin, "generate", "-m", a.model, "-i", a.prompt, "-n", str(a.steps), "-t", "0", "--ignore-eos",
           "--scorer", a.scorer, "--max-kv-tokens", str(budget), "--interval", str(a.interval),
           "--stats-every", str(a.every), "--threads", str(threads)]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    seconds = time.time() - t0
    if r.returncode != 0:
        sys.exit(f"soak: {' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[-500:]}")
    reports = []
    for line in r.stderr.splitlines():
        m = STATS.match(line)
        if m:
            d, p, rss, kv, held, largest, bound = m.groups()
            reports.append({"decoded": int(d), "position": int(p), "rss_mib": float(rss), "kv_bytes": int(kv),
                            "held": int(held), "largest_layer": int(largest), "bound": int(bound)})
    decode = re.search(r"decode: (\d+) tokens in [0-9.]+ ms \(([0-9.]+) tok/s\)", r.stderr)
    return {"threads": threads, "command": cmd, "seconds": round(seconds, 2), "text": r.stdout, "reports": reports,
            "decoded": int(decode.group(1)) if decode else 0, "decode_tok_s": float(decode.group(2)) if decode else 0.0}


def prompt_positions(a) -> int:
    """The positions generate prefills for the prompt (its tokens, BOS included): one decoded token's
    report gives them."""
    cmd = [a.bin, "generate", "-m", a.model, "-i", a.prompt, "-n", "0", "-t", "0", "--ignore-eos", "--stats-every", "1"]
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        for line in proc.stderr:
            m = STATS.match(line.strip())
            if m:
                proc.kill()
                return int(m.group(2)) - int(m.group(1))
    sys.exit(f"soak: {' '.join(cmd)} reported no decoded token")


def checks(a, runs) -> list:
    out = []
    for r in runs:
        t = r["threads"]
        over = [x for x in r["reports"] if x["held"] > x["bound"]]
        out.append(("bound", t, not over and bool(r["reports"]),
                    f"{len(r['reports'])} reports, held at most {max((x['held'] for x in r['reports']), default=0)} "
                    f"tokens, bound {r['reports'][0]['bound'] if r['reports'] else '-'}"))
        rss = [x["rss_mib"] for x in r["reports"]]
        drift = (max(rss) - min(rss)) / rss[0] if rss else float("inf")
        out.append(("flat", t, drift <= a.rss_tolerance,
                    f"resident memory {min(rss, default=0):.1f}..{max(rss, default=0):.1f} MiB over the reports, "
                    f"{100 * drift:.2f}% of the first (tolerance {100 * a.rss_tolerance:g}%)"))
        out.append(("length", t, r["decoded"] == a.tokens, f"decoded {r['decoded']} of {a.tokens} tokens"))
    same = runs[0]["text"] == runs[1]["text"]
    out.append(("same", "1,2", same, f"{len(runs[0]['text'])} and {len(runs[1]['text'])} bytes of text, "
                + ("identical" if same else "different")))
    return out


def commit() -> str:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True, help="the depthkv program")
    p.add_argument("--model", default=default_model())
    p.add_argument("--layers", type=int, default=30, help="the model's layers (SmolLM2-135M: 30), for the budget")
    p.add_argument("--tokens", type=int, default=8000)
    p.add_argument("--every", type=int, default=1000)
    p.add_argument("--keep", type=float, default=0.1)
    p.add_argument("--interval", type=int, default=32)
    p.add_argument("--scorer", default="snapkv")
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--rss-tolerance", type=float, default=0.05)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--json")
    a = p.parse_args(argv)
    if a.tokens < a.every or a.every < 1 or not 0 < a.keep <= 1 or a.layers < 1:
        p.error("need 1 <= --every <= --tokens, 0 < --keep <= 1 and --layers >= 1")
    if not os.path.isfile(a.model):
        msg = f"{a.model} is missing (scripts/get-models.sh fetches it)"
        if os.environ.get("DEPTHKV_SKIP_MISSING_DATA") == "1":
            print(f"SKIP: soak: {msg}")
            return 77
        print(f"soak: {msg}", file=sys.stderr)
        return 1
    a.steps = prompt_positions(a) + a.tokens  # generate runs the prompt's positions, then decodes the rest
    budget = round(a.keep * a.layers * a.steps)
    runs = [run(a, t, budget) for t in (1, 2)]
    verdicts = checks(a, runs)
    print(f"soak: {os.path.basename(a.model)}, {a.tokens} tokens decoded greedily, max {budget} KV tokens "
          f"(keep {a.keep:g} of {a.layers} layers x {a.steps} positions), interval {a.interval}, scorer {a.scorer}")
    for r in runs:
        print(f"  {r['threads']} thread(s): {r['seconds']:.1f} s, decode {r['decode_tok_s']:.1f} tok/s")
        for x in r["reports"]:
            print(f"    decoded {x['decoded']:>6}: rss {x['rss_mib']:.1f} MiB, kv {x['kv_bytes']} bytes, "
                  f"held {x['held']} of at most {x['bound']} tokens")
    for name, t, ok, what in verdicts:
        print(f"  {'PASS' if ok else 'FAIL'} {name} ({t} thread(s)): {what}")
    if a.json:
        doc = {"commit": commit(), "model": os.path.basename(a.model), "tokens": a.tokens, "every": a.every,
               "keep": a.keep, "layers": a.layers, "max_kv_tokens": budget, "interval": a.interval, "scorer": a.scorer,
               "prompt": a.prompt, "rss_tolerance": a.rss_tolerance,
               "runs": [{k: v for k, v in r.items() if k != "text"} for r in runs],
               "verdicts": [{"check": n, "threads": t, "pass": ok, "what": w} for n, t, ok, w in verdicts]}
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, a.json)
    return 0 if all(ok for _, _, ok, _ in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
