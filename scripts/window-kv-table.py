#!/usr/bin/env python3
"""Physical KV memory of a model with sliding-window layers at several context lengths: the full
cache of an engine that stores every layer at full length, a sliding-window cache, a uniform keep
ratio on every layer at full length (a naive engine, as kvpress's presses), and depthkv's
architecture-aware allocation of the same budget (`depthkv allocate`: local layers capped at
their window - 1, the rest to the global layers). F16 keys and values.

  window-kv-table.py --profile P.json [--keep 0.1] [--policy uniform] [--lengths 4096,8192,32768]
"""
import argparse
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--keep", type=float, default=0.1)
    ap.add_argument("--policy", default="uniform")
    ap.add_argument("--lengths", default="4096,8192,32768")
    ap.add_argument("--cli", default=os.path.join(ROOT, "build/release/tools/depthkv"))
    a = ap.parse_args()
    k = a.keep
    print(f"| context | full, every layer at full length | full, sliding-window cache | keep {k} on every layer "
          f"(naive) | depthkv keep {k}, architecture-aware ({a.policy}) | its global layers hold |")
    print("|---|---|---|---|---|---|")
    for n in map(int, a.lengths.split(",")):
        out = subprocess.run([a.cli, "allocate", "--profile", a.profile, "--keep", str(k), "--policy", a.policy,
                              "--length", str(n), "--json"], check=True, capture_output=True, text=True).stdout
        j = json.loads(out)
        m = j["kv_memory"]
        mib = lambda t: "%.1f MiB" % (t * m["bytes_per_token"] / 2**20)
        glob = [t for t, w in zip(j["budgets"], j.get("layer_window", [0] * len(j["budgets"]))) if w == 0]
        print(f"| {n} | {mib(m['full_naive_tokens'])} | {mib(m['full_windowed_tokens'])} | "
              f"{mib(m['uniform_naive_tokens'])} | {mib(m['tokens'])} | "
              f"{min(glob)}-{max(glob)} tokens ({max(glob) / n:.2f} of the context) |")


if __name__ == "__main__":
    main()
