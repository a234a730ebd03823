"""The supervisor's own tiny policy, briefly warm-started on unreliable routing demonstrations.

The workers reuse the tool-selection policy: ``default`` trains a copy of it, ``words``
serves another copy frozen. With config_lora.yaml all three are adapters of one shared base
(`shared_base_path`): the tool-selection policy, briefly taught to route as well.
"""

from __future__ import annotations

import random
from pathlib import Path

from agentrl_sdk.models import cached_build
from examples._warm import build_warm_started
from examples.multi_agent.agent import make_mixed_rows, routing_demo
from examples.tool_selection.model import RECIPE as TOOL_RECIPE
from examples.tool_selection.model import model_path as tool_model_path

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


SHARED_RECIPE = {"version": 2, "tool_selection": TOOL_RECIPE, "routing_rows": 256,
                 "accuracy": RECIPE["accuracy"], "steps": 80, "lr": 2e-3, "batch_size": 16}
"""The shared base of config_lora.yaml: the tool-selection policy, then a brief warm start on
a mixture of the supervisor's routing demonstrations and the tool demonstrations (so it learns
to route without forgetting the tool-call format)."""


def build_shared_base(folder: Path, progress: bool = True) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl_sdk.chat.messages import to_openai_tools
    from agentrl_sdk.chat.template import ChatTemplate
    from agentrl_sdk.models import save_pretrained_pair
    from agentrl_sdk.models.warm_start import _train, build_sft_examples
    from examples.tool_selection.agent import TOOLS, make_rows, noisy_expert_conversation

    source = tool_model_path(progress)
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(source, local_files_only=True)
    rng = random.Random(0)
    template = ChatTemplate(tokenizer)
    examples = []  # routing prompts carry no tools, tool prompts do: one mixed warm start
    for row in make_mixed_rows(SHARED_RECIPE["routing_rows"], seed=1):
        examples += build_sft_examples(template, routing_demo(row, rng, RECIPE["accuracy"]))
    for row in make_rows(TOOL_RECIPE["warm_rows"], seed=1):
        conversation = noisy_expert_conversation(row, rng, TOOL_RECIPE["expert_accuracy"])
        examples += build_sft_examples(template, conversation, to_openai_tools(TOOLS))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    model.train()
    _train(model, examples, pad_id, SHARED_RECIPE["steps"], SHARED_RECIPE["lr"],
           SHARED_RECIPE["batch_size"], 0, progress, None)
    model.eval()
    save_pretrained_pair(model, tokenizer, folder)


def shared_base_path(progress: bool = True) -> Path:
    """The cached shared base of the three adapters (config_lora.yaml), built on first use."""
    return cached_build("multi-agent-shared-base", SHARED_RECIPE,
                        lambda folder: build_shared_base(folder, progress))
