"""Policies as LoRA adapters of one base: the config rules of ``adapter_of`` and the metrics of
a shared engine pool (reported once, by the default policy)."""

from __future__ import annotations

import pytest

from agentrl_sdk.engines import EnginePool, TorchEngine
from agentrl_sdk.engines.adapter_view import AdapterView
from agentrl_sdk.engines.gate import WeightGate
from agentrl_sdk.pipeline import TrainConfig
from agentrl_sdk.pipeline.policies import Policy
from tests.engines._tiny import id_model

LORA = {"rank": 4, "alpha": 8.0}


def test_adapter_of_needs_lora_and_no_weights_of_its_own():
    config = TrainConfig.model_validate({
        "trainer": {"lora": LORA},
        "policies": {"a": {"adapter_of": "default"}, "b": {"adapter_of": "default",
                                                           "trained": False}, "c": {"path": "x"}},
    })  # fmt: skip
    assert config.adapter_policies == ["a", "b"]
    with pytest.raises(ValueError, match="adapter_of, which needs trainer.lora"):
        TrainConfig.model_validate({"policies": {"a": {"adapter_of": "default"}}})
    with pytest.raises(ValueError, match="set no path or builder"):
        TrainConfig.model_validate({"trainer": {"lora": LORA},
                                    "policies": {"a": {"adapter_of": "default", "path": "x"}}})
    with pytest.raises(ValueError, match="adapter_of"):
        TrainConfig.model_validate({"trainer": {"lora": LORA},
                                    "policies": {"a": {"adapter_of": "c"}, "c": {"path": "x"}}})


def test_a_shared_pool_reports_its_counts_once():
    pool = EnginePool([TorchEngine(id_model())])
    try:
        views = {name: AdapterView(pool, name) for name in ("default", "a")}
        policies = {name: Policy(name, "p", view, WeightGate(view)) for name, view in views.items()}
        assert set(policies["default"].engine_metrics()) == {f"engine/{k}" for k in pool.stats()}
        assert policies["a"].engine_metrics() == {}
        alone = Policy("b", "p", pool, WeightGate(pool))
        assert set(alone.engine_metrics()) == {f"engine/b/{k}" for k in pool.stats()}
    finally:
        pool.close()
