"""The `Engine` protocol: token ids in, token ids + logprobs + policy version out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import torch

from agentrl_sdk.types import GenerateResult, SamplingParams


@runtime_checkable
class Engine(Protocol):
    """An inference backend. It never sees text, only token ids.

    Implementations: `TorchEngine` (embedded, CPU default), `VLLMEngine` (in-process vLLM),
    `VLLMServerEngine` (vLLM's OpenAI-compatible server), `RayEngine` (any of them in a Ray
    actor) and `EnginePool` (several replicas behind one engine).

    Pause/resume contract: `pause` stops decoding and holds every request in flight with its
    partial ids, logprobs and versions; `generate` calls made while paused wait; weights may
    be updated while paused; `resume` continues the held requests on the current weights,
    their partial output becoming part of the prompt. The result's ``token_versions`` then
    says which policy version sampled each token.
    """

    @property
    def policy_version(self) -> int:
        """Version of the weights currently served; bumped by every `update_weights`."""
        ...

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str,
        *,
        session_id: str | None = None,
    ) -> GenerateResult:
        """Sample one response to ``prompt_ids``.

        ``session_id`` names the conversation (rollout) the request belongs to: a pool keeps
        a session's requests on one replica, where its prefix is cached. Engines serving
        alone ignore it.
        """
        ...

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        """Load new weights between decoding steps and return the new policy version."""
        ...

    async def pause(self) -> None:
        """Stop decoding; requests in flight keep their partial output until `resume`."""
        ...

    async def resume(self) -> None:
        """Continue the requests held by `pause`."""
        ...

    async def health(self) -> bool:
        """True while the engine can serve requests."""
        ...

    def close(self) -> None:
        """Release the engine (threads, processes); later requests fail with `EngineError`."""
        ...
