"""Render a trajectory for a person: prompt, generated (mask 1) and observation (mask 0) tokens."""

from __future__ import annotations

from itertools import groupby
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.text import Text

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
    """A segment's text, coloured by mask; runs of equal mask are decoded together."""
    text = Text()
    if show_prompt:
        text.append(tokenizer.decode(segment.prompt_ids), style=STYLES["prompt"])
    pairs = zip(segment.response_ids, segment.response_mask, strict=True)
    for mask, run in groupby(pairs, key=lambda p: p[1]):
        ids = [t for t, _ in run]
        style = STYLES["generated"] if mask else STYLES["observation"]
        text.append(tokenizer.decode(ids), style=style)
    return text


def render_trajectory(traj: Trajectory, tokenizer: Any, *, show_prompt: bool = True) -> Group:
    """Every segment of ``traj`` as a panel, titled with node, policy and token counts."""
    panels = []
    for i, seg in enumerate(traj.segments):
        generated = sum(seg.response_mask)
        title = (
            f"segment {i} · node {seg.node} · policy {seg.policy} · "
            f"{'trained' if seg.trained else 'frozen'} · started: {seg.started_because}"
        )
        subtitle = (
            f"prompt {len(seg.prompt_ids)} · generated {generated} · "
            f"observation {len(seg.response_ids) - generated} tokens · {seg.num_calls} calls"
        )
        panels.append(
            Panel(render_segment(seg, tokenizer, show_prompt=show_prompt), title=title,
                  subtitle=subtitle, title_align="left", subtitle_align="left")
        )
    head = Text(
        f"row {traj.row_id} · sample {traj.sample_index} · status {traj.status}"
        + (f" · reward {traj.reward:g}" if traj.reward is not None else "")
        + (f" · error: {traj.error}" if traj.error else ""),
        style="bold" if traj.status == "ok" else "bold red",
    )
    return Group(head, *panels)
