"""The torch engine's scheduler: the loop its background thread runs between model forwards."""

from __future__ import annotations

import asyncio
import functools
import queue
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch
from agentrl_sdk.engines.torch.kv_cache import RoomyCache
from agentrl_sdk.engines.torch.prefix_cache import PrefixCache, common_prefix, inputs_after_prefixes
from agentrl_sdk.engines.torch.row_adapters import RowAdapters
from agentrl_sdk.engines.torch.running_batch import RunningBatch, SequenceState
from agentrl_sdk.engines.torch.sampling import SamplingBuffers
from agentrl_sdk.engines.torch.shared_prompts import serving_prompts
from agentrl_sdk.errors import EngineError
from agentrl_sdk.types import GenerateResult

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from agentrl_sdk.weights.adapters import AdapterWeights

__all__ = [
    "STOP", "AdapterUpdate", "Control", "ControlAction", "Request", "Scheduler", "TensorLayout",
    "WeightUpdate",
]

STOP = object()
"""Put in the inbox to make `Scheduler.run` return."""


@dataclass(eq=False)
class Request(SequenceState):
    """A generate call in flight: its decode state plus where to deliver the answer."""

    request_id: str = ""
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future[GenerateResult] | None = None
    # Set by the caller's thread on cancellation; a plain bool is atomic under the GIL.
    cancelled: bool = False


ControlAction = Literal["pause", "resume", "drop_prefixes"]


@dataclass(eq=False)
class Control:
    """An order obeyed between two steps: pause or resume decoding, or drop the prefix cache
    (decoding goes on as it was); the future settles once the loop obeyed."""

    action: ControlAction
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


@dataclass(eq=False)
class WeightUpdate:
    """A state dict to load between two decode steps as ``version``, and where to report.

    ``partial``: the keys are a subset of the model's (an adapter push's merged weights).
    ``assign``: serve the given tensors themselves, no copy (a push's views of shared memory,
    which the trainer leaves alone until the next push but one: see `SharedWeights`).
    """

    state_dict: Mapping[str, torch.Tensor]
    version: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]
    partial: bool = False
    assign: bool = False


@dataclass(eq=False)
class AdapterUpdate:
    """A named adapter to serve from the next forward on as ``version`` (see `RowAdapters`)."""

    adapter: AdapterWeights  # its ``name`` is set
    version: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


