"""with_structured_output in JSON modes: TypedDict and JSON-schema dicts parse to dicts, and
callbacks see the schema as on LangChain's own structured-output paths."""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from pydantic import BaseModel
from typing_extensions import TypedDict

from agentrl_sdk import TokenChatModel


class Weather(TypedDict):
    """Weather report for a city."""

    city: str
    celsius: int


class WeatherModel(BaseModel):
    """Weather report for a city."""

    city: str
    celsius: int


class _Starts(BaseCallbackHandler):
    def __init__(self) -> None:
        self.options: list[dict[str, Any]] = []

    def on_chat_model_start(self, serialized, messages, **kwargs: Any) -> None:
        self.options.append(kwargs.get("options") or {})


def test_typed_dict_and_json_schema_parse_to_dicts(qwen_tokenizer, scripted):
    reply = '{"city":"Oslo","celsius":-3}'
    engine = scripted(qwen_tokenizer, [reply, reply, reply])
    model = TokenChatModel(engine=engine, tokenizer=qwen_tokenizer)
    schema = {"title": "Weather", "type": "object",
              "properties": {"city": {"type": "string"}, "celsius": {"type": "integer"}}}
    for s, method in ((Weather, "json_schema"), (Weather, "json_mode"), (schema, "json_schema")):
        out = model.with_structured_output(s, method=method).invoke("Oslo?")
        assert out == {"city": "Oslo", "celsius": -3}


def test_callbacks_see_the_structured_output_format(qwen_tokenizer, scripted):
    replies = ['{"city":"Oslo","celsius":-3}',
               '{"city":"Oslo","celsius":-3}}\n</tool_call>']  # after the forced opening
    model = TokenChatModel(engine=scripted(qwen_tokenizer, replies), tokenizer=qwen_tokenizer)
    starts = _Starts()
    for method in ("json_schema", "function_calling"):
        out = model.with_structured_output(WeatherModel, method=method).invoke(
            "Oslo?", config={"callbacks": [starts]})
        assert out == WeatherModel(city="Oslo", celsius=-3)
    formats = [o.get("ls_structured_output_format") for o in starts.options]
    assert [f["kwargs"]["method"] for f in formats] == ["json_schema", "function_calling"]
    assert all(f["schema"]["title"] == "WeatherModel" for f in formats)
