"""`VLLMBackend`: what the in-process and the server vLLM engines share.

Both run their I/O on a private `LoopThread`, stream every request into a resumable
`PartialOutput`, and reload weights from bucket files with the requests held around the
reload. A backend supplies only how to stream one submission (`_stream`), how to load the
files (`_load`) and which of its errors become `EngineError` (`_request_error`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from agentrl_sdk.engines.stop_strings import StopStrings
from agentrl_sdk.engines.vllm.loop_thread import LoopThread, called
from agentrl_sdk.engines.vllm.resumable import PartialOutput, ResumableRequests
from agentrl_sdk.engines.vllm.weights import WeightFiles
from agentrl_sdk.errors import EngineError
from agentrl_sdk.threads import run_blocking
from agentrl_sdk.types import FinishReason, GenerateResult, SamplingParams
from agentrl_sdk.weights.adapters import AdapterWeights
from agentrl_sdk.weights.push import WeightIntake, WeightPush
from agentrl_sdk.weights.shared_files import SharedWeights, host_id


__all__ = ["VLLMBackend", "checked_finish", "sampling_fields"]


class VLLMBackend:
    """Generate, weight update, pause and resume over a subclass's vLLM connection.

    Subclasses set ``_loop``, ``_requests`` and ``_bucket_bytes``, and ``_tokenizer_path``
    (the model folder) to serve stop strings. vLLM runs without a tokenizer, so stop strings
    are matched here, on the streamed ids (`StopStrings`), with the folder's tokenizer loaded
    on the first request that has some.
    """

    _loop: LoopThread
    _requests: ResumableRequests
    _version: int = 0
    _bucket_bytes: int
    _closed: bool = False
    _tokenizer_path: str | None = None
    _tokenizer: Any = None
    _local_workers: bool = True  # vLLM's workers share this host's /dev/shm
    _base_version: int = 0  # the version of the last change to the base weights
    # The version of each named adapter's last push; replaced, never mutated (a class default).
    _adapter_versions: Mapping[str, int] = MappingProxyType({})
    _changing: asyncio.Lock | None = None  # held by the weight or adapter change under way

    @property
    def policy_version(self) -> int:
        """Version of the weights currently served: the one the last `load_weights` gave."""
        return self._version

    def served_version(self, adapter: str | None) -> int:
        """The version of the weights that serve requests of ``adapter`` (None: the base): the
        last change to the base or to that adapter, as the TorchEngine stamps its tokens."""
        own = self._adapter_versions.get(adapter, 0) if adapter is not None else 0
        return max(self._base_version, own)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str,
        *,
        session_id: str | None = None,  # one engine: no replica to pin to
    ) -> GenerateResult:
        """Sample one response to ``prompt_ids``; cancelling the caller aborts the request.

        Raises:
            ValueError: The prompt is empty, or the request has stop strings and the engine
                no model folder to read its tokenizer from.
            EngineError: vLLM failed the request or did not answer in time, or the engine
                is closed.
        """
        if not prompt_ids:
            raise ValueError(f"request {request_id!r}: prompt must be non-empty")
        self._check_open()
        stops = await self._stop_strings(sampling, request_id)
        partial = PartialOutput(list(prompt_ids), sampling, stop_strings=stops)
        return await self._loop.call(self._run(partial, request_id))

    async def _stop_strings(self, sampling: SamplingParams, request_id: str) -> StopStrings | None:
        if not sampling.stop:
            return None
        if self._tokenizer is None:
            if self._tokenizer_path is None:
                raise ValueError(
                    f"request {request_id!r} has stop strings {list(sampling.stop)!r} but the "
                    f"{type(self).__name__} has no model folder to read a tokenizer from: give "
                    "model_path, or stop on token ids (stop_token_ids)"
                )
            self._tokenizer = await run_blocking(_load_tokenizer, self._tokenizer_path)
        return StopStrings(self._tokenizer, sampling.stop)

    async def _run(self, partial: PartialOutput, request_id: str) -> GenerateResult:
        async def attempt(partial: PartialOutput, number: int) -> FinishReason:
            return await self._stream(partial, f"{request_id}#{number}" if number else request_id)

        try:
            return await self._requests.run(partial, attempt)
        except asyncio.CancelledError:
            if self._closed:  # cancelled by close(), not by the caller
                raise EngineError(f"request {request_id!r} aborted: the engine closed") from None
            raise
        except Exception as exc:
            error = self._request_error(request_id, exc)
            if error is None:
                raise
            raise error from exc

    @property
    def weight_intake(self) -> WeightIntake:
        """Tensors, and files staged where vLLM's workers run (they read them directly)."""
        host = host_id() if self._local_workers else None
        return WeightIntake(frozenset({"state_dict", "shared_files"}), host)

    async def load_weights(self, push: WeightPush, version: int) -> None:
        """Reload the weights of ``push`` without a restart, as ``version``: staged files are
        read by the workers where they lie; tensors are written as bucket files first.

        Requests in flight are held around the reload and then continue on the new weights
        (prompt + partial output prefilled again). A failed load leaves the version as is.

        Raises:
            EngineError: vLLM failed to load the weights or did not answer in time, or the
                push is an adapter and this engine takes none.
        """
        self._check_open()
        if isinstance(push, SharedWeights):
            await self._loop.call(self._held(self._load(list(push.paths)), version))
            return
        if isinstance(push, AdapterWeights):
            raise EngineError(f"this {type(self).__name__} takes no adapters "
                              f"(it takes {sorted(self.weight_intake.kinds)})")  # fmt: skip
        state = await run_blocking(push.state_dict)
        files = await run_blocking(WeightFiles, state, self._bucket_bytes)
        try:
            await self._loop.call(self._held(self._load(files.paths), version))
        finally:
            files.close()

    async def _held(
        self, change: Awaitable[None], version: int, adapter: str | None = None
    ) -> None:
        """Runs ``change`` (new weights, or the named ``adapter``) with the requests held; then
        ``version`` is that of the base or of ``adapter`` (`served_version`).

        Changes run one at a time (pushes of several adapters may arrive together), and the
        requests resume only after the last one.
        """
        if self._changing is None:  # made here: it belongs to the engine's loop
            self._changing = asyncio.Lock()
        async with self._changing:
            was_paused = self._requests.paused
            await self._requests.pause()
            try:
                await change
            finally:
                if not was_paused:
                    self._requests.resume()
            self._version = version
            if adapter is None:
                self._base_version = version
            else:
                self._adapter_versions = {**self._adapter_versions, adapter: version}

    async def pause(self) -> None:
        """Abort the requests in flight, keeping their partial output; new ones wait."""
        self._check_open()
        await self._loop.call(self._requests.pause())

    async def resume(self) -> None:
        """Submit the held requests again (prompt + partial output) and let new ones in."""
        self._check_open()
        await self._loop.call(called(self._requests.resume))

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError(
                f"the {type(self).__name__} is closed; create a new one to serve requests"
            )

    # What a backend supplies.

    async def _stream(self, partial: PartialOutput, request_id: str) -> FinishReason:
        """One submission: stream new tokens into ``partial`` until vLLM finishes it."""
        raise NotImplementedError

    async def _load(self, paths: list[str]) -> None:
        """Load the weight bucket files at ``paths`` and drop cached prefixes; raises
        `EngineError` on failure."""
        raise NotImplementedError

    def _request_error(self, request_id: str, exc: Exception) -> Exception | None:
        """The `EngineError` a failed request raises, or None to raise ``exc`` as it is."""
        raise NotImplementedError


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def sampling_fields(
    sampling: SamplingParams, max_tokens: int, eos: Iterable[int]
) -> dict[str, Any]:
    """The sampling both vLLM backends send with a submission (as vLLM's `SamplingParams`, or
    as fields of a ``/v1/completions`` body): ids only, the sampled token's logprob."""
    return {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": max(sampling.top_k, 0),
        "max_tokens": max_tokens,
        "seed": sampling.seed,
        "stop_token_ids": sorted({*sampling.stop_token_ids, *eos}),
        "ignore_eos": True,  # EOS ids are in stop_token_ids; vLLM has no tokenizer to read them
        "logprobs": 0,
        "skip_special_tokens": False,
    }


def checked_finish(reason: str, request_id: str) -> FinishReason:
    """vLLM's finish reason of ``request_id`` as ours; any other ends the request with an error."""
    if reason not in ("stop", "length", "abort"):
        raise EngineError(f"request {request_id!r}: vLLM finished it with {reason!r}")
    return reason  # type: ignore[return-value]
