"""The supervisor's own tiny policy, briefly warm-started on unreliable routing demonstrations.

The workers reuse the tool-selection policy: ``default`` trains a copy of it, ``words``
serves another copy frozen. With config_lora.yaml all three are adapters of one shared base
(`shared_base_path`), warm-started on both the routing and the tool demonstrations.
"""

from __future__ import annotations

import random
from pathlib import Path

from agentrl_sdk.models import cached_build
from examples._warm import build_warm_started
from examples.multi_agent.agent import make_mixed_rows, routing_demo
from examples.tool_selection.model import RECIPE as TOOL_RECIPE

RECIPE = {"version": 1, "vocab_size": 1024, "hidden_size": 64, "num_layers": 2,
          "warm_rows": 256, "accuracy": 0.6, "steps": 60, "lr": 3e-3, "batch_size": 16}


def build(folder: Path, progress: bool = True) -> None:
    rng = random.Random(0)
    demos = [routing_demo(r, rng, RECIPE["accuracy"])
             for r in make_mixed_rows(RECIPE["warm_rows"], seed=1)]
    build_warm_started(folder, RECIPE, demos, progress=progress)


def supervisor_path(progress: bool = True) -> Path:
    """The supervisor's cached model folder, built on first use."""
    return cached_build("multi-agent-supervisor", RECIPE, lambda folder: build(folder, progress))


SHARED_RECIPE = {"version": 3, "vocab_size": 1024, "hidden_size": 64, "num_layers": 2,
                 "routing_rows": 256, "accuracy": RECIPE["accuracy"],
                 "tool_rows": TOOL_RECIPE["warm_rows"], "steps": 180, "lr": 3e-3,
                 "batch_size": 16}
"""The shared base of config_lora.yaml: the same tiny model as the others, warm-started once
on a mixture of the supervisor's routing demonstrations and the tool-selection demonstrations
(routing prompts carry no tools, tool prompts do), as long as the two own warm starts."""


def build_shared_base(folder: Path, progress: bool = True) -> None:
    from agentrl_sdk.chat.messages import to_openai_tools
    from agentrl_sdk.chat.template import ChatTemplate
    from agentrl_sdk.models import (
        build_sft_examples,
        build_small_tokenizer,
        build_tiny_model,
        save_pretrained_pair,
        train_on_sft_examples,
    )
    from examples.tool_selection.agent import TOOLS, make_rows, noisy_expert_conversation

    recipe = SHARED_RECIPE
    tokenizer = build_small_tokenizer("hermes", vocab_size=recipe["vocab_size"])
    model = build_tiny_model(tokenizer, hidden_size=recipe["hidden_size"],
                             num_layers=recipe["num_layers"])
    rng = random.Random(0)
    template = ChatTemplate(tokenizer)
    examples = []
    for row in make_mixed_rows(recipe["routing_rows"], seed=1):
        examples += build_sft_examples(template, routing_demo(row, rng, recipe["accuracy"]))
    for row in make_rows(recipe["tool_rows"], seed=1):
        conversation = noisy_expert_conversation(row, rng, TOOL_RECIPE["expert_accuracy"])
        examples += build_sft_examples(template, conversation, to_openai_tools(TOOLS))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    # supervised_warm_start renders one tool list into every conversation; the mixture needs
    # two, so its training loop runs on examples built here.
    train_on_sft_examples(model, examples, pad_token_id=pad_id, steps=recipe["steps"],
                          lr=recipe["lr"], batch_size=recipe["batch_size"], progress=progress)
    save_pretrained_pair(model, tokenizer, folder)


def shared_base_path(progress: bool = True) -> Path:
    """The cached shared base of the three adapters (config_lora.yaml), built on first use."""
    return cached_build("multi-agent-shared-base", SHARED_RECIPE,
                        lambda folder: build_shared_base(folder, progress))
