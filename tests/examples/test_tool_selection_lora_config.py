"""The demo's LoRA config is the demo's job with trainer.lora set (its run is in benchmarks/)."""

from __future__ import annotations

from agentrl_sdk.pipeline import TrainConfig
from examples.tool_selection.train import HERE


def test_config_lora_is_the_demo_with_adapter_sync():
    full = TrainConfig.from_yaml(HERE / "config.yaml")
    lora = TrainConfig.from_yaml(HERE / "config_lora.yaml")

    assert full.trainer.lora is None
    assert lora.trainer.lora is not None and lora.trainer.lora.sync == "adapter"
    # Everything but the trainer, where the runs write and the experiment name is the same job.
    same = {"trainer", "checkpoint", "tracking"}
    assert lora.model_dump(exclude=same) == full.model_dump(exclude=same)
    assert lora.checkpoint.dir != full.checkpoint.dir
    assert lora.trainer.model_dump(exclude={"lora", "lr"}) == full.trainer.model_dump(
        exclude={"lora", "lr"})
