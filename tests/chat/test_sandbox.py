"""`compile_chat_template` renders what transformers' own compiled template renders, and
keeps the sandbox's refusals."""

from __future__ import annotations

import jinja2
import pytest
from jinja2.sandbox import SecurityError
from transformers.utils.chat_template_utils import _compile_jinja_template

from agentrl_sdk.chat.sandbox import compile_chat_template
from agentrl_sdk.models.templates import CHATML_TEMPLATE, TEMPLATES

# Attributes and keys both ways, a missing key, a dict method, the generation tag, a global.
PROBING = (
    "{% for message in messages %}{{ message.role }}|{{ message['content'] }}|"
    "{{ message.name is defined }}|{{ message.get('name', '-') }}|"
    "{% for k, v in message.items() %}{{ k }}={{ v | tojson }};{% endfor %}"
    "{% generation %}{{ message.content | length }}{% endgeneration %}\n{% endfor %}"
    "{% if add_generation_prompt %}{{ raise_exception('no') if messages | length > 9 }}>{% endif %}"
)

CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
CONVERSATION = [
    {"role": "system", "content": "You add."},
    {"role": "user", "content": "1+2? <b>&</b>"},
    {"role": "assistant", "content": "<think>\nsum\n</think>\n\n", "tool_calls": [CALL]},
    {"role": "tool", "content": "3", "tool_call_id": "c", "name": "add"},
    {"role": "assistant", "content": "3"},
    {"role": "user", "content": "again"},
]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add.",
                                           "parameters": {"type": "object", "properties": {}}}}]


@pytest.mark.parametrize("source", [*TEMPLATES.values(), CHATML_TEMPLATE, PROBING],
                         ids=[*TEMPLATES, "chatml", "probing"])
@pytest.mark.parametrize("end", [2, 4, 6])
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_renders_what_transformers_renders(source, end, generation_prompt):
    ours, theirs = compile_chat_template(source), _compile_jinja_template(source)
    for tools in (None, TOOLS):
        kwargs = {"messages": CONVERSATION[:end], "tools": tools,
                  "add_generation_prompt": generation_prompt, "eos_token": "</s>"}
        assert ours.render(**kwargs) == theirs.render(**kwargs)


def test_the_sandbox_still_refuses_unsafe_attributes_and_raises_template_errors():
    with pytest.raises(SecurityError):
        compile_chat_template("{{ messages[0].__class__.__mro__ }}").render(messages=[{}])
    with pytest.raises(SecurityError):  # immutable: no mutation of the caller's messages
        compile_chat_template("{{ messages[0].update({'a': 1}) }}").render(messages=[{}])
    with pytest.raises(jinja2.TemplateError, match="no"):
        compile_chat_template(PROBING).render(messages=[{"content": ""}] * 10,
                                              add_generation_prompt=True)
    # A key named like a dunder is data, as in transformers' environment
    probe = "{{ messages[0].__weird__ }}"
    assert compile_chat_template(probe).render(messages=[{"__weird__": "x"}]) == "x"
