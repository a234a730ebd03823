"""Pydantic configuration of the SDK; every option is documented once, in its ``Field``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentrl_sdk.types import SamplingParams

ToolPromptMode = Literal["auto", "native", "hermes"]
"""How tools reach the prompt; see ``ChatConfig.tool_prompt``."""


@dataclass(frozen=True)
class ToolFormat:
    """A tool-call format that ``rollout.chat.tool_parser`` names.

    Attributes:
        parser: ``module:Class`` of its parser, imported by `agentrl_sdk.chat.tool_parsers`:
            the config sits below the chat layer, so it names the class without importing it.
        summary: How its calls look, for the config reference.
    """

    parser: str
    summary: str


TOOL_FORMATS: dict[str, ToolFormat] = {
    "hermes": ToolFormat("agentrl_sdk.chat.tool_parsers.hermes:HermesToolParser",
                         "<tool_call>{json}</tool_call>"),
    "llama3_json": ToolFormat("agentrl_sdk.chat.tool_parsers.llama3_json:Llama3JsonToolParser",
                              '{"name": ..., "parameters": ...} calls, optionally after '
                              "<|python_tag|>, separated by ';'"),
    "mistral": ToolFormat("agentrl_sdk.chat.tool_parsers.mistral:MistralToolParser",
                          "[TOOL_CALLS][{...}, ...]"),
}  # fmt: skip
"""Every tool-call format by name: the one place a tool parser is named."""

ToolParserName = Literal[tuple(TOOL_FORMATS)]  # type: ignore[valid-type]
"""A tool parser's name (``ChatConfig.tool_parser``), from `TOOL_FORMATS`."""


def _either(names: list[str]) -> str:
    """``a, b or c``."""
    return " or ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


class ConfigSection(BaseModel):
    """A section of a training config: an unknown key is refused (a typo is an error, not a
    silently kept default)."""

    model_config = ConfigDict(extra="forbid")


class ChatConfig(ConfigSection):
    """How the token chat model builds prompts and guards the context."""

    max_context_tokens: int = Field(
        4096, ge=2, description="Prompt plus response budget of one call; beyond it the rollout "
        "ends with status context_exceeded."
    )
    max_observation_tokens: int | None = Field(
        None, ge=1, description="Tool outputs longer than this many tokens are cut (by tokens)."
    )
    tool_parser: ToolParserName = Field(
        "hermes", description="How tool calls are read from generated text: " + _either(
            [f"{name} ({form.summary})" for name, form in TOOL_FORMATS.items()]) + ".",
    )
    tool_prompt: ToolPromptMode = Field(
        "auto", description="How tools reach the prompt: native (the model's chat template "
        "renders them; refused if it ignores them), hermes (a Hermes-style tools section, "
        "<tool_call> blocks and <tool_response> turns written around the model's own template) "
        "or auto (native when the template renders tools, else hermes with a warning)."
    )
    request_timeout_s: float = Field(
        600.0, gt=0, description="Longest wait for one engine answer before the call fails."
    )


class NodeRule(ConfigSection, frozen=True):
    """How the LLM calls of the graph nodes a path pattern matches are attributed."""

    trained: bool = Field(True, description="Train on these calls; False runs them frozen.")
    policy: str = Field("default", description="The policy that serves (and learns from) them.")
    name: str | None = Field(
        None, description="Node name recorded on their calls and segments; None keeps the "
        "node's path (e.g. researcher/agent)."
    )


