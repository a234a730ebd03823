"""docs/reference/cli.md from the typer app: every command, its arguments and options.

The parameters come from the click command typer builds (`typer.main.get_command`); only the
exit codes are written here, because they live in the commands' bodies, not in their
signatures (`test_cli_reference` fails when a command has none listed).
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import typer
from _ref_config import cell, prose

# What makes a command exit with 2 (the input is at fault) besides click's usage errors.
INPUT_ERRORS = {
    "show": "",
    "train": "an invalid or unreadable config (one line per problem: field, message, value "
             "given), a dataset refused as it loads (bad rows under `data.on_bad_row: raise`, "
             "or no usable row), an unreachable tracking store, a checkpoint that cannot be "
             "resumed.",
    "evaluate": "the same input checks as `train`.",
    "gateway": "options that make an invalid `GatewayConfig` (e.g. `--no-auth` on a "
               "non-loopback `--host` without `--i-know-its-open`), an unreachable "
               "`--tracking-uri`.",
    "serve": "an invalid or unreadable config, a config without `entrypoint.graph` or "
             "`rollout.timeout_s`, a model folder that is not there, a non-loopback `--host` "
             "without `--api-key` or `--i-know-its-open`, an unreachable tracking store.",
    "inspect": "`--html` without a TRACE_ID, or an invalid config named by `--config`.",
    "ui": "an invalid config named by `--config`.",
    "build-model": "",
    "import-model": "a source that cannot be imported (no GGUF file or HF causal-LM folder, "
                    "an unsupported architecture, a non-empty OUT without `--overwrite`).",
}

INTRO = """\
# CLI

The `agentrl` command, installed with the package. This page is generated from the commands'
own definitions (`python scripts/gen_reference.py`); `agentrl COMMAND --help` prints the same
help.

## Exit codes

| Code | Meaning |
|---|---|
| `0` | The command finished. |
| `1` | It failed while running (an engine, trainer or tool error: the traceback is printed). |
| `2` | The input is at fault: a usage error (unknown option, missing argument, bad \
value) or one of the command's input checks below. It prints `error: ...` on stderr, no \
traceback. |
"""


def _type_of(param: Any) -> str:
    try:
        return str(param.bare_type())  # typer's parameters
    except AttributeError:
        return getattr(getattr(param, "type", None), "name", "text").lower()


def _default_of(param: Any) -> str:
    if param.required:
        return "required"
    if param.default is None:
        return "—"
    value = param.default if isinstance(param.default, str) else json.dumps(param.default)
    return f"`{value}`"


def _names(param: Any) -> str:
    if param.param_type_name == "argument":
        return f"`{param.name.upper()}`"
    names = [*param.opts, *param.secondary_opts]
    return " / ".join(f"`{n}`" for n in names)


def render_command(name: str, command: Any) -> list[str]:
    """A command's section: usage, help, a table of its parameters, its exit-2 causes."""
    args = " ".join(p.name.upper() if p.required else f"[{p.name.upper()}]"
                    for p in command.params if p.param_type_name == "argument")
    paragraphs = inspect.cleandoc(command.help or "").split("\n\n")
    lines = [f"## `agentrl {name}`", "", "```", f"agentrl {name} [OPTIONS] {args}".rstrip(),
             "```", "", *(line for p in paragraphs for line in (prose(p), "")),
             "| Argument / option | Type | Default | Description |", "|---|---|---|---|"]
    for param in command.params:
        help_ = param.help or ""
        if getattr(param, "envvar", None):
            help_ += f" Environment variable: `{param.envvar}`."
        cells = [_names(param), f"`{_type_of(param)}`", _default_of(param), help_]
        lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    lines.append("")
    cause = INPUT_ERRORS[name]
    lines += [f"Exit code 2, besides usage errors: {cause}" if cause
              else "Exit code 2 for usage errors only.", ""]
    return lines


def commands(app: typer.Typer) -> dict[str, Any]:
    """The app's click commands by name, in definition order."""
    return dict(typer.main.get_command(app).commands)


def render(app: typer.Typer) -> str:
    """The whole page."""
    lines = [INTRO]
    for name, command in commands(app).items():
        lines += render_command(name, command)
    return "\n".join(lines).rstrip() + "\n"
