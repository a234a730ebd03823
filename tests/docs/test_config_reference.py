"""docs/reference/config.md: every config key described, listed and current."""

from __future__ import annotations

import typing

import pytest
from pydantic import BaseModel

from agentrl_sdk.gateway import GatewayConfig
from agentrl_sdk.pipeline import TrainConfig
from tests.docs._helpers import ROOT, assert_fresh


def _models(tp) -> list[type[BaseModel]]:
    """The models an annotation reaches (through unions, lists, dicts, Annotated)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in typing.get_args(tp) for m in _models(arg)]


def _fields(model: type[BaseModel], prefix: str = ""):
    """(dotted key, field) of every field under ``model``; a mapping's or list's entries are
    written ``<...>`` / ``[]`` as the page writes them (any placeholder here)."""
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        yield key, field
        origin = typing.get_origin(field.annotation)
        for sub in _models(field.annotation):
            if origin is dict:
                inner = f"{key}.<"
            elif origin is list:
                inner = f"{key}[]."
            else:
                inner = f"{key}."
            yield from _fields(sub, inner)


@pytest.mark.parametrize("model", [TrainConfig, GatewayConfig])
def test_every_field_has_a_description(model):
    missing = [key for key, field in _fields(model) if not (field.description or "").strip()]
    assert not missing, f"fields without Field(description=...): {missing}"


def test_every_dotted_key_is_on_the_page():
    page = (ROOT / "docs" / "reference" / "config.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip().strip("`") for line in page.splitlines()
            if line.startswith("| `")}
    keys = [key for key, _ in _fields(TrainConfig)]
    assert len(keys) > 200
    missing = []
    for key in keys:
        if "<" in key:  # the page names the mapping's key: policies.<name>.path
            head, _, tail = key.partition(".<")
            found = any(r.startswith(head + ".<") and r.endswith(tail) for r in rows)
        else:
            found = key in rows
        if not found:
            missing.append(key)
    assert not missing, f"keys missing from docs/reference/config.md: {missing}"


def test_page_is_current(gen):
    assert_fresh(gen, "config.md")


def test_types_defaults_and_bounds_are_readable(gen):
    import _ref_config as ref

    fields = TrainConfig.model_fields
    assert ref.type_name(fields["pipeline"].annotation) == '"sync" | "fully_async"'
    assert ref.type_name(fields["epochs"].annotation) == "int | None"
    assert ref.constraints_of(fields["max_steps"]) == ">= 1"
    assert ref.default_of(fields["policies"]) == "{}"
    assert ref.default_of(fields["engine"]) == "(section)"
    paths = [s.path for s in ref.sections(TrainConfig)]
    assert paths.count("engine.options") == 3  # one table per backend's options model
    assert {"rollout.chat", "trainer.lora", "policies.<name>", "rollout.nodes.<pattern>",
            "evaluation.sampling"} <= set(paths)


def test_both_max_batch_size_keys_say_which_applies():
    from agentrl_sdk.engines.config import EngineConfig
    from agentrl_sdk.engines.options import TorchOptions

    top = EngineConfig.model_fields["max_batch_size"].description
    own = TorchOptions.model_fields["max_batch_size"].description
    assert "engine.options.max_batch_size" in top
    assert "engine.max_batch_size" in own
