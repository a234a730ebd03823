"""The row schema: verl's fields (prompt, data_source, agent_name, reward_model, extra_info).

Every field is optional and unknown keys are kept, so plain rows with the user's own keys
validate too; what is there must have the right shape, and a row that does not is reported
with its index and the offending field.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = ["RowCheck", "RowProblem", "RowSchema", "check_row"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Message(_Open):
    """One chat message of a prompt (tool calls and other keys pass through)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[Any] | None = None


class ToolKwargs(_Open):
    """Per-row kwargs of one lifecycle tool (see `agentrl_sdk.tools.RLTool`)."""

    create_kwargs: dict[str, Any] | None = None
    execute_kwargs: dict[str, Any] | None = None
    calc_reward_kwargs: dict[str, Any] | None = None
    release_kwargs: dict[str, Any] | None = None


class ExtraInfo(_Open):
    """verl's ``extra_info``: free-form, with per-tool kwargs under ``tools_kwargs``."""

    tools_kwargs: dict[str, ToolKwargs | None] | None = None


class RewardModel(_Open):
    """verl's ``reward_model``: how the row is scored and against what."""

    style: str | None = None
    ground_truth: Any = None


class RowSchema(_Open):
    """A dataset row: verl's fields when present, anything else kept as is."""

    prompt: list[Message] | None = Field(None, min_length=1)
    messages: list[Message] | None = Field(None, min_length=1)
    data_source: str | None = None
    agent_name: str | None = None
    reward_model: RewardModel | None = None
    extra_info: ExtraInfo | None = None

    @model_validator(mode="before")
    @classmethod
    def _mapping(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise ValueError(f"a row must be a mapping, got {type(value).__name__}")
        return value


class RowProblem(BaseModel):
    """Why a row was rejected: its position in the dataset (and id), the field, what was wrong."""

    index: int
    field: str
    message: str
    row_id: str | None = None

    def __str__(self) -> str:
        named = f" (id {self.row_id!r})" if self.row_id is not None else ""
        return f"row {self.index}, field {self.field!r}: {self.message}{named}"


RowCheck = Callable[[Mapping[str, Any], int], RowProblem | None]
"""A further check of a schema-valid row and its index (e.g. `GraphInputCheck`)."""


def check_row(
    row: Any, index: int, agent_names: Collection[str] | None = None
) -> RowProblem | None:
    """None if ``row`` is usable, else its first problem.

    Args:
        row: The raw row.
        index: Its position in the dataset (for the report).
        agent_names: The agents the job can run; a row naming another ``agent_name`` is a
            problem. None accepts any name.
    """
    try:
        parsed = RowSchema.model_validate(row)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "(row)"
        return RowProblem(index=index, field=field, message=error["msg"])
    if agent_names is not None and parsed.agent_name is not None:
        if parsed.agent_name not in agent_names:
            known = ", ".join(sorted(agent_names))
            return RowProblem(index=index, field="agent_name",
                              message=f"unknown agent {parsed.agent_name!r} (known: {known})")
    return None
