"""depthkv.allocate and depthkv.preset against ``depthkv allocate --json`` (byte for byte)."""

import json
import os

import numpy as np
import pytest

import depthkv
from conftest import AIDREAMS_BEST, RESULTS, STORIES, run_cli

KEEPS = [0.1, 0.2, 0.3, 0.5]
# each profile with the selection its curves were measured under (its calibration.selection)
PROFILES = {"stories": (STORIES, (4, 16), 16), "aidreams-best": (AIDREAMS_BEST, (0, 4), 4)}
# the policies the library refuses on each: 6 middle layers of 5, no head curves; no InfoNCE scores
REFUSED = {"stories": {"mlma6", "head-optimal"}, "aidreams-best": {"mga", "mlma2", "mlma4", "mlma6"}}


def cli_text(alloc):
    """The JSON text ``depthkv allocate --json`` prints (nlohmann: sorted keys, indent 2), less the
    CLI's memory report (``kv_memory``, ``layer_window``: see ``allocation_part``)."""
    return json.dumps(alloc.to_dict(), indent=2, sort_keys=True) + "\n"


def allocation_part(out):
    """The CLI's JSON text without its memory report, which must count the allocation's tokens."""
    j = json.loads(out)
    mem = j.pop("kv_memory", None)  # the per-layer form prints it
    j.pop("layer_window", None)
    if "budgets" in j:
        assert mem is not None
        assert mem["tokens"] == j["total"] and mem["tokens_per_layer"] == j["budgets"]
    return json.dumps(j, indent=2, sort_keys=True) + "\n"


def cli_args(path, keep, policy, scorer, prot, window):
    args = ["allocate", "--profile", path, "--keep", repr(keep), "--policy", policy, "--json",
            "--sinks", str(prot[0]), "--recent", str(prot[1]), "--obs-window", str(window)]
    return args + (["--scorer", scorer] if scorer else [])


def error_text(stderr):
    """The message of the program's "depthkv: error: ..." line."""
    lines = [ln for ln in stderr.splitlines() if ln.startswith("depthkv: error: ")]
    assert lines, stderr
    return lines[-1][len("depthkv: error: "):]


@pytest.mark.parametrize("name", sorted(PROFILES))
@pytest.mark.parametrize("scorer", [None, "h2o", "snapkv"])
def test_every_policy_and_keep_equals_cli(cli, name, scorer):
    path, prot, window = PROFILES[name]
    prof = depthkv.load_profile(path)
    refused = set()
    for policy in depthkv.POLICIES:
        for keep in KEEPS:
            rc, out, err = run_cli(cli, *cli_args(path, keep, policy, scorer, prot, window))
            if rc != 0:  # the library refuses: Python must raise the same message
                with pytest.raises(depthkv.Error) as e:
                    depthkv.allocate(prof, keep, policy=policy, scorer=scorer, protection=prot, obs_window=window)
                assert str(e.value) == error_text(err), (policy, keep)
                refused.add(policy)
                continue
            a = depthkv.allocate(prof, keep, policy=policy, scorer=scorer, protection=prot, obs_window=window)
            assert cli_text(a) == allocation_part(out), (policy, keep)
            assert a.budgets.dtype == np.int32 and a.budgets.shape == (prof.n_layers,)
    assert refused == REFUSED[name]


def test_head_optimal_gives_head_budgets_of_exact_total():
    prof = depthkv.load_profile(AIDREAMS_BEST)
    a = depthkv.allocate(prof, 0.3, policy="head-optimal", scorer="snapkv", protection=(0, 4))
    H = prof.n_kv_heads("snapkv")
    assert a.head_budgets.shape == (prof.n_layers, H)
    assert a.total == int(a.head_budgets.sum()) == round(0.3 * 96 * prof.n_layers) * H
    assert a.budgets.tolist() == [int(np.floor(m + 0.5)) for m in a.head_budgets.mean(axis=1)]


def test_total_tokens_and_lengths(cli):
    prof = depthkv.load_profile(STORIES)
    by_keep = depthkv.allocate(prof, 0.25, policy="optimal", scorer="h2o")
    by_tokens = depthkv.allocate(prof, total_tokens=int(by_keep.total), policy="optimal", scorer="h2o")
    assert np.array_equal(by_keep.budgets, by_tokens.budgets)
    rc, out, _ = run_cli(cli, "allocate", "--profile", STORIES, "--keep", "0.2", "--length", "200",
                         "--policy", "pyramid", "--json")
    assert rc == 0
    a = depthkv.allocate(prof, 0.2, policy="pyramid", lengths=200)
    assert cli_text(a) == allocation_part(out)
    ragged = depthkv.allocate(prof, 0.2, policy="uniform", lengths=[100, 200, 300, 400, 500])
    assert ragged.lengths.tolist() == [100, 200, 300, 400, 500]
    assert ragged.total == round(0.2 * 1500)


