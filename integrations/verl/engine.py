"""`VerlServerEngine`: verl's rollout server manager behind agentrl_sdk's `Engine` protocol."""

from __future__ import annotations

from typing import Any

from agentrl_sdk.errors import EngineError
from agentrl_sdk.types import GenerateResult, SamplingParams
from agentrl_sdk.weights import WeightIntake, WeightPush


class VerlServerEngine:
    """Token ids in and out through verl's ``server_manager.generate`` (an `Engine`).

    verl owns the servers' weights and their lifecycle (weight sync, sleep/wake), so
    ``load_weights`` is refused and ``pause``/``resume`` leave the servers alone.

    Args:
        server_manager: verl's ``LLMServerClient`` (the agent loop's ``server_manager``).
        session_id: Sent as every request's id, so verl routes all calls of one rollout to
            the same server (prefix cache), as its own agent loops do.
        version_key: The ``TokenOutput.extra_fields`` entry read as the policy version.
    """

    def __init__(
        self, server_manager: Any, *, session_id: str, version_key: str = "global_steps"
    ) -> None:
        self.server_manager = server_manager
        self.session_id = session_id
        self.version_key = version_key
        self.logprobs_missing = False
        self._version = 0

    @property
    def policy_version(self) -> int:
        """The version the last answer reported (verl's ``global_steps``), else 0."""
        return self._version

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str,
        *,
        session_id: str | None = None,  # verl routes by this engine's own rollout session
    ) -> GenerateResult:
        """One response from verl's servers; ``request_id`` is kept only in error messages.

        Raises:
            ValueError: ``sampling.stop`` holds stop strings: verl's server manager is given
                token ids only here, so stops must be ``stop_token_ids``.
        """
        if sampling.stop:
            raise ValueError(
                f"stop strings {list(sampling.stop)!r} are not supported through verl's server "
                "manager; use stop_token_ids"
            )
        params: dict[str, Any] = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "max_tokens": sampling.max_tokens,
            "logprobs": True,
        }
        if sampling.stop_token_ids:
            params["stop_token_ids"] = list(sampling.stop_token_ids)
        if sampling.seed is not None:
            params["seed"] = sampling.seed
        try:
            output = await self.server_manager.generate(
                self.session_id, prompt_ids=list(prompt_ids), sampling_params=params
            )
        except Exception as exc:
            raise EngineError(f"verl server_manager failed on {request_id}: {exc}") from exc
        ids = list(output.token_ids)
        logprobs = list(output.log_probs) if output.log_probs else None
        if logprobs is None:
            # verl recomputes old logprobs itself; the ledger keeps zeros and says so.
            self.logprobs_missing = True
            logprobs = [0.0] * len(ids)
        version = (output.extra_fields or {}).get(self.version_key)
        if isinstance(version, int):
            self._version = version
        return GenerateResult(
            token_ids=ids, logprobs=logprobs, finish_reason=_finish(output, ids, sampling),
            policy_version=self._version,
        )

    @property
    def weight_intake(self) -> WeightIntake:
        """None: verl's trainer syncs the servers' weights."""
        return WeightIntake(frozenset())

    async def load_weights(self, push: WeightPush, version: int) -> None:
        """Refused: verl's trainer syncs the servers' weights."""
        raise EngineError("verl syncs its rollout servers' weights; agentrl_sdk does not")

    async def pause(self) -> None:
        """Nothing: verl pauses its servers itself."""

    async def resume(self) -> None:
        """Nothing: verl resumes its servers itself."""

    async def health(self) -> bool:
        """True: verl watches its servers."""
        return True

    def close(self) -> None:
        """Nothing to release: the server manager belongs to verl."""


def _finish(output: Any, ids: list[int], sampling: SamplingParams) -> str:
    if getattr(output, "stop_reason", None) == "aborted":
        return "abort"
    return "length" if len(ids) >= sampling.max_tokens else "stop"
