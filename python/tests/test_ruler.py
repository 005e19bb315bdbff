"""The RULER-style suite (benchmarks/ruler): samples sized in a model's tokens, deterministic per
seed, whose answers are in the context; RULER's string_match_all; and a small run of the suite on
stories260K through depthkv.Engine (the configuration CI runs)."""

import collections
import json
import os
import re
import sys

import pytest

import depthkv
from conftest import DATA, ROOT, data_path

sys.path.insert(0, os.path.join(ROOT, "benchmarks", "ruler"))
import report as ruler_report  # noqa: E402
import run as ruler_run  # noqa: E402
import tasks  # noqa: E402

STORIES_BIN = os.path.join(DATA, "models", "stories260K", "stories260K.bin")

pytestmark = pytest.mark.skipif(not hasattr(depthkv._core, "Engine"),
                                reason="depthkv was built without its engine (no PCRE2)")


@pytest.fixture(scope="module")
def engine():
    return depthkv.Engine(data_path("models/stories260K/stories260K.bin"), n_threads=1)


def test_string_match_all():
    assert tasks.string_match_all("The number is 1234567.", ["1234567"]) == 1.0
    assert tasks.string_match_all("the NUMBERS are 12 and 34", ["12", "34", "56"]) == pytest.approx(2 / 3)
    assert tasks.string_match_all("1234", ["1234567"]) == 0.0  # a number with digits dropped scores nothing
    assert tasks.string_match_all("Apple, RIVER", ["apple", "river"]) == 1.0  # case-insensitive


@pytest.mark.parametrize("task", tasks.TASKS)
def test_samples_fit_the_length_hold_their_answers_and_repeat(engine, task):
    count = lambda t: len(engine.tokenize(t))  # noqa: E731
    length = 480
    s = tasks.make_sample(task, length, 1000, count)
    assert s["n_context"] == count(s["context"]) and s["n_question"] == count(s["question"])
    total = s["n_context"] + s["n_question"]
    assert 0.75 * length <= total <= length, total  # sized to the target, never over it
    assert tasks.make_sample(task, length, 1000, count) == s  # the same seed, the same sample
    assert tasks.make_sample(task, length, 1001, count)["answers"] != s["answers"]
    ctx = s["context"]
    if task == "cwe":
        words = collections.Counter(re.findall(r"\d+\. (\w+)", ctx))
        assert len(s["answers"]) == 10
        rare = max(n for w, n in words.items() if w not in s["answers"])
        assert min(words[w] for w in s["answers"]) > rare  # the answers are the 10 most common words
    else:
        for a in s["answers"]:
            assert a in ctx
    if task.startswith("niah"):
        n_needles = {"niah_multikey_1": 4, "niah_multivalue": 4, "niah_multiquery": 4}.get(task, 1)
        assert ctx.count("One of the special magic numbers for") == n_needles
        assert all(re.fullmatch(r"\d{7}", a) for a in s["answers"])
    if task == "niah_single_2":
        assert tasks.NOISE not in ctx  # real prose, not the noise sentences
    if task == "vt":
        assert len(s["answers"]) == 5 and ctx.count("VAR ") == 5 + 4  # a chain of 4 hops
    with pytest.raises(ValueError, match="unknown task"):
        tasks.make_sample("niah", length, 0, count)
    with pytest.raises(ValueError, match="holds not even one haystack unit"):
        tasks.make_sample(task, 40, 1000, count)


def test_calibration_and_report_seeds_are_disjoint():
    assert not set(tasks.CALIBRATION_SEEDS) & set(tasks.REPORT_SEEDS)