class TreeConfig(ConfigSection):
    """Tree rollouts: a group's rollouts fork from the graph's own saved state at branch
    points instead of all running from the start (`agentrl_sdk.rollout.tree`)."""

    enabled: bool = Field(
        False, description="Roll a group out as trees: rollout.n / branches**depth roots run "
        "from the start; each stops after a branch node and `branches` continuations resume "
        "from the checkpoint the graph saved there, `depth` times along a path, so a group "
        "still has rollout.n leaves. The continuations share their trunk's tokens (generated "
        "once, trained once with trainer.share_prefix)."
    )
    branches: int = Field(2, ge=2, description="Continuations forked at each branch point.")
    depth: int = Field(1, ge=1, description="Branch points along a root-to-leaf path.")
    branch_after: list[str] | None = Field(
        None, description="Top-level graph nodes after which a path may branch. None: the "
        "graph's tool nodes (LangGraph's ToolNode, sdk.ToolNode): a tool's result is new "
        "information, where continuations differ most (ARPO, Tree-GRPO branch there too). A "
        "path that ends before its branch point is a leaf; its tree's missing leaves are "
        "more continuations of a sibling root's branch point (another root if none branched; "
        "with min_entropy, another root)."
    )
    skip_first: int = Field(
        0, ge=0, description="Branch points a root passes unbranched before it branches. For "
        "tasks whose first steps are routine (the policy is sure there): the trunk takes them "
        "in, so more of a group's tokens are generated and trained once, and the "
        "continuations start where the policy is unsure."
    )
    min_entropy: float | None = Field(
        None, ge=0.0, description="None: a path branches at each branch point it reaches "
        "(up to depth). A number: only where the policy is unsure what comes next (ARPO's "
        "entropy-gated branching): at a branch point the path first makes its next LLM call, "
        "and branches there only if that call's entropy (the mean surprisal, -logprob, of its "
        "sampled tokens, in nats per token) is at least min_entropy: the other continuations "
        "sample that call again from the checkpoint before it; below it, the path goes on "
        "unbranched to its next branch point (counted as tree_branch_declined)."
    )


class RolloutConfig(ConfigSection):
    """How rollouts of a graph are collected."""

    n: int = Field(1, ge=1, description="Samples (rollouts) per dataset row.")
    concurrency: int = Field(64, ge=1, description="Rollouts running at once.")
    sampling: SamplingParams = Field(
        default_factory=SamplingParams, description="How the engine samples each LLM call."
    )
    chat: ChatConfig = Field(
        default_factory=ChatConfig, description="How the token chat model builds prompts, "
        "renders tools, parses tool calls and guards the context."
    )
    default_trainable: bool = Field(
        True, description="Whether LLM calls in undecorated nodes are trained."
    )
    nodes: dict[str, NodeRule] = Field(
        default_factory=dict, description="Attribution of undecorated nodes by path pattern "
        "(fnmatch: 'researcher/*', 'supervisor'). A node's path is its place in the graph, "
        "enclosing subgraph nodes first: the agent node of a prebuilt agent added as "
        "'researcher' is 'researcher/agent'. The first pattern that matches wins; calls no "
        "pattern matches are named by their path and trained per default_trainable; nodes "
        "decorated with @trainable/@frozen keep their decorator."
    )
    recursion_limit: int = Field(50, ge=1, description="LangGraph's step limit per rollout.")
    tool_threads: int = Field(
        32, ge=1, description="Threads for synchronous tools and agent functions during "
        "sdk.train / sdk.evaluate (the loop's default executor): a tool stuck forever holds "
        "one of them, never the trainer's or the weight sync's, and never delays the exit."
    )
    configurable: dict[str, Any] = Field(
        default_factory=dict, description="Extra `configurable` keys of every graph run (read "
        "by your nodes). `thread_id` is set by the SDK: a fresh one per rollout, so a graph "
        "compiled with a checkpointer never carries state from one rollout into another."
    )
    timeout_s: float | None = Field(
        1800.0, gt=0, description="Wall-clock limit of one rollout; past it status is timeout "
        "(a hung tool or agent cannot hold its rollout forever). None: no limit."
    )

    tree: TreeConfig = Field(
        default_factory=TreeConfig, description="Tree rollouts: a group's rollouts fork from "
        "saved graph states at branch points (off by default)."
    )

    @model_validator(mode="after")
    def _budget_fits(self) -> RolloutConfig:
        if self.sampling.max_tokens >= self.chat.max_context_tokens:
            raise ValueError(
                f"sampling.max_tokens ({self.sampling.max_tokens}) must be smaller than "
                f"chat.max_context_tokens ({self.chat.max_context_tokens})"
            )
        leaves = self.tree.branches**self.tree.depth
        if self.tree.enabled and self.n % leaves:
            raise ValueError(
                f"rollout.n ({self.n}) must be a multiple of tree.branches**tree.depth "
                f"({self.tree.branches}**{self.tree.depth} = {leaves}): a tree's leaves"
            )
        return self
