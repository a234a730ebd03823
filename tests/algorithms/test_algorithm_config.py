"""`AlgorithmConfig.estimator`: each estimator built from the config gets its own options and
no other's; another estimator's options set in the config are refused."""

from __future__ import annotations

from dataclasses import replace
from typing import get_args

import pytest
import torch

from agentrl_sdk.algorithms import EstimatorName, Sequences, make_estimator
from agentrl_sdk.algorithms.config import AlgorithmConfig

SEQS = Sequences(
    rewards=torch.tensor([1.0, 0.0, 5.0], dtype=torch.float64),
    rollout=torch.tensor([0, 1, 2]),
    group_ids=["g", "g", "h"],
    mask=torch.ones(3, 2),
    step_rewards=torch.tensor([1.0, 0.0, 5.0], dtype=torch.float64),
    anchor_ids=["a", "a", "b"],
    values=torch.zeros(3, 2),
)


@pytest.mark.parametrize("name", get_args(EstimatorName))
def test_each_estimator_of_a_default_config_is_the_registrys_default_and_runs(name):
    estimator = AlgorithmConfig(advantage_estimator=name).estimator
    assert estimator == make_estimator(name)
    assert estimator(SEQS).advantages.shape == (3, 2)


def test_step_level_builds_the_step_estimator_over_the_baseline():
    config = AlgorithmConfig(advantage_estimator="rloo",
                             step_level={"enabled": True, "gamma": 0.5, "anchor_weight": 1.0})
    estimator = config.estimator
    assert estimator == make_estimator("step", baseline="rloo", gamma=0.5, omega=1.0)
    assert estimator(SEQS).advantages.shape == (3, 2)


def test_each_estimator_gets_its_own_options():
    gae = AlgorithmConfig(advantage_estimator="gae", gae={"lam": 0.9, "whiten": False})
    assert gae.estimator == make_estimator("gae", lam=0.9, whiten=False)
    tree = AlgorithmConfig(advantage_estimator="tree", tree_levels="branch")
    assert tree.estimator == make_estimator("tree", levels="branch")
    assert tree.estimator(replace(SEQS, values=None)).advantages.shape == (3, 2)


@pytest.mark.parametrize(("options", "message"), [
    ({"gae": {"lam": 0.9}}, r"algorithm.gae holds options of advantage_estimator 'gae' alone, "
     r"but the estimator chosen is 'grpo': leave gae unset or choose advantage_estimator: gae"),
    ({"advantage_estimator": "gae", "tree_levels": "branch"},
     r"algorithm.tree_levels holds options of advantage_estimator 'tree' alone, but the "
     r"estimator chosen is 'gae'"),
    ({"step_level": {"enabled": True}, "gae": {"whiten": False}},
     r"estimator chosen is step-level credit over 'grpo'"),
])  # fmt: skip
def test_another_estimators_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        AlgorithmConfig(**options)


def test_defaults_written_out_are_not_another_estimators_options():
    # A dumped config names every field: reloading it must not count the defaults as set.
    config = AlgorithmConfig(advantage_estimator="tree", tree_levels="branch")
    assert AlgorithmConfig.model_validate(config.model_dump()) == config
    assert AlgorithmConfig(gae={"gamma": 1.0, "lam": 1.0, "whiten": True}).estimator == \
        make_estimator("grpo")
