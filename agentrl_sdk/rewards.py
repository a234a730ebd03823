"""Reward helpers users pass as ``reward``: ``sdk.rewards.judge(model, rubric)``."""

from agentrl_sdk.rollout.judge import GroupReward, Judge, judge

__all__ = ["GroupReward", "Judge", "judge"]
