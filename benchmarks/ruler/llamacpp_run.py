"""The RULER-style suite through llama.cpp with depthkv's budgets (integrations/llama.cpp), beside the same method in
depthkv's engine, on the same token ids (protocol ``inside``: the question is part of the pruned prompt).

For every sample (tasks.py, sized in the model's tokens by ``depthkv.Engine.tokenize``) the prompt's ids go to
``llamacpp_generate`` (integrations/llama.cpp/build.sh builds it), which decodes ``MAX_NEW[task]`` greedy tokens:
  llamacpp-full            llama.cpp's own memory;
  llamacpp-snapkv-tiers    depthkv's uniform budgets, SnapKV, one tier for all layers (one position set);
  llamacpp-snapkv-layers   the same with one tier per layer (each layer its own position set);
and ``depthkv.Engine.generate`` runs
  full                     the full cache;
  snapkv-decode            SnapKV, uniform budgets, per layer and KV head, under a decode schedule with the
                           same chunk and interval: evicting after every chunk and every interval decoded tokens,
                           to the keep ratio of the tokens seen, as the adapter does.
Every method decodes all ``MAX_NEW[task]`` tokens (no stop at the end of the turn, as llamacpp_generate).
Every method: 4 sink and 16 recent tokens, observation window 16, kernel 7, max pooling; flash attention off in
llama.cpp. Rows in run.py's format (report.py renders them).

  python benchmarks/ruler/llamacpp_run.py --model SmolLM2.gguf --bin ~/.cache/depthkv/llama.cpp-0.3.36-tiered/build/bin \\
      --lengths 2048 --samples 2 --compressions 0.75 --out ruler.llamacpp.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import depthkv  # noqa: E402
from run import MAX_NEW, SELECTION  # noqa: E402
from tasks import CALIBRATION_SEEDS, REPORT_SEEDS, TASKS, make_sample, string_match_all  # noqa: E402


def llamacpp(args, ids_path: str, n_new: int, keep: float, grouping: str) -> list:
    """The tokens llamacpp_generate decodes after the prompt in `ids_path` (keep 1: llama.cpp's own memory)."""
    cmd = [os.path.join(args.bin, "llamacpp_generate"), args.model, "ids:" + ids_path, "0", str(n_new), str(keep),
           "uniform", "", "0", "snapkv", str(args.chunk), str(args.interval), str(args.threads), "0", grouping]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["tokens"]


def run(args) -> dict:
    eng = depthkv.Engine(args.model, n_threads=args.threads)
    count = lambda text: len(eng.tokenize(text))  # noqa: E731
    seeds = (CALIBRATION_SEEDS if args.seeds == "calibration" else REPORT_SEEDS)[: args.samples]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ids_path = os.path.join(tmp, "ids.txt")
        for length in args.lengths:
            for task in args.tasks:
                for seed in seeds:
                    s = make_sample(task, length, seed, count)
                    ids = eng.tokenize(s["context"]) + eng.tokenize(s["question"], bos=False)
                    with open(ids_path, "w") as f:
                        f.write(" ".join(map(str, ids)))
                    n_new = MAX_NEW[task]
                    cells = [("full", 0.0, lambda: eng.generate(ids, n_new, stop=False).tokens),
                             ("llamacpp-full", 0.0, lambda: llamacpp(args, ids_path, n_new, 1.0, "budget"))]
                    for comp in args.compressions:
                        keep = 1.0 - comp
                        spec = dict(SELECTION, scorer="snapkv", policy="uniform", budget={"keep": keep},
                                    schedule={"mode": "decode", "chunk": args.chunk, "interval": args.interval})
                        cells += [("snapkv-decode", comp, lambda spec=spec: eng.generate(ids, n_new, spec=spec, stop=False).tokens),
                                  ("llamacpp-snapkv-tiers", comp,
                                   lambda keep=keep: llamacpp(args, ids_path, n_new, keep, "budget")),
                                  ("llamacpp-snapkv-layers", comp,
                                   lambda keep=keep: llamacpp(args, ids_path, n_new, keep, "layer"))]
                    for method, comp, gen in cells:
                        t0 = time.time()
                        text = eng.detokenize(gen())
                        score = 100.0 * string_match_all(text, s["answers"])
                        rows.append({"length": length, "task": task, "seed": seed, "method": method,
                                     "compression": comp, "score": score, "n_context": len(ids), "n_question": 0,
                                     "answers": s["answers"], "output": text,
                                     "sample_seconds": round(time.time() - t0, 3)})
                        print(f"ruler-llamacpp: {length} {task} seed {seed} {method} c={comp:g}: {score:.0f} "
                              f"{text.strip()[:60]!r}", file=sys.stderr)
    return {"model": os.path.basename(args.model), "protocol": "inside", "seeds": args.seeds,
            "chunk": args.chunk, "interval": args.interval, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="GGUF model")
    p.add_argument("--bin", required=True, help="folder of llamacpp_generate (integrations/llama.cpp/build.sh)")
    p.add_argument("--lengths", type=lambda v: [int(x) for x in v.split(",")], default=[2048])
    p.add_argument("--tasks", type=lambda v: v.split(","), default=list(TASKS))
    p.add_argument("--samples", type=int, default=2, help="samples per task and length")
    p.add_argument("--seeds", choices=("report", "calibration"), default="report")
    p.add_argument("--compressions", type=lambda v: [float(x) for x in v.split(",")], default=[0.75])
    p.add_argument("--chunk", type=int, default=128, help="llama.cpp's ubatch and the engine's chunk")
    p.add_argument("--interval", type=int, default=16, help="decode tokens between evictions")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True, help="JSON file of the rows")
    args = p.parse_args(argv)
    for t in args.tasks:
        if t not in TASKS:
            p.error(f"unknown task {t!r}: one of {', '.join(TASKS)}")
    result = run(args)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
