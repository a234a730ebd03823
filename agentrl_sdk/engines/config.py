"""`EngineConfig`: the ``engine`` section of a training config, beside the engines it builds."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError, model_validator

from agentrl_sdk.config import ConfigSection
from agentrl_sdk.engines.options import (
    BACKENDS,
    BackendName,
    EngineOptions,
    TorchOptions,
    VLLMOptions,
    VLLMServerOptions,
)
from agentrl_sdk.engines.pool import HEALTH_TIMEOUT_S, RESTART_TIMEOUT_S

__all__ = ["EngineConfig"]


class EngineConfig(ConfigSection):
    """The inference engine rollouts sample from."""

    backend: BackendName = Field(
        "torch", description="Engine implementation: " + "; ".join(
            f"{name}: {backend.summary}" for name, backend in BACKENDS.items()) + ".",
    )
    max_batch_size: int = Field(
        64, ge=1, description="Most requests decoded together, for every backend (vLLM's "
        "max_num_seqs). The torch backend also takes engine.options.max_batch_size: when that "
        "is set it applies; setting both to different values is refused."
    )
    replicas: int = Field(1, ge=1, description="Engine replicas behind one EnginePool.")
    ray_actors: bool = Field(
        False, description="Run each engine replica in its own Ray actor (its own process and "
        "resources, apart from the driver and the trainer workers)."
    )
    max_restarts: int = Field(
        3, ge=0, description="Engine replicas rebuilt when one dies (a killed Ray actor, a "
        "failed health check): its requests move to the others (or fail, counted, if it was "
        "the only one) and the new replica serves from the next weight push."
    )
    health_timeout_s: float = Field(
        HEALTH_TIMEOUT_S, gt=0, description="Seconds a replica's health check (of a pool: "
        "replicas > 1, or Ray actors with max_restarts) may take before it counts as failed."
    )
    restart_timeout_s: float = Field(
        RESTART_TIMEOUT_S, gt=0, description="Longest wait for one replica rebuild."
    )
    url: str | None = Field(None, description="vllm-server: a running server to use.")
    options: TorchOptions | VLLMOptions | VLLMServerOptions = Field(
        default_factory=TorchOptions,
        description="The backend's own options, checked against its options model "
        "(`agentrl_sdk.engines.options`): torch: dtype; vllm: dtype, max_model_len, "
        "engine_args, cpu_threads, timeouts; vllm-server: the same with server_args. On CPUs "
        "vLLM gets every usable CPU as torch threads unless cpu_threads or OMP_NUM_THREADS "
        "says otherwise.",
    )

    @model_validator(mode="before")
    @classmethod
    def _options_of_the_backend(cls, data: Any) -> Any:
        if isinstance(data, dict) and not isinstance(data.get("options"), EngineOptions):
            backend = data.get("backend", "torch")
            if backend in BACKENDS:  # else the backend field reports the error
                model = BACKENDS[backend].options
                try:
                    options = model.model_validate(data.get("options") or {})
                except ValidationError as exc:
                    problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                         for e in exc.errors())
                    raise ValueError(f"engine.options of backend {backend!r}: {problems} "
                                     f"(allowed: {sorted(model.model_fields)})") from None
                data = {**data, "options": options}
        return data

    @model_validator(mode="after")
    def _url_for_server(self) -> EngineConfig:
        if self.url is not None and self.backend != "vllm-server":
            raise ValueError(f"engine.url is for backend 'vllm-server', not {self.backend!r}")
        if not isinstance(self.options, BACKENDS[self.backend].options):
            raise ValueError(f"engine.options are {type(self.options).__name__}, not the "
                             f"{BACKENDS[self.backend].options.__name__} of {self.backend!r}")
        own = getattr(self.options, "max_batch_size", None)
        if own not in (None, self.max_batch_size) and "max_batch_size" in self.model_fields_set:
            raise ValueError(
                f"engine.max_batch_size ({self.max_batch_size}) and engine.options.max_batch_size "
                f"({own}) are the same setting: keep one"
            )
        if self.options.actor_options is not None and not self.ray_actors:
            raise ValueError("engine.options.actor_options needs engine.ray_actors: true")
        return self

    def create_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `create_engine` besides the backend and model path: this
        section's fields (``url`` when set) and the backend's options, which override them."""
        fields = self.model_dump(exclude={"backend", "options"}, exclude_none=True)
        return {**fields, **self.options.engine_kwargs()}