class TensorLayout(NamedTuple):
    """What a served tensor is, apart from its values."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    device: str  # its device type: "cpu", "cuda", ...


class Scheduler:
    """Admits, prefills, decodes and answers requests; touched only by the engine thread.

    Each iteration, between two forwards: take everything from the inbox (applying weight
    updates and pause/resume on the spot), drop cancelled requests, prefill as many waiting
    prompts as the batch has room for (and `max_prefill_tokens` allows) in one left-padded
    forward and merge them in, then
    decode one token for every running request. Rows that finish are answered and removed at once.

    While paused the loop only takes inbox items: requests in flight keep their partial
    output and wait. New weights send every running request back to prefill its prompt plus
    partial output on the new weights (its KV cache came from the old ones); each token
    records the version that sampled it. A named adapter's update sends back only the rows
    that use it; the others keep their cache and their version.

    Versions: each update carries the version the driver gave its push; a request's version
    is that of the last update of what serves it (the base, or its adapter), so a policy's
    tokens carry the versions of its own pushes.

    Args:
        model: The causal LM to run.
        max_batch_size: Most requests decoded at once.
        prefix_cache_bytes: Budget of the prefix cache (0: none).
        max_prefill_tokens: Most tokens one prefill forward takes, padding included (None: no
            limit); the requests beyond wait for the next iteration.
        share_prompts: Keep a context that several admitted rows share (a group's prompt) once
            in the decode cache instead of once per row (`SharedPrompts`).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        max_batch_size: int,
        prefix_cache_bytes: int = 0,
        max_prefill_tokens: int | None = None,
        share_prompts: bool = False,
    ) -> None:
        self.model = model
        self.share_prompts = share_prompts
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.prefixes = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.version = 0
        self.paused = False
        # Seconds spent prefilling and decoding: what overlap could hide is the rest.
        self.busy_s = 0.0
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._waiting: deque[Request] = deque()
        self._prefilling: list[Request] = []
        self._batch = RunningBatch.empty()
        self._buffers = SamplingBuffers()
        self.adapters = RowAdapters(model)
        self._base_version = 0  # the version of the last change to the base weights
        self._assigned = False  # some parameters are a push's shared memory: never write them
        self._adapter_versions: dict[str, int] = {}

    def served_version(self, adapter: str | None) -> int:
        """The version of the weights that serve requests of ``adapter`` (None: the base)."""
        own = self._adapter_versions.get(adapter, 0) if adapter is not None else 0
        return max(self._base_version, own)

    def run(self) -> None:
        """Serve until `STOP` arrives; a failing step fails only the requests in flight."""
        while self._receive(block=self.paused or not (self._batch.rows or self._waiting)):
            if self.paused:
                continue
            started = time.perf_counter()
            try:
                self._drop_cancelled()
                self._admit()
                self._decode()
            except Exception as exc:  # noqa: BLE001 - mapped to EngineError for every caller
                self._fail(self._batch.rows + self._prefilling, cause=exc)
            self.busy_s += time.perf_counter() - started

    def abort_all(self) -> None:
        """Fail every request still running, waiting or queued: the engine is closing."""
        for item in _drain(self.inbox):
            if isinstance(item, Request):
                self._waiting.append(item)
            elif isinstance(item, (WeightUpdate, AdapterUpdate)):
                error = EngineError("load_weights aborted: the TorchEngine closed")
                deliver(item.loop, item.future, error=error)
            elif isinstance(item, Control):
                deliver(item.loop, item.future, error=EngineError("the TorchEngine closed"))
        self._fail(self._batch.rows + self._prefilling + list(self._waiting), cause=None)
        self._waiting.clear()

    def _receive(self, *, block: bool) -> bool:
        """Take everything queued (waiting for one item if ``block``); False once stopped."""
        items = [self.inbox.get()] if block else []
        items.extend(_drain(self.inbox))
        for item in items:
            if item is STOP:
                return False
            if isinstance(item, WeightUpdate):
                self._apply_weights(item)
            elif isinstance(item, AdapterUpdate):
                self._apply_adapter(item)
            elif isinstance(item, Control):
                if item.action != "drop_prefixes":
                    self.paused = item.action == "pause"
                elif self.prefixes is not None:
                    self.prefixes.clear(everything=True)
                deliver(item.loop, item.future, result=None)
            elif item.sampling.adapter is not None and item.sampling.adapter not in self.adapters:
                error = EngineError(
                    f"request {item.request_id!r} names adapter {item.sampling.adapter!r}, which "
                    f"this engine does not hold (it holds {self.adapters.names}); push it with "
                    "load_weights first"
                )
                deliver(item.loop, item.future, error=error)
            else:
                self._waiting.append(item)
        return True

    @functools.cached_property
    def layout(self) -> dict[str, TensorLayout]:
        """The served model's tensors by state-dict key: dtype, shape, device type (pushes
        replace values, never layouts)."""
        return {
            key: TensorLayout(tensor.dtype, tuple(tensor.shape), tensor.device.type)
            for key, tensor in self.model.state_dict().items()
        }

    @functools.cached_property
    def _slots(self) -> dict[str, tuple[torch.nn.Module, str]]:
        """Where each state-dict key lives: its module and attribute name. Replacing tensors
        there directly takes ~1 ms for a 135M model, where ``load_state_dict(assign=True)``
        walks every module (~4 ms)."""
        slots = {}
        for key in self.layout:
            prefix, _, name = key.rpartition(".")
            slots[key] = (self.model.get_submodule(prefix), name)
        return slots

    def _apply_weights(self, update: WeightUpdate) -> None:
        try:
            _check_state_dict(self.layout, update.state_dict, update.partial)
            if update.assign or self._assigned:
                # Copying into parameters that are shared memory would write the trainer's
                # files: replace them instead (with copies of what the caller may reuse).
                state = update.state_dict
                if not update.assign:
                    state = {key: tensor.clone() for key, tensor in state.items()}
                for key, tensor in state.items():  # checked above: nothing half-applies
                    module, name = self._slots[key]
                    current = getattr(module, name)
                    if isinstance(current, torch.nn.Parameter):
                        tensor = torch.nn.Parameter(tensor, current.requires_grad)
                    setattr(module, name, tensor)
                self._assigned = update.assign or (self._assigned and update.partial)
            else:
                self.model.load_state_dict(update.state_dict, strict=not update.partial)
        except Exception as exc:  # noqa: BLE001 - reported to the caller, serving goes on
            error = EngineError(f"load_weights failed, weights unchanged: {exc}")
            error.__cause__ = exc
            deliver(update.loop, update.future, error=error)
            return
        self.version = self._base_version = update.version
        if self.prefixes is not None:
            self.prefixes.clear(everything=True)
        # The running rows' KV cache holds the old weights' keys: prefill them again, first.
        rows = [r for r in self._batch.rows if not r.cancelled]
        self._batch = RunningBatch.empty()
        self._waiting.extendleft(reversed(rows))
        deliver(update.loop, update.future, result=None)

    def _apply_adapter(self, update: AdapterUpdate) -> None:
        name = update.adapter.name
        assert name is not None  # unnamed adapters are merged: a WeightUpdate
        try:
            self.adapters.set(name, update.adapter)
        except Exception as exc:  # noqa: BLE001 - reported to the caller, serving goes on
            error = EngineError(f"load_weights of adapter {name!r} failed, adapter unchanged: "
                                f"{exc}")
            error.__cause__ = exc
            deliver(update.loop, update.future, error=error)
            return
        self.version = self._adapter_versions[name] = update.version
        if self.prefixes is not None:
            self.prefixes.clear(name)
        # Only the adapter's rows hold keys of the old adapter: they alone prefill again.
        rows = self._batch.rows
        stale = [r for r in rows if r.sampling.adapter == name and not r.cancelled]
        self._batch.keep([i for i, r in enumerate(rows) if r.sampling.adapter != name])
        self._waiting.extendleft(reversed(stale))
        deliver(update.loop, update.future, result=None)

    def _drop_cancelled(self) -> None:
        if any(r.cancelled for r in self._waiting):
            self._waiting = deque(r for r in self._waiting if not r.cancelled)
        self._batch.keep([i for i, r in enumerate(self._batch.rows) if not r.cancelled])

    def _admit(self) -> None:
        """Prefill waiting prompts together and merge the survivors into the running batch."""
        room = min(self.max_batch_size - len(self._batch), len(self._waiting))
        if room <= 0:
            return
        self._prefilling = self._take(room)
        # A group's samples start from the same prompt: each distinct context is prefilled
        # once, and its rows get copies of its keys, values and next-token logits.
        slots: dict[tuple[str | None, tuple[int, ...]], int] = {}
        distinct: list[Request] = []
        where: list[int] = []  # each row's slot in ``distinct``
        for request in self._prefilling:
            key = _prefill_key(request)
            if key not in slots:
                slots[key] = len(distinct)
                distinct.append(request)
            where.append(slots[key])
        inputs, hits = self._prefill_inputs(distinct)
        logits, cache = self._forward(distinct, **inputs, logits_to_keep=1)
        mask = inputs["attention_mask"]
        lengths = torch.tensor([len(r.context) for r in self._prefilling])
        if len(distinct) < len(self._prefilling):
            logits = logits.index_select(0, torch.tensor(where, dtype=torch.long))
        own = RoomyCache(self.model.config) if self.share_prompts else None
        fresh = RunningBatch.of_prefill(self._prefilling, cache, mask, where, lengths, own, hits)
        tokens, logprobs = fresh.sample(logits, self._buffers)
        fresh.last = tokens
        self._record(fresh, tokens, logprobs)
        self._batch.merge(fresh)
        self._prefilling = []

    def _take(self, room: int) -> list[Request]:
        """The next (at most ``room``) waiting requests whose prefill fits `max_prefill_tokens`:
        distinct contexts x the longest uncached part, as the left-padded forward has it. The
        first request always goes, alone if it is longer: a prefill's activations (attention
        scores, MLP) grow with its tokens, ~1.2 GB at 64 prompts x 330 tokens in float32."""
        if self.max_prefill_tokens is None:
            return [self._waiting.popleft() for _ in range(room)]
        taken: list[Request] = []
        distinct: set[tuple[str | None, tuple[int, ...]]] = set()
        longest = 0
        while self._waiting and len(taken) < room:
            request, key = self._waiting[0], _prefill_key(self._waiting[0])
            if key not in distinct:
                cached = self.prefixes.cached_length(*key) if self.prefixes is not None else 0
                width = max(longest, len(request.context) - cached)
                if taken and (len(distinct) + 1) * width > self.max_prefill_tokens:
                    break
                distinct.add(key)
                longest = width
            taken.append(self._waiting.popleft())
        return taken

    def _prefill_inputs(self, rows: list[Request]) -> tuple[dict[str, Any], list | None]:
        """Left-padded inputs of ``rows``' contexts, after whatever prefix is cached, and each
        row's cached prefix (None: none). Rows that share a prompt prefix (a group's samples)
        get it prefilled once, first."""
        if self.prefixes is None:
            return RunningBatch.prefill_inputs(rows), None
        contexts = [r.context for r in rows]
        adapter = rows[0].sampling.adapter
        shared = common_prefix(contexts) if len(rows) > 1 else 0
        if shared and all(r.sampling.adapter == adapter for r in rows):
            if self.prefixes.cached_length(adapter, contexts[0]) < shared:
                prefix = contexts[0][:shared]
                _, cache = self._forward(
                    rows[:1], input_ids=torch.tensor([prefix]), logits_to_keep=1
                )
                self.prefixes.insert(adapter, prefix, *_row_kv(cache, 0))
        pairs = zip(rows, contexts, strict=True)
        hits = [self.prefixes.lookup(r.sampling.adapter, c) for r, c in pairs]
        if all(h is None for h in hits):
            return RunningBatch.prefill_inputs(rows), None
        return inputs_after_prefixes(contexts, hits, RoomyCache(self.model.config)), hits

    def _remember(self, batch: RunningBatch, index: int, row: Request) -> None:
        """Keep a finished row's keys and values: the next call of its tool loop extends it."""
        if self.prefixes is None or batch.cache is None:
            return
        tokens = row.context[:-1]  # its newest token was sampled, never fed
        held, wanted = self.prefixes.held(row.sampling.adapter, tokens)
        cached = None if held >= wanted else batch.row_cache(index, held, wanted, len(tokens))
        if cached is not None:  # only what is new
            self.prefixes.insert(row.sampling.adapter, tokens, *cached, offset=held)

    def _decode(self) -> None:
        batch = self._batch
        if not batch.rows:
            return
        inputs = batch.decode_inputs()
        with serving_prompts(batch.prompt_view()):
            logits, cache = self._forward(batch.rows, **inputs)
        tokens, logprobs = batch.sample(logits, self._buffers)
        batch.advance(cache, inputs["attention_mask"], tokens)
        self._record(batch, tokens, logprobs)

    def _forward(
        self, rows: list[Request], **inputs: Any
    ) -> tuple[torch.Tensor, RoomyCache]:
        """Last-position logits ``(B, V)`` of ``rows`` (each with its adapter) and the grown cache."""
        inputs.setdefault("past_key_values", RoomyCache(self.model.config))
        with torch.inference_mode(), self.adapters.rows([r.sampling.adapter for r in rows]):
            out = self.model(**inputs, use_cache=True)
        return out.logits[:, -1, :], out.past_key_values

    def _record(self, batch: RunningBatch, tokens: torch.Tensor, logprobs: torch.Tensor) -> None:
        """Append one sampled token per row; answer and remove the rows that finished."""
        survivors = []
        rows = zip(batch.rows, tokens.tolist(), logprobs.tolist(), strict=True)
        for i, (row, token, logprob) in enumerate(rows):
            version = self.served_version(row.sampling.adapter)
            reason = row.append(token, logprob, version)
            if reason is None:
                survivors.append(i)
                continue
            self._remember(batch, i, row)
            mixed = any(v != version for v in row.versions)
            result = GenerateResult(
                token_ids=row.token_ids,
                logprobs=row.logprobs,
                finish_reason=reason,
                policy_version=version,
                token_versions=row.versions if mixed else None,
            )
            deliver(row.loop, row.future, result=result)
        batch.keep(survivors)

    def _fail(self, requests: list[Request], cause: Exception | None) -> None:
        """Answer ``requests`` with `EngineError` and forget the running batch."""
        self._batch = RunningBatch.empty()
        self._prefilling = []
        for row in requests:
            if cause is None:
                error = EngineError(f"request {row.request_id!r} aborted: the TorchEngine closed")
            else:
                error = EngineError(
                    f"request {row.request_id!r} failed: the model forward raised {cause!r}; "
                    "the engine keeps serving, retry the request"
                )
                error.__cause__ = cause
            deliver(row.loop, row.future, error=error)


