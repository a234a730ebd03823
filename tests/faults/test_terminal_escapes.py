"""Escape sequences in model, tool and dataset text are shown escaped, never sent to the terminal."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from rich.console import Console
from typer.testing import CliRunner

from agentrl_sdk.cli import app
from agentrl_sdk.tracing import render_trace, render_trajectory
from agentrl_sdk.tracing.terminal import escape_controls
from agentrl_sdk.tracing.view import SpanLine, TraceView
from agentrl_sdk.types import Segment, Trajectory

CLEAR = "\x1b[2J"
TITLE = "\x1b]0;pwned\x07"
EVIL = f"a{CLEAR}b{TITLE}c\x9b31md\re\x7ff\x00[red]g"
SGR = re.compile(r"\x1b\[[0-9;]*m")  # rich's own colours: the only escapes it may write


def _terminal_output(renderable) -> str:
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system="truecolor", width=400).print(renderable)
    return out.getvalue()


def _assert_inert(output: str) -> None:
    """Nothing but rich's colour codes drives the terminal; the evil text is there, escaped."""
    bare = SGR.sub("", output)
    assert not [ch for ch in bare if ch not in "\n" and (ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0)]
    assert "\\x1b[2J" in bare and "\\x1b]0;pwned\\x07" in bare and "\\x9b31m" in bare


def test_the_rule_escapes_c0_c1_and_del_and_keeps_newline_and_tab():
    assert escape_controls(EVIL) == ("a\\x1b[2Jb\\x1b]0;pwned\\x07c\\x9b31md\\x0de\\x7ff"
                                     "\\x00[red]g")
    assert escape_controls("line 1\n\tline 2 ✓") == "line 1\n\tline 2 ✓"


def test_trajectory_view_escapes_generated_text_and_errors():
    tokenizer = SimpleNamespace(decode=lambda ids: EVIL)
    segment = Segment(node=f"solver{CLEAR}", prompt_ids=[1], response_ids=[2, 3],
                      response_mask=[1, 0], response_logprobs=[0.0, 0.0],
                      response_versions=[0, -1], num_calls=1)
    traj = Trajectory(row_id=f"row{TITLE}", sample_index=0, segments=[segment],
                      status="graph_error", error=f"tool said {EVIL}")

    output = _terminal_output(render_trajectory(traj, tokenizer))

    _assert_inert(output)
    assert "[red]g" in SGR.sub("", output)  # markup in the text stays literal


def test_trace_view_escapes_tool_io_span_names_and_segments():
    segment = {"node": "solver", "policy": "default", "trained": True,
               "started_because": "first_call", "prompt_ids": [1], "prompt_text": EVIL,
               "response_ids": [2, 3], "response_mask": [1, 0], "num_calls": 1,
               "runs": [{"mask": 1, "start": 0, "end": 1, "text": EVIL},
                        {"mask": 0, "start": 1, "end": 2, "text": EVIL}]}
    spans = [SpanLine(0, f"rollout{CLEAR}", "CHAIN", 1.0),
             SpanLine(1, "calculator", "TOOL", 1.0, inputs={"q": EVIL}, outputs=EVIL),
             SpanLine(1, "search", "TOOL", 1.0, inputs=EVIL, error=f"boom {TITLE}")]
    view = TraceView(trace_id="tr-1", tags={},
                     root={"row_id": f"r{TITLE}", "status": "ok", "error": EVIL, "advantage": 1.0},
                     segments=[segment], spans=spans)

    _assert_inert(_terminal_output(render_trace(view)))


def test_cli_inspect_listing_escapes_tags(monkeypatch):
    info = SimpleNamespace(trace_id="tr-1", execution_duration=5,
                           tags={"row_id": EVIL, "status": f"ok{TITLE}", "step": "0"})
    monkeypatch.setattr("agentrl_sdk.tracing.search_rollout_traces", lambda *a, **k: [info])
    monkeypatch.setattr("agentrl_sdk.cli.console", Console(force_terminal=True, width=1000))

    result = CliRunner().invoke(app, ["inspect", "--uri", "sqlite:///unused.db"])

    assert result.exit_code == 0, result.output
    _assert_inert(result.output)
