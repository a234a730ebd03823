"""docs/reference/config.md from the pydantic models: one table per config section.

The walk follows each field's annotation: a model (or ``Model | None``) is a section of its
own, ``dict[str, Model]`` a section keyed ``<name>``, ``list[Model]`` one keyed ``[]``, and a
union of models one section per member (``engine.options`` has one per backend).
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

# Placeholders of the keys of a dict-of-models section, by the dotted path of the dict.
DICT_KEYS = {"policies": "<name>", "rollout.nodes": "<pattern>", "models": "<model>"}

_BOUNDS = ((Ge, "ge", ">="), (Gt, "gt", ">"), (Le, "le", "<="), (Lt, "lt", "<"),
           (MinLen, "min_length", "length >="), (MaxLen, "max_length", "length <="))  # fmt: skip


@dataclass
class Section:
    """One table of the page: the fields of ``model`` under the dotted ``path``."""

    path: str
    model: type[BaseModel]
    note: str = ""


def is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _union_args(tp: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return None


def _strip_annotated(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def type_name(tp: Any) -> str:
    """A readable type: ``int``, ``"grpo" | "rloo"``, ``list[NodeRule]``, ``str | None``."""
    tp = _strip_annotated(tp)
    if tp is type(None) or tp is None:
        return "None"
    if tp is Any:
        return "Any"
    if (args := _union_args(tp)) is not None:
        return " | ".join(type_name(a) for a in args)
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(json.dumps(v) for v in typing.get_args(tp))
    if origin is not None:
        args = typing.get_args(tp)
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return f"tuple[{type_name(args[0])}, ...]"
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]" if args else name
    return getattr(tp, "__name__", str(tp))


def default_of(field: FieldInfo) -> str:
    """The default as YAML would spell it; a nested section's default reads ``(section)``."""
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, tuple):
        value = list(value)
    return json.dumps(value)


def constraints_of(field: FieldInfo) -> str:
    """Bounds from the field's metadata (``ge=1`` -> ``>= 1``)."""
    found = []
    for meta in field.metadata:
        for kind, attr, symbol in _BOUNDS:
            if isinstance(meta, kind):
                found.append(f"{symbol} {getattr(meta, attr)}")
    return ", ".join(found)


def _children(path: str, tp: Any) -> Iterator[tuple[str, type[BaseModel]]]:
    """The sections a field of annotation ``tp`` at ``path`` opens, as (path, model)."""
    tp = _strip_annotated(tp)
    if is_model(tp):
        yield path, tp
        return
    if (args := _union_args(tp)) is not None:
        for arg in args:
            yield from _children(path, arg)
        return
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is dict and len(args) == 2:
        yield from _children(f"{path}.{DICT_KEYS.get(path, '<key>')}", args[1])
    elif origin in (list, tuple, set, frozenset) and args:
        yield from _children(f"{path}[]", args[0])


def sections(
    root: type[BaseModel], prefix: str = "", labels: dict[type, str] | None = None
) -> list[Section]:
    """Every section under ``root`` in field order, depth first (the root's own first). A
    union's member sections are told apart by ``labels[model]`` (else the model's name)."""
    labels = labels or {}
    out = [Section(prefix, root)]
    for name, field in root.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        found = list(_children(path, field.annotation))
        several = len(found) > 1
        for child_path, model in found:
            sub = sections(model, child_path, labels)
            if several:
                sub[0].note = labels.get(model, f"`{model.__name__}`")
            out.extend(sub)
    return out


def dotted_keys(root: type[BaseModel]) -> list[str]:
    """Every key of ``root``'s sections, as full dotted paths."""
    return [f"{s.path}.{name}" if s.path else name
            for s in sections(root) for name in s.model.model_fields]


def _escape(text: str, chars: str) -> str:
    text = re.sub(f"([{re.escape(chars)}])", r"\\\1", text)
    return text.replace("<", "&lt;")  # "<tag>" would be HTML; a lone ">" is text


def prose(text: str, chars: str = "[]") -> str:
    """``text`` on one line with, outside code spans, the brackets and angle brackets
    Markdown would read as links (``[TOOL_CALLS][{...}]``) or HTML tags escaped."""
    parts = re.split(r"(`+[^`]*`+)", " ".join(text.split()))
    return "".join(p if p.startswith("`") else _escape(p, chars) for p in parts)


def cell(text: str) -> str:
    """``prose`` for a table cell: pipes outside code spans escaped too (the table splitter
    leaves those inside alone)."""
    return prose(text, "[]|") or "—"


def _first_line(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def render_section(section: Section, title: str, summary: str | None = None) -> list[str]:
    """The section's heading, summary (its model's docstring) and table of keys."""
    heading = f"`{section.path}`" if section.path else title
    if section.note:
        heading += f" ({section.note})"
    summary = prose(_first_line(section.model.__doc__)) if summary is None else summary
    lines = [f"## {heading}", "", summary, "",
             "| Key | Type | Default | Allowed | Description |", "|---|---|---|---|---|"]
    for name, field in section.model.model_fields.items():
        key = f"{section.path}.{name}" if section.path else name
        default = default_of(field)
        default = default if default in ("required", "(section)") else f"`{default}`"
        cells = [f"`{key}`", f"`{type_name(field.annotation)}`", default,
                 constraints_of(field), field.description or ""]
        lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    return [*lines, ""]


INTRO = """\
# Configuration

Every key of a training config, generated from the pydantic models that validate it
(`python scripts/gen_reference.py`; do not edit this page by hand). A YAML file for
`agentrl train` or a dict for `sdk.train(..., config=...)` nests these sections; an unknown
key is an error. `TrainConfig.from_yaml(path)` loads a file, `to_yaml(path)` writes one with
every default filled in.

Keys written `<name>` or `<pattern>` are the keys of a mapping you choose (a policy's name, a
node path pattern). *Allowed* lists the numeric bounds a value must meet; a type written as
quoted strings lists every value accepted.

```yaml
model: {path: /models/my-policy}
rollout:
  n: 8
  sampling: {temperature: 1.0, max_tokens: 256}
algorithm: {advantage_estimator: grpo}
trainer: {lr: 1.0e-6}
data: {batch_size: 8}
max_steps: 100
```
"""

GATEWAY_SUMMARY = (
    "`GatewayConfig` configures the recording gateway (`agentrl_sdk.gateway.Gateway(..., "
    "config=GatewayConfig(...))`; `agentrl gateway` sets it from its options). It is not a "
    "section of the training config: its keys are the constructor's arguments."
)


SERVE_SUMMARY = (
    "`ServeConfig` configures a served graph (`sdk.serve(graph, model, config=ServeConfig(...))` "
    "or its keys as keyword arguments; `agentrl serve` sets it from its options and the "
    "config's `tracking` section). It is not a section of the training config."
)


def render(
    train_config: type[BaseModel], gateway_config: type[BaseModel], labels: dict[type, str],
    serve_config: type[BaseModel] | None = None,
) -> str:
    """The whole page: the training config's sections, then the gateway's, then serving's."""
    lines = [INTRO]
    for section in sections(train_config, labels=labels):
        lines += render_section(section, "Top level")
    for section in sections(gateway_config):
        summary = GATEWAY_SUMMARY if not section.path else None
        lines += render_section(section, "Gateway (`GatewayConfig`)", summary)
    for section in sections(serve_config) if serve_config is not None else []:
        summary = SERVE_SUMMARY if not section.path else None
        lines += render_section(section, "Serving (`ServeConfig`)", summary)
    return "\n".join(lines).rstrip() + "\n"
