"""What a user reads from the demos: log lines without rich's source column, and no warning
about the project's own example configs."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
from rich.console import Console

from agentrl_sdk.chat import tool_prompt
from agentrl_sdk.pipeline import TrainConfig
from agentrl_sdk.pipeline.progress import log_console

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMOLLM2_CONFIGS = [
    "word_problems/config.yaml",
    "word_problems/config_vllm.yaml",
    "gsm8k_tool_agent/config_real.yaml",
    "two_step/config.yaml",
    "three_step/config.yaml",
]


def _logged(console: Console) -> str:
    console.file = io.StringIO()
    console.width = 200
    console.log("step 1: reward 0.250")
    return console.file.getvalue()


def test_log_lines_end_without_the_source_column():
    line = _logged(log_console())
    assert "step 1: reward 0.250" in line
    assert ".py:" not in line
    # What the default console would print: the SDK's own file and line on the right.
    assert "test_console_output.py:" in _logged(Console())


@pytest.mark.parametrize("name", SMOLLM2_CONFIGS)
def test_smollm2_example_configs_set_the_tool_prompt_and_do_not_warn(name, caplog,
                                                                       monkeypatch):
    config = TrainConfig.from_yaml(EXAMPLES / name)
    monkeypatch.setattr(tool_prompt, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="agentrl_sdk.chat.tool_prompt"):
        # SmolLM2's ChatML template does not render tools.
        chosen = tool_prompt.resolve_tool_prompt(config.rollout.chat.tool_prompt, False, name)
    assert chosen == "hermes"
    assert not caplog.records


def test_the_warning_names_the_config_key(caplog, monkeypatch):
    monkeypatch.setattr(tool_prompt, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="agentrl_sdk.chat.tool_prompt"):
        tool_prompt.resolve_tool_prompt("auto", False, "a template")
    assert "rollout.chat.tool_prompt: hermes" in caplog.text
