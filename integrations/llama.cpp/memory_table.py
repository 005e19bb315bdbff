"""The table of memory_table.sh: one row per run of runs.jsonl, ratios against the stock run of the same model."""
import json
import sys


def main(path):
    runs = [json.loads(line) for line in open(path) if line.strip()]
    print("| model | tokens | run | tiers (layers x budget) | KV MiB | vs stock | peak RSS MiB | prefill tok/s | "
          "decode tok/s | vs stock | greedy tokens = stock |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        stock = next(s for s in runs if s["model"] == r["model"] and s["run"] == "stock full")
        same = 0
        for a, b in zip(r["tokens"], stock["tokens"]):
            if a != b:
                break
            same += 1
        tiers = ", ".join(f'{t["layers"]} x {t["budget"]}' for t in r["tiers"]) or "-"
        print(f'| {r["model"]} | {r["n_prompt"]} + {r["n_gen"]} | {r["run"]} | {tiers} | {r["kv_buffer_mib"]:.2f} | '
              f'{r["kv_buffer_mib"] / stock["kv_buffer_mib"]:.3f}x | {r["peak_rss_mib"]:.0f} | {r["prefill_tok_s"]:.0f} | '
              f'{r["decode_tok_s"]:.1f} | {r["decode_tok_s"] / stock["decode_tok_s"]:.2f}x | {same}/{len(stock["tokens"])} |')


if __name__ == "__main__":
    main(sys.argv[1])
