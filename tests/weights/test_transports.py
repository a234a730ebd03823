"""The weight-transport registry: the config's choices are its names, and what each entry says
(Ray or not, the kinds it tries) is what the config and `WeightSync` do."""

from __future__ import annotations

from typing import get_args

import pytest

from agentrl_sdk.trainer.config import TrainerConfig
from agentrl_sdk.weights import TRANSPORTS, TransportName, WeightKind


def test_the_config_choices_are_the_registry_names():
    choices = get_args(TrainerConfig.model_fields["weight_transport"].annotation)
    assert choices == get_args(TransportName) == tuple(TRANSPORTS)
    assert choices == ("auto", "collective", "object_store", "driver")
    description = TrainerConfig.model_fields["weight_transport"].description
    for name, transport in TRANSPORTS.items():  # each summary reaches the reference
        assert f"'{name}': {transport.summary}" in description


def test_every_transport_falls_back_to_the_driver_last():
    for transport in TRANSPORTS.values():
        assert set(transport.kinds) <= set(get_args(WeightKind))
        assert transport.kinds[-1] == "state_dict"  # every engine takes tensors


@pytest.mark.parametrize("name", tuple(TRANSPORTS))
def test_a_transport_needing_ray_is_refused_in_process(name):
    if TRANSPORTS[name].needs_ray:
        with pytest.raises(ValueError, match=f"weight_transport '{name}' need placement: ray"):
            TrainerConfig(placement="in_process", weight_transport=name)
    else:
        assert TrainerConfig(placement="in_process", weight_transport=name).weight_transport \
            == name
