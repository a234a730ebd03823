"""TrainerConfig: cross-field checks name both fields; the learning-rate schedule."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

import agentrl_sdk.trainer as trainer
from agentrl_sdk.trainer import LoraConfig, TrainerConfig, TrainerGroup


def test_every_option_is_documented():
    assert all(f.description for f in TrainerConfig.model_fields.values())
    assert all(f.description for f in LoraConfig.model_fields.values())


def test_lora_from_a_dict_and_its_scaling():
    config = TrainerConfig(lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj"]})
    assert config.lora.scaling == 2.0 and config.lora.export == "merged"
    assert TrainerConfig().lora is None  # full fine-tuning by default


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"lr_schedule": "cosine"}, ("lr_schedule", "total_steps")),
        ({"warmup_steps": 5, "total_steps": 5}, ("warmup_steps", "total_steps")),
        ({"backend": "nccl"}, ("backend", "num_gpus_per_worker")),
        ({"lora": {}, "trainable_layers": 1}, ("lora", "trainable_layers")),
    ],
)
def test_cross_field_errors_name_both_fields(options, names):
    with pytest.raises(ValidationError) as info:
        TrainerConfig(**options)
    assert all(name in str(info.value) for name in names)


def test_unknown_option_is_rejected():
    with pytest.raises(ValidationError, match="micro_batch_size"):
        TrainerConfig(micro_batch_size=4)


def test_lr_schedules():
    const = TrainerConfig(warmup_steps=4)
    assert [const.lr_factor(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cos = TrainerConfig(lr_schedule="cosine", warmup_steps=2, total_steps=6, min_lr_ratio=0.1)
    expected = [0.5, 1.0] + [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p / 4)) for p in range(4)]
    assert [cos.lr_factor(s) for s in range(6)] == pytest.approx(expected)
    assert cos.lr_factor(2) == pytest.approx(1.0) and cos.lr_factor(100) == pytest.approx(0.1)


def test_missing_model_folder_fails_before_ray(tmp_path):
    with pytest.raises(FileNotFoundError, match="save_pretrained"):
        TrainerGroup(tmp_path / "nope")


def test_public_names():
    assert len(trainer.__all__) == len(set(trainer.__all__))
    assert all(hasattr(trainer, name) for name in trainer.__all__)
    assert {"TrainerConfig", "TrainerGroup", "WeightSync", "TrainerError"} <= set(trainer.__all__)


def test_the_trainer_temperature_is_the_rollouts():
    from agentrl_sdk.pipeline import TrainConfig
    from agentrl_sdk.pipeline.policies import trainer_options

    config = TrainConfig(rollout={"sampling": {"temperature": 0.7}})  # nothing else to set
    assert trainer_options(config).temperature == 0.7
    # Changed in code after the config was built:
    config.rollout.sampling = config.rollout.sampling.model_copy(update={"temperature": 0.6})
    assert trainer_options(config).temperature == 0.6
    assert TrainConfig(rollout={"sampling": {"temperature": 0.7}},
                       trainer={"temperature": 0.7}).trainer.temperature == 0.7  # still taken
    with pytest.raises(ValidationError, match=r"trainer.temperature \(0.5\) must equal "
                                              r"rollout.sampling.temperature \(0.7\)"):
        TrainConfig(rollout={"sampling": {"temperature": 0.7}}, trainer={"temperature": 0.5})


def test_a_ray_address_nobody_answers_at_fails_with_the_address_instead_of_hanging():
    import socket

    from agentrl_sdk.trainer.errors import TrainerError
    from agentrl_sdk.trainer.ray_cluster import _wait_reachable

    with socket.socket() as free:  # a port nothing listens on once closed
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(TrainerError, match=rf"ray_address='127.0.0.1:{port}' after 1 s"):
        _wait_reachable(f"127.0.0.1:{port}", timeout_s=1.0)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        _wait_reachable(f"127.0.0.1:{listening.getsockname()[1]}", timeout_s=1.0)
    _wait_reachable("auto", timeout_s=0.001)  # Ray's own forms are Ray's to resolve
