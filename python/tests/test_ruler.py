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
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks", "ruler"))
import run as ruler_run  # noqa: E402
import tasks  # noqa: E402

DATA = os.environ.get("DEPTHKV_DATA_DIR") or os.path.join(ROOT, "..", "shared")
STORIES_BIN = os.path.join(DATA, "models", "stories260K", "stories260K.bin")

pytestmark = pytest.mark.skipif(not hasattr(depthkv._core, "Engine"),
                                reason="depthkv was built without its engine (no PCRE2)")


@pytest.fixture(scope="module")
def engine():
    if not os.path.exists(STORIES_BIN):
        pytest.skip(f"{STORIES_BIN} is missing (the shared/ folder beside the checkout)")
    return depthkv.Engine(STORIES_BIN, n_threads=1)


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
    assert ruler_run.merged_table([str(out), str(out)]).count("| 400 | niah_single_1 | snapkv |") == 1
    with pytest.raises(SystemExit):
        ruler_run.main(["--model", STORIES_BIN, "--tasks", "nope"])
