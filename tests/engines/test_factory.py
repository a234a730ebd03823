"""create_engine and the engine config: backends by name, pools of replicas, config checks."""

from __future__ import annotations

import pytest
import torch

from agentrl_sdk.engines import EnginePool, TorchEngine, create_engine
from agentrl_sdk.engines.vllm.weights import write_buckets
from agentrl_sdk.pipeline.config import EngineConfig, TrainConfig
from agentrl_sdk.types import GenerateResult
from tests.engines._tiny import tiny_model_dir


def test_unknown_backend_names_the_available_ones() -> None:
    with pytest.raises(ValueError, match="'torch', 'vllm', 'vllm-server'"):
        create_engine("tgi", "/nowhere")


def test_the_config_choices_are_the_registrys_backends() -> None:
    from typing import get_args

    from agentrl_sdk.engines.options import BACKENDS
    from agentrl_sdk.engines.torch.engine import TorchEngine as Torch
    from agentrl_sdk.engines.vllm.engine import VLLMEngine
    from agentrl_sdk.engines.vllm.server import VLLMServerEngine

    assert get_args(EngineConfig.model_fields["backend"].annotation) == tuple(BACKENDS)
    built = {name: backend.build() for name, backend in BACKENDS.items()}
    assert built == {"torch": Torch.from_pretrained, "vllm": VLLMEngine,
                     "vllm-server": VLLMServerEngine}  # fmt: skip
    for name in BACKENDS:  # each name's options model is the one its section takes
        section = EngineConfig(backend=name)
        assert type(section.options) is BACKENDS[name].options


def test_replicas_build_a_pool_of_engines() -> None:
    section = EngineConfig(replicas=2, max_batch_size=4, health_timeout_s=5, restart_timeout_s=9)
    pool = create_engine("torch", str(tiny_model_dir(0)), **section.create_kwargs())
    try:
        assert isinstance(pool, EnginePool)
        assert [type(r) for r in pool.replicas] == [TorchEngine, TorchEngine]
        assert (pool._health_timeout, pool._restart_timeout) == (5.0, 9.0)  # the config's
    finally:
        pool.close()


def test_engine_config_defaults_to_one_torch_engine() -> None:
    config = TrainConfig().engine
    assert (config.backend, config.replicas) == ("torch", 1)
    assert config.create_kwargs() == {"replicas": 1, "ray_actors": False, "max_restarts": 3,
                                      "health_timeout_s": 30.0, "restart_timeout_s": 600.0,
                                      "max_batch_size": 64}  # fmt: skip
    server = EngineConfig(backend="vllm-server", url="http://127.0.0.1:8000",
                          options={"start_timeout_s": 60})  # fmt: skip
    assert server.create_kwargs()["url"] == "http://127.0.0.1:8000"
    with pytest.raises(ValueError, match="engine.url is for backend 'vllm-server'"):
        EngineConfig(backend="vllm", url="http://127.0.0.1:8000")


def test_generate_result_versions_default_to_the_policy_version() -> None:
    plain = GenerateResult(token_ids=[1, 2], logprobs=[-1.0, -2.0], finish_reason="stop",
                           policy_version=3)  # fmt: skip
    assert plain.versions == [3, 3]
    mixed = plain.model_copy(update={"token_versions": [2, 3]})
    assert mixed.versions == [2, 3]
    with pytest.raises(ValueError, match="token_versions"):
        GenerateResult(token_ids=[1], logprobs=[0.0], finish_reason="stop", policy_version=0,
                       token_versions=[0, 1])  # fmt: skip


