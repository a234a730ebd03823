"""Config validation errors for a person: one line per problem, no traceback.

Pydantic's own message already says what is allowed (``Input should be 'sync' or
'fully_async'``); this adds the field path, the value that was given and, for a misspelt key,
the nearest known one, so `agentrl train` can print the fix instead of a 60-line traceback.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Mapping, Sequence
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

__all__ = ["describe_validation_error"]


def describe_validation_error(
    exc: ValidationError, model: type[BaseModel], source: str | None = None
) -> str:
    """``exc`` as a few lines: a heading, then ``path: message (got value)`` per problem.

    Args:
        exc: The error `model` raised.
        model: The validated model (its fields give the "did you mean" suggestions).
        source: Where the values came from (a file name) for the heading.
    """
    errors = exc.errors(include_url=False)
    where = f"{source}: " if source else ""
    plural = "s" if len(errors) != 1 else ""
    lines = [f"{where}invalid {model.__name__} ({len(errors)} problem{plural})"]
    return "\n".join(lines + [f"  {_problem(error, model)}" for error in errors])


def _problem(error: Mapping[str, Any], model: type[BaseModel]) -> str:
    loc = tuple(error.get("loc", ()))
    path = ".".join(str(part) for part in loc) or "(top level)"
    message = str(error["msg"])
    if error.get("type") == "extra_forbidden":
        message = "unknown key"
        known = _keys_at(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1) if known and loc else []
        if close:
            message += f"; did you mean {'.'.join([*map(str, loc[:-1]), close[0]])!r}?"
        elif known:
            message += f"; known keys here: {', '.join(sorted(known))}"
    elif message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    given = error.get("input")
    # A cross-field rule's input is the whole section: its message names the fields already.
    if "input" in error and not isinstance(given, Mapping):
        message += f" (got {given!r})"
    return f"{path}: {message}"


def _keys_at(model: type[BaseModel], loc: Sequence[Any]) -> list[str] | None:
    """The field names of the section at ``loc`` (None when it is not a model)."""
    current: Any = model
    for part in loc:
        if (section := _model_of(current)) is None:
            current = _container_item(current)  # a dict's value, a list's item
        elif (field := section.model_fields.get(str(part))) is not None:
            current = field.annotation
        else:
            return None
        if current is None:
            return None
    section = _model_of(current)
    return list(section.model_fields) if section is not None else None


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        models = [m for m in map(_model_of, get_args(annotation)) if m is not None]
        return models[0] if len(models) == 1 else None
    return None


def _container_item(annotation: Any) -> Any:
    """The item type of ``dict[str, X]`` / ``list[X]`` (one loc part steps into it)."""
    args = get_args(annotation)
    if get_origin(annotation) in (dict, Mapping) and len(args) == 2:
        return args[1]
    if get_origin(annotation) in (list, tuple, Sequence) and args:
        return args[0]
    if get_origin(annotation) in (Union, types.UnionType):
        items = [i for i in map(_container_item, args) if i is not None]
        return items[0] if len(items) == 1 else None
    return None
