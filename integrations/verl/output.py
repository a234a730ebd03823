"""A `Trajectory` as the fields of verl's ``AgentLoopOutput`` (pure; no verl import)."""

from __future__ import annotations

from itertools import groupby
from typing import Any

from agentrl_sdk.types import Segment, Trajectory


def agent_loop_fields(
    trajectory: Trajectory, *, prompt_ids: list[int], response_length: int,
    logprobs: bool = True,
) -> dict[str, Any]:
    """``AgentLoopOutput`` keyword arguments for ``trajectory``.

    verl trains one sequence per sample, so the trajectory's first trained segment is
    returned (a graph whose calls extend one conversation has exactly one); further
    segments are counted in ``extra_fields["agentrl_dropped_segments"]``. A rollout that
    made no call returns ``prompt_ids`` with an empty response.

    Args:
        trajectory: The rollout of the graph.
        prompt_ids: The templated prompt, used when the rollout made no call.
        response_length: verl's ``rollout.response_length``: longer responses are cut.
        logprobs: Whether the engine returned logprobs (else ``response_logprobs`` is None).
    """
    trained = trajectory.trained_segments
    segment = trained[0] if trained else Segment(node="", prompt_ids=list(prompt_ids))
    cut = slice(0, response_length)
    return {
        "prompt_ids": list(segment.prompt_ids),
        "response_ids": segment.response_ids[cut],
        "response_mask": segment.response_mask[cut],
        "response_logprobs": segment.response_logprobs[cut] if logprobs else None,
        "num_turns": _num_turns(segment),
        "metrics": {},
        "extra_fields": {
            # verl's own loops always set these two; keep the schema the same.
            "turn_scores": [],
            "tool_rewards": [v for k, v in sorted(trajectory.rewards.items())],
            "agentrl_status": trajectory.status,
            "agentrl_error": trajectory.error or "",
            "agentrl_rewards": dict(trajectory.rewards),
            "agentrl_dropped_segments": max(len(trained) - 1, 0),
            "agentrl_policy_versions": sorted({v for v in segment.response_versions if v >= 0}),
        },
    }


def _num_turns(segment: Segment) -> int:
    """verl's count: the prompt, then one turn per generated run and per observation run."""
    runs = sum(1 for _ in groupby(segment.response_mask))
    return 1 + runs
