"""`RuleEngine`: an engine that answers like a small obedient model, by rules over the prompt.

LangChain's standard integration tests ask a real model for tool calls, JSON and plain
replies. This stand-in decodes the prompt and writes what such a model would (a Hermes
``<tool_call>`` with arguments taken from the user's words, a JSON object for a JSON schema,
or a short text), encoded to ids the way an engine returns them. It honours ``max_tokens``,
stop ids and stop strings, so the chat layer around it runs exactly as with a real engine.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentrl_sdk.types import GenerateResult, SamplingParams

_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|$)", re.S)


class RuleEngine:
    """Answers each prompt by rules (see the module docstring); records every prompt."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.policy_version = 0
        self.prompts: list[str] = []
        self.answered: dict[str, tuple[list[int], GenerateResult]] = {}
        """Each request's prompt ids and result, by request id."""
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, request_id: str, *,
        session_id: str | None = None,
    ) -> GenerateResult:
        prompt = self.tokenizer.decode(prompt_ids)
        self.prompts.append(prompt)
        opening = _reply_opening(prompt)
        reply = answer(prompt)
        if opening:  # continue a reply the caller opened (a forced tool call)
            assert reply.startswith(opening), (opening, reply)
            reply = reply[len(opening):]
        ids = [*self.tokenizer.encode(reply, add_special_tokens=False), self.im_end]
        finish = "stop"
        for n in range(1, len(ids) + 1):
            text = self.tokenizer.decode(ids[:n])
            if ids[n - 1] in sampling.stop_token_ids or any(s in text for s in sampling.stop):
                ids = ids[:n]
                break
        if len(ids) > sampling.max_tokens:
            ids, finish = ids[: sampling.max_tokens], "length"
        result = GenerateResult(token_ids=ids, logprobs=[-0.1] * len(ids), finish_reason=finish,
                                policy_version=self.policy_version)
        self.answered[request_id] = (list(prompt_ids), result)
        return result

    async def health(self) -> bool:
        return True

    def close(self) -> None:
        pass


def answer(prompt: str) -> str:
    """What the obedient model says to ``prompt`` (a rendered ChatML conversation)."""
    turns = _TURN.findall(prompt)
    system = " ".join(text for role, text in turns if role == "system")
    users = [text for role, text in turns if role == "user"]
    last = users[-1] if users else ""
    schema = re.search(r"matching this JSON schema: (\{.*\})", system)
    if schema:
        return json.dumps(_fill(json.loads(schema.group(1)), last))
    if "Answer with a single JSON object" in system:
        return json.dumps({"setup": "Why?", "punchline": "Because."})
    tools = [json.loads(line) for line in _tools_lines(system)]
    opening = _reply_opening(prompt)
    forced = re.search(r'"name": "([^"]+)"', opening)
    if tools and ("<tool_response>" not in last or opening):
        named = [t for t in tools if t["function"]["name"] in (forced.group(1) if forced else last)]
        tool = (named or tools)[0]["function"]
        args = _fill(tool.get("parameters") or {}, last)
        call = json.dumps({"name": tool["name"], "arguments": args}, ensure_ascii=False)
        return f"<tool_call>\n{call}\n</tool_call>"
    if "<tool_response>" in last:
        result = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", last, re.S)
        return f"The tool answered: {result[-1] if result else ''}."
    return "Hello! How can I help you today?"


def _reply_opening(prompt: str) -> str:
    """What the reply already holds: the text after the prompt's last assistant header,
    when that turn is still open."""
    head = "<|im_start|>assistant\n"
    start = prompt.rfind(head)
    tail = prompt[start + len(head):] if start >= 0 else "<|im_end|>"
    return "" if "<|im_end|>" in tail else tail


def _tools_lines(system: str) -> list[str]:
    found = re.search(r"<tools>\n(.*?)\n</tools>", system, re.S)
    return [line for line in found.group(1).splitlines() if line.strip()] if found else []


def _fill(schema: dict[str, Any], words: str) -> Any:
    """A value for ``schema``: numbers from ``words`` in order, strings from its longest
    non-ASCII run (or a word), the first enum value, objects filled property by property."""
    numbers = iter(int(n) for n in re.findall(r"\d+", words))
    text = max(re.findall(r"[^\x00-\x7f]+", words), key=len, default="pirate")

    def value(spec: dict[str, Any]) -> Any:
        kind = spec.get("type")
        if "enum" in spec:
            return spec["enum"][0]
        if "anyOf" in spec:
            return value(spec["anyOf"][0])
        if kind in ("integer", "number"):
            return next(numbers, 1)
        if kind == "boolean":
            return True
        if kind == "array":
            return []
        if kind == "object":
            return {k: value(v) for k, v in (spec.get("properties") or {}).items()}
        return text

    return value({**schema, "type": schema.get("type", "object")})
