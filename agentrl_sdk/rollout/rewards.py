"""Score trajectories with the user's reward function; failures are counted, never fatal."""

from __future__ import annotations

import inspect
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

from agentrl_sdk.types import Trajectory

RewardFn = Callable[[Any, Mapping[str, Any], Trajectory], float | Mapping[str, float] | None
                    | Awaitable[float | Mapping[str, float] | None]]
"""``reward(final_state, row, trajectory)`` -> a number or named components (sync or async)."""

OnRewardError = Literal["zero", "drop"]


async def score(
    trajectories: list[Trajectory],
    rows: Mapping[str, Mapping[str, Any]],
    reward_fn: RewardFn | None,
    *,
    on_error: OnRewardError = "zero",
    failed_rollout_reward: float = 0.0,
) -> Counter[str]:
    """Set ``reward`` (and ``rewards`` components) on every trajectory, in place.

    The total is the reward function's value (or the sum of its components) plus every
    component a node emitted with ``emit_reward``. A rollout that did not finish (status
    other than ``ok``) gets ``failed_rollout_reward``. A reward function that raises or
    returns None/NaN is counted and treated per ``on_error``: ``zero`` scores 0, ``drop``
    leaves ``reward`` None so the trajectory is not trained on.

    Returns:
        Counters: ``reward_errors``, ``rollouts_failed``.
    """
    counts: Counter[str] = Counter()
    for traj in trajectories:
        emitted = sum(traj.rewards.values())
        if traj.status != "ok":
            counts["rollouts_failed"] += 1
            traj.reward = failed_rollout_reward + emitted
            continue
        try:
            value = await _call(reward_fn, traj.final_state, rows[traj.row_id], traj)
            components = _components(value)
        except Exception as exc:  # noqa: BLE001 - user code; the error is recorded on the trajectory
            counts["reward_errors"] += 1
            traj.metrics["reward_error"] = 1.0
            traj.error = f"reward function failed: {type(exc).__name__}: {exc}"
            traj.reward = None if on_error == "drop" else emitted
            continue
        traj.rewards.update(components)
        traj.reward = sum(components.values()) + emitted
    return counts


async def _call(reward_fn: RewardFn | None, state: Any, row: Mapping[str, Any], traj: Trajectory):
    if reward_fn is None:
        return {}
    value = reward_fn(state, row, traj)
    return await value if inspect.isawaitable(value) else value


def _components(value: Any) -> dict[str, float]:
    """A reward value as finite named components; raises on None, NaN or a non-number."""
    if isinstance(value, Mapping):
        items = {str(k): v for k, v in value.items()}
    elif value is None:
        raise ValueError("reward function returned None")
    else:
        items = {"reward": value}
    out = {}
    for name, v in items.items():
        # bool is an int: `return answer == target` scores 1.0 / 0.0, as users expect.
        if not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"reward component {name!r} is {v!r}, not a finite number")
        out[name] = float(v)
    return out
