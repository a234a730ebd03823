"""The calculator agent's tiny policy: a small-vocab model warm-started on expert solutions.

Built by the project's own code (no download) and cached, so the second run starts at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl_sdk.chat.messages import to_openai_tools
from agentrl_sdk.models import cached_build, load_pretrained_pair
from examples._warm import build_warm_started
from examples.calculator.agent import calculator, expert_conversation, make_rows

RECIPE = {
    "version": 2,
    "vocab_size": 1024,
    "hidden_size": 128,
    "num_layers": 2,
    "warm_rows": 256,
    "steps": 300,
    "lr": 3e-3,
    "batch_size": 16,
}
"""Everything that decides the weights; its hash names the cache folder."""


def build(folder: Path, progress: bool = True) -> None:
    """Warm-start a tiny model on expert solutions and save it into ``folder``."""
    conversations = [expert_conversation(r) for r in make_rows(RECIPE["warm_rows"], seed=1)]
    build_warm_started(folder, RECIPE, conversations, tools=to_openai_tools([calculator]),
                       progress=progress)


def model_path(progress: bool = True) -> Path:
    """The cached model folder, built on first use."""
    return cached_build("calculator", RECIPE, lambda folder: build(folder, progress))


def load_agent_model(progress: bool = True) -> tuple[Any, Any]:
    """The warm-started (model, tokenizer)."""
    return load_pretrained_pair(model_path(progress))
