"""Bad requests to depthkv.allocate raise depthkv.Error (a ValueError) with the library's message."""

import math

import pytest

import depthkv
from conftest import AIDREAMS_BEST, STORIES


@pytest.fixture(scope="module")
def stories():
    return depthkv.load_profile(STORIES)


def test_error_is_a_value_error():
    assert issubclass(depthkv.Error, ValueError)
    assert depthkv.Error.__module__ == "depthkv"


@pytest.mark.parametrize("keep", [0.0, -0.1, 1.5, math.nan, math.inf])
def test_keep_outside_unit_interval(stories, keep):
    with pytest.raises(depthkv.Error, match=r"allocate: keep .* outside \(0, 1\]"):
        depthkv.allocate(stories, keep)


@pytest.mark.parametrize("kwargs, message", [
    (dict(keep=0.2, policy="greedy"), "unknown allocation policy 'greedy' \\(expected uniform, pyramid"),
    (dict(keep=0.2, scorer="tova"), "no measurements for scorer 'tova'"),
    (dict(keep=0.2, total_tokens=100), "exactly one of keep and total_tokens"),
    (dict(total_tokens=-5), "total_tokens -5 is negative"),
    (dict(keep=0.2, lengths=[384, 384]), "lengths has 2 entries, the profile 5 layers"),
    (dict(keep=0.2, protection=(4, -1)), "protection must be >= 0"),
    (dict(keep=0.2, protection=4), "protection must be \\(n_sink, n_recent\\)"),
    (dict(keep=0.01), "infeasible"),
    (dict(keep=0.2, policy="head-optimal"), "no head curves for scorer 'h2o'"),
    (dict(keep=0.2, min_tokens=-2), "min_tokens must be"),
])
def test_bad_request(stories, kwargs, message):
    with pytest.raises(depthkv.Error, match=message):
        depthkv.allocate(stories, **kwargs)


def test_policy_without_its_data():
    with pytest.raises(depthkv.Error, match="needs the profile's 'infonce/post_attn' scores"):
        depthkv.allocate(depthkv.load_profile(AIDREAMS_BEST), 0.2, policy="mga", protection=(0, 4))


def test_to_dict_needs_the_cli_form(stories):
    with pytest.raises(depthkv.Error, match="keep ratio and equal lengths"):
        depthkv.allocate(stories, 0.2, policy="uniform", lengths=[100, 200, 300, 400, 500]).to_dict()
