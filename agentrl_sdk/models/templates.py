"""Chat templates (Jinja) the project's tokenizers ship: Hermes/Qwen2.5 tools, Qwen3 thinking,
plain ChatML without tools (as SmolLM2) and a Llama-3-style template.

The hub is unreachable, so the templates of the real model families are written out here,
following the published Qwen2.5 / Qwen3 templates: tools listed in the system turn, calls as
``<tool_call>{json}</tool_call>``, tool results grouped into one user turn as
``<tool_response>`` blocks.
"""

from __future__ import annotations

_DEFAULT_SYSTEM = "You are a helpful assistant."

_TOOLS_PREAMBLE = (
    "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>"
)
_TOOLS_POSTAMBLE = (
    "\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n'
)

_SYSTEM_BLOCK = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- '" + _DEFAULT_SYSTEM + "' }}{%- endif %}"
    '{{- "' + _TOOLS_PREAMBLE + '" }}'
    '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}'
    '{{- "' + _TOOLS_POSTAMBLE + '" }}'
    "{%- else %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + _DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# `content_expr` lets the Qwen3 variant rewrite earlier assistant turns (think stripping).
_MESSAGES_BLOCK = (
    "{%- for message in messages %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "__CONTENT_EXPR__"
    "{{- '<|im_start|>assistant' }}"
    "{%- if content %}{{- '\\n' + content }}{%- elif not message.tool_calls %}{{- '\\n' }}{%- endif %}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

HERMES_TEMPLATE = _SYSTEM_BLOCK + _MESSAGES_BLOCK.replace("__CONTENT_EXPR__", "")
"""Qwen2.5-style template with Hermes tool calls. Prefix-preserving: history renders the same
whatever follows it."""

# Qwen3 drops the reasoning of assistant turns that precede the last user query, so a new user
# turn rewrites history: the token ledger must notice and start a new segment.
QWEN3_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    + _SYSTEM_BLOCK
    + _MESSAGES_BLOCK.replace(
        "__CONTENT_EXPR__",
        "{%- if loop.index0 < ns.last_query and '</think>' in content %}"
        "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
        "{%- endif %}",
    )
)
"""Qwen3-style template: like Hermes, but strips ``<think>`` blocks of earlier turns."""

# SmolLM2-Instruct's template, shape for shape: ChatML that ignores `tools` and `tool_calls`.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\n" + _DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Plain ChatML without tool support (as SmolLM2's): tools need a tool prompt around it. Set it
as ``tokenizer.chat_template`` of a Qwen-token tokenizer."""

TEMPLATES = {"hermes": HERMES_TEMPLATE, "qwen3": QWEN3_TEMPLATE}
"""Templates by name, as the tokenizer builders accept them."""

_LLAMA3_TOOLS = (
    "You have access to the following functions. To call functions, respond with JSON of the "
    'form {\\"name\\": function name, \\"parameters\\": dictionary of argument name and its '
    'value}; separate several calls with \\"; \\".\\n'
)

# Llama 3.1's custom-tool layout, shortened: tools in the system turn, calls as bare JSON
# (after `<|python_tag|>` when the turn also has text), results as `ipython` turns.
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages and messages[0].role == 'system' %}"
    "{%- set system = messages[0].content %}{%- set turns = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- set turns = messages %}{%- endif %}"
    "{%- if system or tools %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system }}"
    "{%- if tools %}"
    "{%- if system %}{{- '\\n\\n' }}{%- endif %}"
    '{{- "' + _LLAMA3_TOOLS + '" }}'
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for message in turns %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{%- set role = 'ipython' if message.role == 'tool' else message.role %}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + content }}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{%- if content %}{{- '<|python_tag|>' }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{%- if not loop.first %}{{- '; ' }}{%- endif %}"
    "{{- '{\"name\": \"' + tool_call.name + '\", \"parameters\": ' }}"
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
"""Llama-3-style template (``<|begin_of_text|>``, ``<|start_header_id|>role<|end_header_id|>``,
``<|eot_id|>``) with JSON tool calls. Prefix-preserving. Needs Llama 3's special tokens, so it
is not in `TEMPLATES`: `agentrl_sdk.models.llama_tokenizer` ships it."""