def test_preset_best_equals_cli(cli):
    prof = depthkv.load_profile(AIDREAMS_BEST)
    for keep in KEEPS:
        spec = depthkv.preset("best", prof, keep, protection=(0, 4), obs_window=4)
        rc, out, err = run_cli(cli, "allocate", "--profile", AIDREAMS_BEST, "--keep", repr(keep), "--preset", "best",
                               "--json", "--sinks", "0", "--recent", "4", "--obs-window", "4")
        assert rc == 0, err
        assert f"--preset best: scorer {spec['scorer']} " in err
        for scorer, loss in spec.predicted.items():
            assert f"{scorer} {loss:.6g}" in err
        assert spec["policy"] == "head-optimal" and spec["output_aware"] is True and spec["lookahead"] == 32
        assert (spec["sinks"], spec["recent"], spec["budget"]) == (0, 4, {"keep": keep})
        a = depthkv.allocate(prof, keep, policy=spec["policy"], scorer=spec["scorer"], protection=(0, 4), obs_window=4)
        assert cli_text(a) == allocation_part(out)
    assert depthkv.preset("best", prof, 0.2, protection=(0, 4), lookahead=8)["lookahead"] == 8


def test_preset_refuses_a_profile_without_head_curves():
    with pytest.raises(depthkv.Error, match="no complete head curves"):
        depthkv.preset("best", depthkv.load_profile(STORIES), 0.2)
    with pytest.raises(depthkv.Error, match="unknown preset 'fastest'"):
        depthkv.preset("fastest", depthkv.load_profile(AIDREAMS_BEST), 0.2)


def test_preset_retrieval():
    """"retrieval": snapkv-keydiff head-optimal budgets, not output-aware, each head at least half the
    uniform budget; a profile without snapkv-keydiff head curves is refused."""
    assert depthkv.PRESETS == ["best", "retrieval"]
    prof = depthkv.load_profile(os.path.join(RESULTS, "smollm2.retrieval.profile.json"))
    spec = depthkv.preset("retrieval", prof, 0.25, lengths=4000)
    assert (spec["scorer"], spec["policy"], spec["lookahead"]) == ("snapkv-keydiff", "head-optimal", 32)
    assert not spec.get("output_aware", False)
    assert spec["safeguard"]["min_tokens"] == 500  # 0.5 * 0.25 * 4000
    assert list(spec.predicted) == ["snapkv-keydiff"]
    assert depthkv.preset("retrieval", prof, 0.1, lengths=400)["safeguard"]["min_tokens"] == -1  # 20 < 28: automatic
    with pytest.raises(depthkv.Error, match="no complete head curves of any of the scorers snapkv-keydiff"):
        depthkv.preset("retrieval", depthkv.load_profile(AIDREAMS_BEST), 0.2)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_tiers_equal_cli(cli, name):
    """depthkv.allocate(..., tiers=k) equals ``depthkv allocate --tiers k --json`` byte for byte."""
    path, prot, window = PROFILES[name]
    prof = depthkv.load_profile(path)
    for keep in KEEPS:
        for k in (1, 2, 3, 4):
            rc, out, err = run_cli(cli, *cli_args(path, keep, "optimal", "snapkv", prot, window), "--tiers", str(k))
            assert rc == 0, err
            a = depthkv.allocate(prof, keep, policy="optimal", scorer="snapkv", protection=prot, obs_window=window,
                                 tiers=k)
            assert cli_text(a) == allocation_part(out), (keep, k)
            assert a.tiers == k and a.tier.shape == (prof.n_layers,)
            assert len(set(a.tier.tolist())) <= k
            for t in set(a.tier.tolist()):  # a tier's budgets differ by at most one token
                b = a.budgets[a.tier == t]
                assert int(b.max()) - int(b.min()) <= 1
            assert a.total == int(a.budgets.sum())
    plain = depthkv.allocate(prof, 0.2, policy="optimal", scorer="snapkv", protection=prot, obs_window=window)
    assert plain.tiers == 0 and plain.tier is None and "tiers" not in plain.to_dict()
    with pytest.raises(depthkv.Error, match="only the optimal policy takes tiers, not uniform"):
        depthkv.allocate(prof, 0.2, policy="uniform", tiers=2)
    with pytest.raises(depthkv.Error, match="tiers must be >= 0"):
        depthkv.allocate(prof, 0.2, tiers=-1)