def test_a_small_run_on_stories260k(engine, tmp_path):
    out = tmp_path / "ruler.json"
    assert ruler_run.main(["--model", STORIES_BIN, "--lengths", "400", "--tasks", "niah_single_1,niah_multivalue",
                           "--samples", "1",
                           "--methods", "full,snapkv,chunked", "--compressions", "0.5", "--threads", "1",
                           "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    # per task: the full cache once, then snapkv and chunked at the one compression
    assert [(r["task"], r["method"], r["compression"]) for r in rows] == [
        (t, m, c) for t in ("niah_single_1", "niah_multivalue") for m, c in (("full", 0.0), ("snapkv", 0.5), ("chunked", 0.5))]
    for r in rows:
        assert 0.0 <= r["score"] <= 100.0
        assert r["score"] == 100.0 * tasks.string_match_all(r["output"], r["answers"])
        assert r["n_context"] + r["n_question"] <= 400
    full = {r["task"]: r["kv_bytes"] for r in rows if r["method"] == "full"}
    for r in rows:
        if r["method"] == "snapkv":
            assert r["kv_bytes"] < full[r["task"]]  # the context was pruned
    md = (tmp_path / "ruler.md").read_text()
    assert "| 400 | niah_single_1 | snapkv |" in md and "c=0.5" in md
    assert ruler_report.summary(ruler_report.load([str(out)])).count("| 400 | snapkv |") == 1
    with pytest.raises(SystemExit):
        ruler_run.main(["--model", STORIES_BIN, "--tasks", "nope"])


def test_kvpress_side_on_stories260k(engine, tmp_path):
    """benchmarks/ruler/kvpress_run.py on stories260K (the kvpress_peer harness's Hugging Face
    conversion): run.py's samples and token ids; transformers' full cache reproduces depthkv's
    full-cache greedy tokens; each press keeps what it says (physically, or masked for AdaKV); one
    table merges run.py's and kvpress_run.py's files. Needs torch, transformers and kvpress (skipped
    without them, unless DEPTHKV_REQUIRE_HF=1)."""
    import importlib
    for name in ("torch", "transformers", "kvpress"):
        if os.environ.get("DEPTHKV_REQUIRE_HF") == "1":
            importlib.import_module(name)
        else:
            pytest.importorskip(name, reason=f"{name} is not installed (pip install -r python/requirements-hf.txt)")
    import kvpress_run

    task, length = "niah_single_1", 400
    presses = ["snapkv", "adakv", "pyramidkv", "depthkv"]
    out = tmp_path / "kvpress.json"
    assert kvpress_run.main(["--model", STORIES_BIN, "--lengths", str(length), "--tasks", task, "--samples", "1",
                             "--presses", ",".join(presses), "--compressions", "0.5", "--threads", "1",
                             "--profile", os.path.join(ROOT, "docs", "results", "stories260K.profile.json"),
                             "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert result["failed"] == {}
    assert (result["model"], result["protocol"], result["seeds"]) == ("stories260K.bin", "outside", "report")
    assert [(r["method"], r["compression"]) for r in rows] == (
        [("kvpress-full", 0.0)] + [("kvpress-" + p, 0.5) for p in presses])
    s = tasks.make_sample(task, length, 1000, lambda t: len(engine.tokenize(t)))
    ctx, q = engine.tokenize(s["context"]), engine.tokenize(s["question"], bos=False)
    for r in rows:  # run.py's sample and ids
        assert (r["seed"], r["n_context"], r["n_question"], r["answers"]) == (1000, len(ctx), len(q), s["answers"])
        assert 0.0 <= r["score"] <= 100.0
        assert r["score"] == 100.0 * tasks.string_match_all(r["output"], r["answers"])
        assert r["output"] == engine.detokenize(r["tokens"])
    full = rows[0]
    # transformers' full cache gives depthkv's full-cache greedy tokens on the same ids
    assert full["tokens"] == engine.generate(ctx, ruler_run.MAX_NEW[task], suffix_ids=q).tokens
    assert full["same_as_depthkv"] and result["consistency"]["equal"] == result["consistency"]["samples"] == 1
    assert full["kept_fraction"] == 1.0 and full["kv_slots"] == engine.n_layers * engine.n_kv_heads * len(ctx)
    by = {r["method"]: r for r in rows}
    tol = 1.0 / len(ctx)
    for p in ("snapkv", "pyramidkv", "depthkv"):  # physically smaller caches, half the context kept
        r = by["kvpress-" + p]
        assert not r["masked"] and r["kv_kept"] == r["kv_slots"] < full["kv_slots"], p
        assert abs(r["kept_fraction"] - 0.5) <= (0.02 if p == "pyramidkv" else tol), (p, r["kept_fraction"])
    ada = by["kvpress-adakv"]  # head-wise: the cache keeps its length, half of it masked
    assert ada["masked"] and ada["kv_slots"] == full["kv_slots"] and abs(ada["kept_fraction"] - 0.5) <= tol
    # one table of depthkv's (run.py) and kvpress's rows
    dk = tmp_path / "depthkv.json"
    assert ruler_run.main(["--model", STORIES_BIN, "--lengths", str(length), "--tasks", task, "--samples", "1",
                           "--methods", "full,snapkv", "--compressions", "0.5", "--threads", "1", "--out", str(dk)]) == 0
    assert ruler_report.main(["--out", str(tmp_path / "both"), "--no-plot", str(dk), str(out)]) == 0
    md = (tmp_path / "both.md").read_text()
    lines = [ln for ln in md.splitlines() if ln.startswith(f"| {length} | {task} |")]
    assert [ln.split("|")[3].strip() for ln in lines] == ["full", "snapkv", "kvpress-full", "kvpress-adakv (masked)",
                                                         "kvpress-depthkv", "kvpress-pyramidkv", "kvpress-snapkv"]
    assert all("+-" in ln.split("|")[4] for ln in lines)  # every method has its c=0.5 cell (full ones too)
    assert f"| {length} | kvpress-snapkv | {by['kvpress-snapkv']['score']:.1f} +- 0.0 |" in md  # the summary
    other = json.loads(out.read_text())
    other["protocol"] = "inside"
    (tmp_path / "inside.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit):
        ruler_report.load([str(dk), str(tmp_path / "inside.json")])
