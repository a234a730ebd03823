"""`GraphAgentLoop`: an agentrl_sdk LangGraph graph as a verl agent loop (needs ``verl``)."""

from __future__ import annotations

import importlib
import uuid
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.config import ChatConfig, RolloutConfig, ToolPromptMode
from agentrl_sdk.rollout import arollout
from agentrl_sdk.types import SamplingParams
from integrations.verl.engine import VerlServerEngine
from integrations.verl.output import agent_loop_fields


class GraphAgentLoop(AgentLoopBase):
    """Runs a LangGraph graph with `TokenChatModel` nodes on verl's rollout servers.

    Register it in verl's agent loop config (``rollout.agent.agent_loop_config_path``)::

        - name: agentrl_graph
          _target_: integrations.verl.agent_loop.GraphAgentLoop
          graph: examples.calculator.agent:build_graph   # a compiled graph or a builder

    and give rows ``agent_name: agentrl_graph``. Each sample runs the graph on the row's
    ``raw_prompt`` (tools get ``tools_kwargs`` as in agentrl_sdk); every LLM call goes to verl's
    ``server_manager`` as token ids and lands in the rollout's token ledger, whose segment is
    returned as ``AgentLoopOutput``: verl's trainer then trains on the exact sampled tokens.

    Args:
        graph: ``"module:attr"`` naming a compiled graph, or a function returning one.
        recursion_limit: LangGraph's step limit per rollout.
        tool_prompt: ``chat.tool_prompt`` of the rollouts (how tools reach the prompt).
        *args, **kwargs: What verl passes every agent loop (config, server manager, tokenizer...).
    """

    def __init__(
        self,
        *args: Any,
        graph: str | Any = None,
        recursion_limit: int = 50,
        tool_prompt: ToolPromptMode = "auto",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if graph is None:
            raise ValueError("GraphAgentLoop needs graph='module:attr' in the agent loop config")
        self.graph = _load_graph(graph)
        self.recursion_limit = recursion_limit
        self.tool_prompt = tool_prompt
        self.template = ChatTemplate(self.tokenizer, tool_prompt=tool_prompt)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Run the graph once on the row ``kwargs`` and return its trained segment."""
        prompt_length = int(self.rollout_config.prompt_length)
        response_length = int(self.rollout_config.response_length)
        config = RolloutConfig(
            sampling=SamplingParams(
                temperature=float(sampling_params.get("temperature", 1.0)),
                top_p=float(sampling_params.get("top_p", 1.0)),
                top_k=int(sampling_params.get("top_k", -1)),
                max_tokens=response_length,
            ),
            chat=ChatConfig(
                max_context_tokens=prompt_length + response_length, tool_prompt=self.tool_prompt
            ),
            recursion_limit=self.recursion_limit,
        )
        engine = VerlServerEngine(self.server_manager, session_id=uuid.uuid4().hex)
        messages = list(kwargs["raw_prompt"])
        (trajectory,) = await arollout(
            self.graph, kwargs, engine, tokenizer=self.tokenizer, n=1, config=config,
            input_fn=lambda row: {"messages": messages},
        )
        prompt = self.template.encode(self.template.render(messages, add_generation_prompt=True))
        fields = agent_loop_fields(
            trajectory, prompt_ids=prompt, response_length=response_length,
            logprobs=not engine.logprobs_missing,
        )
        return AgentLoopOutput(**fields)


def _load_graph(graph: str | Any) -> Any:
    if not isinstance(graph, str):
        return graph
    module, _, attr = graph.partition(":")
    if not attr:
        raise ValueError(f"graph must be 'module:attr', got {graph!r}")
    target = getattr(importlib.import_module(module), attr)
    return target if hasattr(target, "ainvoke") else target()
