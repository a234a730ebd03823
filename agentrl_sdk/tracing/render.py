"""Render trajectories and rollout traces for a person: tokens coloured by mask and advantage."""

from __future__ import annotations

import json
from collections.abc import Mapping
from itertools import groupby
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.text import Text
from rich.tree import Tree

from agentrl_sdk.tracing.terminal import escape_controls, plain
from agentrl_sdk.tracing.view import SpanLine, TraceView
from agentrl_sdk.types import Segment, Trajectory

STYLES = {"prompt": "grey50", "generated": "bold green", "observation": "cyan"}
"""Colours by token role; the legend printed with every trajectory."""


def legend() -> Text:
    """One line explaining the colours."""
    text = Text("legend: ")
    for role, style in STYLES.items():
        text.append(f"[{role}] ", style=style)
    text.append("(mask 1 = generated, trained; mask 0 = prompt and observations)")
    return text


def render_segment(segment: Segment, tokenizer: Any, *, show_prompt: bool = True) -> Text:
    """A segment's text, coloured by mask; runs of equal mask are decoded together (control
    characters in it are shown escaped, see `escape_controls`)."""
    text = Text()
    if show_prompt:
        text.append(escape_controls(tokenizer.decode(segment.prompt_ids)), style=STYLES["prompt"])
    pairs = zip(segment.response_ids, segment.response_mask, strict=True)
    for mask, run in groupby(pairs, key=lambda p: p[1]):
        ids = [t for t, _ in run]
        style = STYLES["generated"] if mask else STYLES["observation"]
        text.append(escape_controls(tokenizer.decode(ids)), style=style)
    return text


def render_trajectory(traj: Trajectory, tokenizer: Any, *, show_prompt: bool = True) -> Group:
    """Every segment of ``traj`` as a panel, titled with node, policy and token counts."""
    panels = [_panel(i, dict(seg), render_segment(seg, tokenizer, show_prompt=show_prompt))
              for i, seg in enumerate(traj.segments)]
    head = plain(
        f"row {traj.row_id} · sample {traj.sample_index} · status {traj.status}"
        + (f" · reward {traj.reward:g}" if traj.reward is not None else "")
        + (f" · error: {traj.error}" if traj.error else ""),
        style="bold" if traj.status == "ok" else "bold red",
    )
    return Group(head, *panels)


ADVANTAGE_STYLES = {"+": "bold green", "-": "bold red", "0": "bold yellow"}
"""Generated (trained) tokens of a traced rollout, by the sign of the rollout's advantage."""


def advantage_sign(advantage: float | None) -> str:
    """``+``, ``-`` or ``0`` (no advantage: not trained on, or a zero-variance group)."""
    if not advantage:
        return "0"
    return "+" if advantage > 0 else "-"


def trace_legend() -> Text:
    """The colours of `render_trace`."""
    text = Text("legend: ")
    text.append("[prompt] ", style=STYLES["prompt"])
    text.append("[observation, mask 0] ", style=STYLES["observation"])
    for sign, label in (("+", "advantage > 0"), ("-", "advantage < 0"), ("0", "advantage 0")):
        text.append(f"[generated, mask 1, {label}] ", style=ADVANTAGE_STYLES[sign])
    return text


def render_trace(view: TraceView, *, show_prompt: bool = True) -> Group:
    """A traced rollout for the terminal: summary, span tree (tools and errors inline) and every
    segment's tokens coloured by mask and advantage."""
    summary = view.summary()
    ok = summary["status"] == "ok"
    head = plain(f"trace {view.trace_id} · {view.title}", style="bold" if ok else "bold red")
    facts = Text()
    for key, value in summary.items():
        if value not in (None, {}, []):
            facts.append(f"{escape_controls(key)}: ", style="bold")
            facts.append(f"{_short(value)}   ", style="red" if key == "error" else "")
    tree = Tree(Text("spans", style="bold"))
    stack = [tree]
    for line in view.spans:
        del stack[line.depth + 1:]
        stack.append(stack[-1].add(_span_text(line)))
    sign = advantage_sign(summary["advantage"])
    panels = [_segment_panel(i, seg, sign, show_prompt) for i, seg in enumerate(view.segments)]
    return Group(head, facts, tree, trace_legend(), *panels)


_DETAIL_STYLES = {"in": "cyan", "out": "cyan", "tokens": "grey50", "error": "bold red"}


def _span_text(line: SpanLine) -> Text:
    text = plain(f"{line.name} ", style="red" if line.error else "")
    text.append(f"{line.duration_ms:.1f} ms", style="grey50")
    for label, value in line.details():
        shown = escape_controls(value) if label == "tokens" else f"{label}: {_short(value)}"
        text.append(f"  {shown}", style=_DETAIL_STYLES[label])
    return text


def _segment_panel(index: int, seg: dict[str, Any], sign: str, show_prompt: bool) -> Panel:
    text = Text()
    if show_prompt:
        prompt = seg.get("prompt_text") or ids_text(seg["prompt_ids"])
        text.append(escape_controls(prompt), style=STYLES["prompt"])
    for run in seg.get("runs", []):
        chunk = run["text"] if run["text"] is not None else ids_text(
            seg["response_ids"][run["start"]:run["end"]])
        style = ADVANTAGE_STYLES[sign] if run["mask"] else STYLES["observation"]
        text.append(escape_controls(chunk), style=style)
    return _panel(index, seg, text)


def _panel(index: int, seg: Mapping[str, Any], text: Text) -> Panel:
    """A segment's ``text`` in a panel titled with its node, policy and token counts (``seg``:
    a `Segment`'s fields, from a trajectory or read back from a trace)."""
    generated = sum(seg["response_mask"])
    title = (f"segment {index} · node {seg['node']} · policy {seg['policy']} · "
             f"{'trained' if seg['trained'] else 'frozen'} · started: {seg['started_because']}")
    subtitle = (f"prompt {len(seg['prompt_ids'])} · generated {generated} · observation "
                f"{len(seg['response_ids']) - generated} tokens · {seg['num_calls']} calls")
    return Panel(text, title=plain(title), subtitle=plain(subtitle), title_align="left",
                 subtitle_align="left")


def ids_text(ids: list[int]) -> str:
    """Token ids shown as ``[id]`` each, where a trace holds no decoded text."""
    return " ".join(f"[{t}]" for t in ids)


def _short(value: Any, limit: int = 160) -> str:
    text = escape_controls(value if isinstance(value, str) else json.dumps(value, default=str))
    return text if len(text) <= limit else text[: limit - 1] + "…"
