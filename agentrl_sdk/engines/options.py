"""Typed options of each engine backend (``engine.options`` in a training config).

A field left unset (None) keeps the engine constructor's default, so defaults live in one place: the
engine. The vLLM engine and the vLLM server share every field but the server's own two.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agentrl_sdk.config import ConfigSection

__all__ = ["BACKEND_OPTIONS", "EngineOptions", "TorchOptions", "VLLMOptions", "VLLMServerOptions"]


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


BACKEND_OPTIONS: dict[str, type[EngineOptions]] = {
    "torch": TorchOptions,
    "vllm": VLLMOptions,
    "vllm-server": VLLMServerOptions,
}
"""The options model of each `create_engine` backend."""
