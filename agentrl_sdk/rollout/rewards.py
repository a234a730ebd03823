"""Score trajectories with the user's reward function; failures are counted, never fatal."""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal

from agentrl_sdk.rollout.judge import GroupReward
from agentrl_sdk.types import RewardComponent, Trajectory

RewardValue = float | Mapping[str, float] | RewardComponent | Iterable[RewardComponent] | None
"""A number, named components, or components that credit nodes (`RewardComponent`)."""

RewardFn = Callable[[Any, Mapping[str, Any], Trajectory], RewardValue | Awaitable[RewardValue]]
"""``reward(final_state, row, trajectory)`` -> a `RewardValue` (sync or async); or a
`GroupReward` (e.g. ``sdk.rewards.judge``), which scores a row's rollouts together."""

OnRewardError = Literal["zero", "drop"]


def check_reward_fn(reward_fn: RewardFn | None) -> None:
    """Refuses, before any rollout, a reward function that cannot be called as
    ``reward(final_state, row, trajectory)`` (else every rollout would count a TypeError)."""
    if reward_fn is None or isinstance(reward_fn, GroupReward):
        return
    if not callable(reward_fn):
        raise TypeError(f"reward must be a function, got {type(reward_fn).__name__}")
    try:
        signature = inspect.signature(reward_fn)
    except (TypeError, ValueError):  # a builtin without a signature: called as it is
        return
    try:
        signature.bind(None, {}, None)
    except TypeError as exc:
        name = getattr(reward_fn, "__qualname__", repr(reward_fn))
        raise TypeError(
            f"the reward function {name}{signature} cannot be called as "
            f"reward(final_state, row, trajectory) ({exc}): give it those three parameters, "
            "e.g. `def reward(state, row, trajectory)` (unused ones may be named `_`)"
        ) from None


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
    component a node emitted with ``emit_reward``. Named components without a node are the
    shared outcome; a `RewardComponent` naming a node credits that node's policy only. A
    rollout that did not finish (status other than ``ok``) gets ``failed_rollout_reward``. A
    reward function that raises or returns None/NaN (or a non-number) is counted and treated
    per ``on_error``: ``zero`` scores 0, ``drop`` leaves ``reward`` None so the trajectory is
    not trained on. Returns the counters ``reward_errors`` and ``rollouts_failed``.
    """
    counts: Counter[str] = Counter()
    grouped = (await _group_values(reward_fn, trajectories, rows)
               if isinstance(reward_fn, GroupReward) else None)
    for traj in trajectories:
        emitted = sum(c.value for c in traj.components)
        if traj.status != "ok":
            counts["rollouts_failed"] += 1
            traj.reward = failed_rollout_reward + emitted
            continue
        try:
            if grouped is None:
                value = await _call(reward_fn, traj.final_state, rows[traj.row_id], traj)
            else:
                value = grouped[id(traj)]
                if isinstance(value, BaseException):
                    raise value
            components = _components(value)
        except Exception as exc:  # noqa: BLE001 - user code; the error is recorded on the trajectory
            counts["reward_errors"] += 1
            traj.metrics["reward_error"] = 1.0
            traj.error = f"reward function failed: {type(exc).__name__}: {exc}"
            traj.reward = None if on_error == "drop" else emitted
            continue
        traj.components.extend(components)
        traj.reward = sum(c.value for c in components) + emitted
    return counts


async def _group_values(
    reward_fn: GroupReward, trajectories: list[Trajectory], rows: Mapping[str, Mapping[str, Any]]
) -> dict[int, Any]:
    """Each finished trajectory's value from one `GroupReward` call per row (concurrently);
    a group whose call raised maps its trajectories to the exception."""
    groups: dict[str, list[Trajectory]] = {}
    for traj in trajectories:
        if traj.status == "ok":
            groups.setdefault(traj.row_id, []).append(traj)

    async def one(row_id: str, group: list[Trajectory]) -> dict[int, Any]:
        try:
            values = await reward_fn.score_group(
                [t.final_state for t in group], rows[row_id], group)
            if len(values) != len(group):
                raise ValueError(f"score_group returned {len(values)} rewards for "
                                 f"{len(group)} rollouts")
        except Exception as exc:  # noqa: BLE001 - counted per rollout by the caller
            return {id(t): exc for t in group}
        return {id(t): v for t, v in zip(group, values, strict=True)}

    parts = await asyncio.gather(*(one(r, g) for r, g in groups.items()))
    return {key: value for part in parts for key, value in part.items()}


async def _call(reward_fn: RewardFn | None, state: Any, row: Mapping[str, Any], traj: Trajectory):
    if reward_fn is None:
        return {}
    value = reward_fn(state, row, traj)
    return await value if inspect.isawaitable(value) else value


def _components(value: Any) -> list[RewardComponent]:
    """A reward value as finite components; raises on None, NaN or a non-number.

    bool is an int: ``return answer == target`` scores 1.0 / 0.0, as users expect; numpy and
    torch scalars are numbers too; strings are not.
    """
    if value is None:
        raise ValueError("reward function returned None")
    if isinstance(value, RewardComponent):
        return [value]
    if isinstance(value, Mapping):
        return [RewardComponent(name=str(k), value=v) for k, v in value.items()]
    if isinstance(value, list | tuple) and all(isinstance(v, RewardComponent) for v in value):
        return list(value)
    return [RewardComponent(name="reward", value=value)]
