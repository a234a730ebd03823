"""The `Engine` protocol: token ids in, token ids + logprobs + policy version out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import torch

from agentrl_sdk.types import GenerateResult, SamplingParams


@runtime_checkable
class Engine(Protocol):
    """An inference backend. It never sees text, only token ids.

    Implementations: `TorchEngine` (embedded, CPU default); vLLM backends follow the same contract.
    """

    @property
    def policy_version(self) -> int:
        """Version of the weights currently served; bumped by every `update_weights`."""
        ...

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerateResult:
        """Sample one response to ``prompt_ids``."""
        ...

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        """Load new weights between decoding steps and return the new policy version."""
        ...

    async def health(self) -> bool:
        """True while the engine can serve requests."""
        ...
