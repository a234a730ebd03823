"""The public surface: `__all__` lists exactly what users import, and every name resolves."""

from __future__ import annotations

import agentrl_sdk as sdk


def test_all_names_resolve_and_are_documented():
    for name in sdk.__all__:
        obj = getattr(sdk, name)
        if callable(obj):
            assert obj.__doc__, f"{name} has no docstring"


def test_the_design_entry_points_are_public():
    for name in ("train", "trainable", "frozen", "chat_model", "rollout", "arollout",
                 "TrainConfig", "Trajectory", "Segment", "LLMCall", "emit_reward"):
        assert name in sdk.__all__
