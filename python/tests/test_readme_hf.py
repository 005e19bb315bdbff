"""The README's "Use depthkv with a Hugging Face model" example, run as written on the Hugging Face
conversion of stories260K (its code block is read from README.md, so the README cannot drift from
what works). Needs torch, transformers and kvpress, as test_kvpress.py."""

import os
import re

import pytest

from test_kvpress import TEXT, models, peer, tokenizer  # noqa: F401 (fixtures)

from conftest import need_module  # noqa: E402
torch = need_module("torch")

import depthkv  # noqa: E402
from conftest import ROOT  # noqa: E402

HEADING = "## Use depthkv with a Hugging Face model"


def readme_example():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert HEADING in readme, "the README lost its Hugging Face section"
    section = readme[readme.index(HEADING):]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "no python code block in the README's Hugging Face section"
    return m.group(1)


def test_readme_example_runs(models, tokenizer, tmp_path, monkeypatch):  # noqa: F811
    model = models["sdpa"]
    model.generation_config.eos_token_id = 2
    with open(TEXT, encoding="utf-8") as f:
        texts = [f.read(60000)]
        context = f.read(1500)
    monkeypatch.chdir(tmp_path)
    scope = {"model": model, "tokenizer": tokenizer, "texts": texts, "context": context,
             "question": "Where did the girl go?"}
    exec(compile(readme_example(), "README.md", "exec"), scope)
    assert isinstance(scope["answer"], str) and scope["answer"].strip()
    written = depthkv.load_profile(tmp_path / "model.profile.json")
    assert written.n_layers == model.config.num_hidden_layers
    report = scope["report"]
    assert len(report) == model.config.num_hidden_layers
    n = report[0]["length"]
    budgets = depthkv.allocate(written, keep=0.2, policy="optimal", lengths=[n] * written.n_layers).budgets.tolist()
    assert [r["physical"] for r in report] == budgets
