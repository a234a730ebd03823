"""`TorchEngine`: an in-process transformers engine that batches requests continuously."""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from transformers import DynamicCache

from agentrl_sdk.allocator import keep_memory_lean
from agentrl_sdk.engines.stop_strings import StopStrings
from agentrl_sdk.engines.torch.decode_attention import use_decode_attention
from agentrl_sdk.engines.torch.packed_linears import PackedLinears
from agentrl_sdk.engines.torch.scheduler import (
    STOP,
    AdapterUpdate,
    Control,
    Request,
    Scheduler,
    WeightUpdate,
)
from agentrl_sdk.errors import EngineError
from agentrl_sdk.threads import run_blocking
from agentrl_sdk.types import GenerateResult, SamplingParams
from agentrl_sdk.weights.adapters import AdapterWeights, merged_weight
from agentrl_sdk.weights.push import WeightIntake, WeightPush
from agentrl_sdk.weights.shared_files import host_id

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["TorchEngine"]

MAX_PREFILL_TOKENS = 2048
"""Default bound of one prefill forward's tokens, padding included (as vLLM's
``max_num_batched_tokens``)."""


class TorchEngine:
    """Serves a local transformers causal LM with continuous batching, on CPU or one GPU.

    A single daemon thread owned by the engine runs the scheduler: between two decode steps
    it applies pending weight updates, drops cancelled requests, prefills newly arrived
    prompts in one left-padded forward and merges them into the running batch; then all
    running requests decode one token together over a shared KV cache. A request leaves
    the batch as soon as it samples a stop/EOS token (kept in its output), completes one of
    its stop strings (`SamplingParams.stop`; the completing token is kept) or reaches
    ``max_tokens``.

    ``generate`` may be awaited from any event loop in any thread: the answer is delivered
    with ``loop.call_soon_threadsafe``, so the caller's loop never waits on a forward.

    A response's ``policy_version`` is the version current when it *finished*; after a
    `load_weights` the requests already in flight continue on the new weights (their
    prompt and partial output prefilled again) and ``token_versions`` says which version
    sampled each token. `pause` stops decoding with every request held where it is;
    `resume` continues them.

    Args:
        model: A causal LM (e.g. ``Qwen2ForCausalLM``) with full attention; moved to eval mode.
        eos_token_ids: Ids that end every request. ``None`` reads
            ``model.generation_config.eos_token_id``; ``()`` means no EOS at all.
        max_batch_size: Most requests decoded at once; later ones wait their turn.
        cpu_threads: Torch threads of the engine's thread on CPU (``None``: torch's default,
            every core). Fewer when a trainer computes on the same cores at the same time:
            two sets of spinning OpenMP threads on one core slow both many times over.
        tokenizer: The model's tokenizer, needed only to stop on strings (requests with
            ``sampling.stop`` are refused without one).
        prefix_cache_mb: Budget of the prefix cache (0: none): keys and values of finished
            requests, and of the prompt prefix the requests admitted together share, so a
            prompt that starts with them prefills only the rest (`prefix_cache`). Cleared by
            every weight update.
        max_prefill_tokens: Most tokens (padding included) one prefill forward takes; the
            requests beyond join the running batch an iteration later (as vLLM's
            ``max_num_batched_tokens``). ``None``: every waiting request that fits
            ``max_batch_size`` at once. One prefill of 64 prompts x 330 tokens of a 135M
            model in float32 holds ~1.2 GB of activations (attention scores grow with the
            square of a prompt's length); in chunks of 2048 tokens, ~0.1 GB.
        share_prompts: Keep the prompt that a group's rows share once in the decode cache, not
            once per row: its memory is counted once and a decode step reads it once for the
            whole group (needs the engine's own decode attention, i.e. a model loaded with
            SDPA; others keep a copy per row).
        pack_weights: Serve bf16 linear layers from copies of their weights packed once into
            oneDNN's layout (`PackedLinears`): 25-40% faster matmuls on CPUs whose oneDNN
            computes bf16, for a second copy of those weights in memory. Ignored elsewhere.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        eos_token_ids: Iterable[int] | None = None,
        max_batch_size: int = 64,
        tokenizer: Any | None = None,
        cpu_threads: int | None = None,
        prefix_cache_mb: int = 0,
        max_prefill_tokens: int | None = MAX_PREFILL_TOKENS,
        share_prompts: bool = True,
        pack_weights: bool = True,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_prefill_tokens is not None and max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be >= 1, got {max_prefill_tokens}")
        if any(DynamicCache(config=model.config).is_sliding):
            raise ValueError(
                "TorchEngine supports full-attention models only; this config has "
                "sliding-window layers (disable use_sliding_window or serve it with vLLM)"
            )
        self._vocab_size = model.get_input_embeddings().num_embeddings
        self._eos = frozenset(_default_eos(model) if eos_token_ids is None else eos_token_ids)
        self._tokenizer = tokenizer
        self._cpu_threads = cpu_threads
        keep_memory_lean()  # before its first matmul: oneDNN reads its cache size once
        decoding = use_decode_attention(model)
        self._packed = PackedLinears(model if pack_weights else torch.nn.Module())
        self._scheduler = Scheduler(
            model.eval(), max_batch_size, prefix_cache_mb << 20, max_prefill_tokens,
            share_prompts=share_prompts and decoding,
        )
        self._lora_base: dict[str, torch.Tensor] = {}  # adapted weights before any adapter
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        dtype: torch.dtype | str = "auto",
        eos_token_ids: Iterable[int] | None = None,
        max_batch_size: int = 64,
        cpu_threads: int | None = None,
        prefix_cache_mb: int = 0,
        max_prefill_tokens: int | None = MAX_PREFILL_TOKENS,
        share_prompts: bool = True,
        pack_weights: bool = True,
    ) -> TorchEngine:
        """Load a model (and its tokenizer, if saved beside it) from a local directory, never
        from the network, and serve it.

        Args:
            path: Directory holding ``config.json`` and the weights.
            dtype: Weight dtype; ``"auto"`` keeps the saved one.
            eos_token_ids: As in the constructor.
            max_batch_size: As in the constructor.
            cpu_threads: As in the constructor.
            prefix_cache_mb: As in the constructor.
            max_prefill_tokens: As in the constructor.
            share_prompts: As in the constructor.
            pack_weights: As in the constructor.

        Raises:
            FileNotFoundError: ``path`` is not a directory.
        """
        from transformers import AutoModelForCausalLM

        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"{os.fspath(path)!r} is not a local model directory; TorchEngine never "
                "downloads, so save the model with save_pretrained() and pass that directory"
            )
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
        return cls(model, eos_token_ids=eos_token_ids, max_batch_size=max_batch_size,
                   tokenizer=_saved_tokenizer(path), cpu_threads=cpu_threads,
                   prefix_cache_mb=prefix_cache_mb, max_prefill_tokens=max_prefill_tokens,
                   share_prompts=share_prompts, pack_weights=pack_weights)

    @property
    def model(self) -> PreTrainedModel:
        """The served model. Read it freely; change weights only through `load_weights`."""
        return self._scheduler.model

    @property
    def policy_version(self) -> int:
        """Version of the weights currently served: the one the last `load_weights` gave."""
        return self._scheduler.version

    @property
    def busy_seconds(self) -> float:
        """Seconds the engine thread has spent prefilling and decoding since it started.

        Its growth over a stretch of wall time is the engine's utilisation: time the engine
        idled (rollouts waiting on tools, on the slowest rollout, on the trainer) is the rest.
        """
        return self._scheduler.busy_s

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str,
        *,
        session_id: str | None = None,  # one engine: no replica to pin to
    ) -> GenerateResult:
        """Sample one response to ``prompt_ids``; cancelling the caller drops the request.

        Raises:
            ValueError: The prompt is empty or holds ids outside the vocabulary, or the request
                has stop strings and the engine no tokenizer.
            EngineError: The forward failed while the request was in flight, or the engine closed.
        """
        bad = [t for t in prompt_ids if not 0 <= t < self._vocab_size]
        if not prompt_ids or bad:
            raise ValueError(
                f"request {request_id!r}: prompt must be non-empty ids in [0, {self._vocab_size}); "
                f"got {len(prompt_ids)} ids, out of range: {bad[:5]}"
            )
        stop_strings = None
        if sampling.stop:
            if self._tokenizer is None:
                raise ValueError(
                    f"request {request_id!r} has stop strings {list(sampling.stop)!r} but the "
                    "TorchEngine has no tokenizer to read them: pass tokenizer= (from_pretrained "
                    "loads one saved beside the model) or stop on token ids (stop_token_ids)"
                )
            stop_strings = StopStrings(self._tokenizer, sampling.stop)
        loop = asyncio.get_running_loop()
        generator = torch.Generator()
        if sampling.seed is None:
            generator.seed()
        else:
            generator.manual_seed(sampling.seed)
        request = Request(
            prompt_ids=list(prompt_ids),
            sampling=sampling,
            stop_ids=self._eos | frozenset(sampling.stop_token_ids),
            generator=generator,
            stop_strings=stop_strings,
            request_id=request_id,
            loop=loop,
            future=loop.create_future(),
        )
        self._submit(request)
        try:
            return await request.future
        except asyncio.CancelledError:
            request.cancelled = True
            raise

    @functools.cached_property
    def weight_intake(self) -> WeightIntake:
        """Tensors, files staged on this host, and adapters (merged or named), full weights
        best in the served dtype (staged files in it are served in place). A `RayEngine`
        around it also takes object references and broadcasts, turned into tensors there.
        Fixed for the engine's life: a push never changes the served dtypes."""
        floating = {t.dtype for t in self._scheduler.layout.values() if t.dtype.is_floating_point}
        dtype = str(floating.pop()).removeprefix("torch.") if len(floating) == 1 else None
        return WeightIntake(frozenset({"state_dict", "shared_files", "adapter"}), host_id(), dtype)

    async def load_weights(self, push: WeightPush, version: int) -> None:
        """Serve ``push`` from the next decode step on, as ``version``.

        Full weights must match the model (same keys and shapes; a ``partial`` push some of
        the keys, the others keep their values). Requests in flight continue
        on the new weights. Where a push's tensors may be served in place (staged files) and
        every one matches its parameter's dtype and shape, they are served without a copy.
        An adapter: see `_load_adapter`. Once submitted, the load is applied even if the
        awaiting caller is cancelled.

        Raises:
            EngineError: The weights do not fit the model (the old ones are left as they
                were), or the engine closed first.
        """
        if isinstance(push, AdapterWeights):
            await self._load_adapter(push, version)
            return
        state = await run_blocking(push.state_dict)
        served = self._scheduler.layout
        assign = push.serves_in_place and all(
            served.get(key) == (tensor.dtype, tuple(tensor.shape), "cpu")
            for key, tensor in state.items()
        )
        self._lora_base.clear()  # new base weights: the next adapter merges into these
        await self._apply(WeightUpdate, state, version, assign=assign, partial=push.partial)

    async def _apply(self, kind: type, *args: Any, **options: Any) -> None:
        """Submit a weight or adapter update, or a `Control`, to the engine thread and wait
        for it."""
        loop = asyncio.get_running_loop()
        update = kind(*args, loop=loop, future=loop.create_future(), **options)
        self._submit(update)
        await update.future

    async def _load_adapter(self, adapter: AdapterWeights, version: int) -> None:
        """Serve base + ``adapter``: only the adapter tensors travel.

        A named adapter (``adapter.name``) is kept apart and applied, row by row, to the
        requests whose ``SamplingParams.adapter`` names it, in the same continuous batch as
        the base's and other adapters' requests (`RowAdapters`); it replaces the adapter of
        that name, and only its requests in flight prefill again. An unnamed one is merged into
        the served weights.

        The base is the weights served when the first adapter arrived (or the last full
        push): the engine keeps each adapted base weight as it was (merged weights replace
        it in the model, never write into it: no copy, ~425 MB for SmolLM2's linear layers
        in float32), so every version is merged from the base, never stacked on the previous
        adapter. The merge is the trainer's (`merged_weight`, float32), so the served weights
        equal a merged push's.
        """
        if adapter.name is not None:
            await self._apply(AdapterUpdate, adapter, version)
            return
        try:
            merged = await run_blocking(self._merge_adapter, adapter)
        except (KeyError, ValueError, RuntimeError) as exc:
            raise EngineError(f"load_weights of an adapter failed, weights unchanged: "
                              f"{exc}") from exc  # fmt: skip
        await self._apply(WeightUpdate, merged, version, assign=True, partial=True)

    def _merge_adapter(self, adapter: AdapterWeights) -> dict[str, torch.Tensor]:
        served = self.model.state_dict()
        merged = {}
        for key, (lora_a, lora_b) in adapter.by_weight().items():
            if key not in served:
                raise KeyError(f"the adapter adapts {key!r}, which the served model lacks")
            base = self._lora_base.get(key)
            if base is None:  # kept, not copied: merges replace served tensors (assign), so
                # the base stays as loaded, e.g. views of the mapped model file
                base = self._lora_base[key] = served[key].detach()
            merged[key] = merged_weight(
                base.float(), lora_a.float(), lora_b.float(), adapter.scaling,
                key in adapter.fan_in_fan_out,
            ).to(base.dtype)  # fmt: skip
        return merged

    async def pause(self) -> None:
        """Stop decoding between two steps; requests in flight keep their partial output.

        New requests are accepted and wait; weight updates are applied at once. Returns once
        the engine thread has stopped stepping.
        """
        await self._apply(Control, "pause")

    async def resume(self) -> None:
        """Continue the requests held by `pause` (on the newest weights)."""
        await self._apply(Control, "resume")

    async def drop_prefix_cache(self) -> None:
        """Forget the prefix cache's keys and values (`CachesPrefixes`), between two steps."""
        await self._apply(Control, "drop_prefixes")

    async def health(self) -> bool:
        """True until `close` (or a crash of the engine thread)."""
        thread = self._thread
        return not self._closed and (thread is None or thread.is_alive())

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop the engine thread; requests not finished yet fail with `EngineError`.

        Args:
            timeout: Seconds to wait for the thread to finish its current step.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            self._scheduler.inbox.put(STOP)
        if thread is None:
            self._packed.restore()  # else the engine thread does, after its last forward
        elif thread is not threading.current_thread():
            thread.join(timeout)

    def _submit(self, item: Request | WeightUpdate | Control) -> None:
        with self._lock:
            if self._closed:
                raise EngineError("the TorchEngine is closed; create a new one to serve requests")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="agentrl-torch-engine", daemon=True
                )
                self._thread.start()
            self._scheduler.inbox.put(item)

    def _serve(self) -> None:
        """The engine thread: run the scheduler, then fail whatever is left."""
        if self._cpu_threads is not None:
            torch.set_num_threads(self._cpu_threads)  # OpenMP: this thread's own count
        try:
            self._scheduler.run()
        finally:
            with self._lock:
                self._closed = True
            self._scheduler.abort_all()
            self._packed.restore()  # the model computes as it did before this engine


def _saved_tokenizer(path: str | os.PathLike[str]) -> Any | None:
    """The tokenizer saved in the model directory ``path``, or None when there is none."""
    names = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
    if not any(os.path.exists(os.path.join(path, name)) for name in names):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _default_eos(model: PreTrainedModel) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)