def deliver(
    loop: asyncio.AbstractEventLoop | None,
    future: asyncio.Future[Any] | None,
    *,
    result: Any = None,
    error: BaseException | None = None,
) -> None:
    """Settle ``future`` on its own loop's thread; a closed loop has nobody left waiting."""
    if loop is None or future is None:
        return

    def settle() -> None:
        if future.done():  # cancelled by the caller meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:
        pass  # the caller's loop is closed: its asyncio.run returned, nobody awaits this


def _prefill_key(request: Request) -> tuple[str | None, tuple[int, ...]]:
    """What one prefill row computes: requests with equal keys share it."""
    return request.sampling.adapter, tuple(request.context)


def _row_kv(cache: RoomyCache, index: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Row ``index``'s per-layer ``(H, L, D)`` keys and values: views of the batch's cache."""
    layers = list(cache.layers)
    return [la.keys[index] for la in layers], [la.values[index] for la in layers]


def _drain(inbox: queue.SimpleQueue[Any]) -> list[Any]:
    items = []
    while True:
        try:
            items.append(inbox.get_nowait())
        except queue.Empty:
            return items


def _check_state_dict(
    layout: Mapping[str, TensorLayout],
    state_dict: Mapping[str, torch.Tensor],
    partial: bool = False,
) -> None:
    """Raise before loading anything, so a mismatched update never half-applies."""
    expected = {key: tensor.shape for key, tensor in layout.items()}
    missing = [] if partial else sorted(expected.keys() - state_dict.keys())
    unexpected = sorted(state_dict.keys() - expected.keys())
    wrong = sorted(
        k for k in expected.keys() & state_dict.keys() if tuple(state_dict[k].shape) != expected[k]
    )
    if missing or unexpected or wrong:
        raise ValueError(
            f"state_dict does not match the served model: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}, wrong shape {wrong[:5]}"
        )