def test_weight_buckets_split_by_size_and_keep_tied_tensors(tmp_path) -> None:
    from safetensors.torch import load_file

    shared = torch.randn(8, 4)
    state = {"embed.weight": shared, "head.weight": shared, "b": torch.ones(100)}
    paths = write_buckets(state, tmp_path, bucket_bytes=200)
    assert len(paths) == 3  # 128 + 128 bytes overflow a 200-byte bucket; b (400) goes alone
    loaded = {k: v for p in paths for k, v in load_file(p).items()}
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_engine_options_are_typed_per_backend() -> None:
    from agentrl_sdk.engines.options import TorchOptions, VLLMOptions, VLLMServerOptions

    assert isinstance(TrainConfig().engine.options, TorchOptions)
    vllm = EngineConfig(backend="vllm", options={"dtype": "bfloat16", "cpu_threads": 2})
    assert isinstance(vllm.options, VLLMOptions)
    assert vllm.create_kwargs() == {"replicas": 1, "ray_actors": False, "max_restarts": 3,
                                    "health_timeout_s": 30.0, "restart_timeout_s": 600.0,
                                    "max_batch_size": 64, "dtype": "bfloat16",
                                    "cpu_threads": 2}  # fmt: skip
    server = EngineConfig(backend="vllm-server", options={"server_args": ["--seed", "1"]})
    assert isinstance(server.options, VLLMServerOptions)
    # A YAML round trip keeps them typed and passes only what was set.
    again = TrainConfig.model_validate(TrainConfig(engine=vllm).model_dump()).engine
    assert again.options == vllm.options and again.create_kwargs() == vllm.create_kwargs()
    for backend, options, allowed in [
        ("torch", {"dtyp": "float32"}, "dtype"),
        ("torch", {"max_model_len": 128}, "dtype"),  # a vLLM option on the torch engine
        ("vllm", {"server_args": ["x"]}, "engine_args"),
        ("vllm-server", {"cpu_threads": 0}, "server_args"),
    ]:
        with pytest.raises(ValueError, match=f"engine.options of backend '{backend}'.*{allowed}"):
            EngineConfig(backend=backend, options=options)
    with pytest.raises(ValueError, match="engine_args"):
        EngineConfig(backend="vllm-server", options={"engine_args": {"seed": 1}})
    with pytest.raises(ValueError, match="actor_options needs engine.ray_actors"):
        EngineConfig(options={"actor_options": {"num_cpus": 1}})


def test_every_engine_option_is_a_parameter_of_its_engine() -> None:
    import inspect

    from agentrl_sdk.engines.options import BACKENDS
    from agentrl_sdk.engines.ray import RayEngine
    from agentrl_sdk.engines.vllm.engine import VLLMEngine
    from agentrl_sdk.engines.vllm.server import VLLMServerEngine

    constructors = {"torch": TorchEngine.from_pretrained, "vllm": VLLMEngine.__init__,
                    "vllm-server": VLLMServerEngine.__init__}  # fmt: skip
    ray_parameters = set(inspect.signature(RayEngine.__init__).parameters)
    for backend, options in ((n, b.options) for n, b in BACKENDS.items()):
        parameters = set(inspect.signature(constructors[backend]).parameters) | ray_parameters
        engine_args_refused = backend == "vllm-server"
        fields = set(options.model_fields) - ({"engine_args"} if engine_args_refused else set())
        assert fields <= parameters, (backend, fields - parameters)


def test_max_batch_size_has_one_value() -> None:
    """engine.options.max_batch_size (torch) applies over engine.max_batch_size; both set to
    different values is refused, naming the two keys."""
    own = EngineConfig(options={"max_batch_size": 48})
    assert own.create_kwargs()["max_batch_size"] == 48
    assert EngineConfig(max_batch_size=8).create_kwargs()["max_batch_size"] == 8
    assert EngineConfig(max_batch_size=48, options={"max_batch_size": 48}).create_kwargs()[
        "max_batch_size"] == 48  # fmt: skip
    with pytest.raises(ValueError, match=r"engine.max_batch_size \(8\) and engine.options.max_batch_size \(48\)"):
        EngineConfig(max_batch_size=8, options={"max_batch_size": 48})
