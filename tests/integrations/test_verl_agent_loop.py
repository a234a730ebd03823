"""verl interop: GraphAgentLoop, built the way verl builds agent loops, returns a valid
AgentLoopOutput holding exactly the tokens verl's server manager generated.

verl is installed ``--no-deps`` (see the Makefile); its rollout servers (vLLM/SGLang replicas
as Ray actors) are not started on this CPU: a server manager with verl's own ``generate``
signature, returning verl's ``TokenOutput``, serves the tiny TorchEngine policy instead.
"""

from __future__ import annotations

import importlib
import os
from itertools import groupby

import pytest

from agentrl_sdk.weights.push import StateDict

# `make test` installs verl's agent-loop set; CI sets AGENTRL_REQUIRE_VERL so a missing module
# fails the run instead of skipping this test.
_load = importlib.import_module if os.environ.get("AGENTRL_REQUIRE_VERL") else pytest.importorskip
agent_loop = _load("verl.experimental.agent_loop.agent_loop")
hydra = _load("hydra")

from omegaconf import OmegaConf  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from agentrl_sdk.types import SamplingParams  # noqa: E402
from integrations.verl import VerlServerEngine  # noqa: E402
from tests.gateway.conftest import CALC_ROWS, calc_engine  # noqa: E402, F401 - cached policy

pytestmark = pytest.mark.slow
RESPONSE_LENGTH = 256


class TorchServerManager:
    """verl's ``LLMServerClient.generate`` contract, served by an agentrl TorchEngine."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.calls: list[tuple[str, list[int], dict, TokenOutput]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        sampling = SamplingParams(
            temperature=sampling_params["temperature"], top_p=sampling_params["top_p"],
            top_k=sampling_params["top_k"], max_tokens=sampling_params["max_tokens"],
        )
        result = await self.engine.generate(prompt_ids, sampling, f"{request_id}-{len(self.calls)}")
        output = TokenOutput(token_ids=result.token_ids, log_probs=result.logprobs,
                             stop_reason="completed", extra_fields={"global_steps": 3})
        self.calls.append((request_id, list(prompt_ids), dict(sampling_params), output))
        return output


def _trainer_config():
    return OmegaConf.create({
        "actor_rollout_ref": {"rollout": {
            "prompt_length": 512, "response_length": RESPONSE_LENGTH, "temperature": 0.0,
            "top_p": 1.0, "top_k": -1, "calculate_log_probs": True,
        }},
        "data": {"apply_chat_template_kwargs": {}},
    })


def _build_loop(server_manager, tokenizer):
    """Exactly how verl's AgentLoopWorker instantiates a registered agent loop."""
    config = _trainer_config()
    registered = OmegaConf.create({
        "name": "agentrl_graph",
        "_target_": "integrations.verl.agent_loop.GraphAgentLoop",
        "graph": "examples.calculator.agent:build_graph",
    })
    return hydra.utils.instantiate(
        config=registered,
        trainer_config=agent_loop.DictConfigWrap(config=config),
        server_manager=server_manager,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type=None,
        dataset_cls=None,
        data_config=agent_loop.DictConfigWrap(config.data),
        tools=agent_loop.ToolListWrap([]),
    )


async def test_graph_agent_loop_returns_the_generated_tokens(calc_engine, qwen_tokenizer):
    row = CALC_ROWS[2]
    manager = TorchServerManager(calc_engine)
    loop = _build_loop(manager, qwen_tokenizer)
    assert isinstance(loop, agent_loop.AgentLoopBase)

    sampling = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
                "logprobs": True}
    kwargs = {"raw_prompt": row["messages"], "agent_name": "agentrl_graph", "index": 2,
              "extra_info": {}, "data_source": "calc"}
    output = await loop.run(sampling, **kwargs)

    assert isinstance(output, agent_loop.AgentLoopOutput)
    assert output.extra_fields["agentrl_status"] == "ok", output.extra_fields["agentrl_error"]
    # Three calls to verl's server manager, all under one sticky session id.
    assert len(manager.calls) == 3 and len({c[0] for c in manager.calls}) == 1
    assert all(c[2]["max_tokens"] <= RESPONSE_LENGTH and c[2]["logprobs"] for c in manager.calls)
    # The prompt is verl's first request; mask-1 runs are exactly the server's answers.
    assert output.prompt_ids == manager.calls[0][1]
    runs = [(m, [t for t, _ in run]) for m, run in
            groupby(zip(output.response_ids, output.response_mask, strict=True), key=lambda p: p[1])]
    assert [ids for m, ids in runs if m == 1] == [c[3].token_ids for c in manager.calls]
    assert [qwen_tokenizer.decode(ids) for m, ids in runs if m == 0][0].startswith(
        "\n<|im_start|>user\n<tool_response>\n"
    )
    generated = [lp for c in manager.calls for lp in c[3].log_probs]
    assert [lp for lp, m in zip(output.response_logprobs, output.response_mask) if m] == generated
    # Each later call's prompt is the earlier prompt + response: one token sequence.
    full = output.prompt_ids + output.response_ids
    for _, prompt, _, _ in manager.calls:
        assert full[: len(prompt)] == prompt
    assert output.num_turns == 6  # user, then assistant/tool/assistant/tool/assistant
    assert output.extra_fields["agentrl_policy_versions"] == [3]
    assert output.extra_fields["agentrl_dropped_segments"] == 0
    # verl's own conversion to tensors accepts it.
    tensors = output.as_dict()
    assert tensors["responses"].tolist() == output.response_ids
    assert tensors["response_mask"].sum().item() == sum(len(c[3].token_ids) for c in manager.calls)
    assert tensors["rollout_log_probs"].shape == tensors["responses"].shape


async def test_engine_maps_sampling_and_refuses_weight_updates(qwen_tokenizer):
    class NoLogprobs:
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            self.seen = (request_id, sampling_params)
            return TokenOutput(token_ids=[1, 2, 3], log_probs=None, stop_reason="aborted")

    manager = NoLogprobs()
    engine = VerlServerEngine(manager, session_id="s1")
    result = await engine.generate([5, 6], SamplingParams(temperature=0.5, max_tokens=4,
                                                          stop_token_ids=(9,), seed=1), "r-0")
    assert manager.seen == ("s1", {"temperature": 0.5, "top_p": 1.0, "top_k": -1,
                                   "max_tokens": 4, "logprobs": True, "stop_token_ids": [9],
                                   "seed": 1})
    assert result.finish_reason == "abort" and result.logprobs == [0.0, 0.0, 0.0]
    assert engine.logprobs_missing
    assert not engine.weight_intake.kinds
    with pytest.raises(Exception, match="verl syncs"):
        await engine.load_weights(StateDict({}), 1)
