"""Pipeline fixtures: what the trainer updates on."""

from __future__ import annotations

from collections import defaultdict

import pytest

import agentrl_sdk.pipeline.update as update_module


@pytest.fixture
def trained(monkeypatch):
    """Every batch the trainer updates on, by step (the real update runs)."""
    batches: dict[int, list] = defaultdict(list)
    update = update_module.update_policy

    async def spy(policy, step, samples):
        batches[step].extend(samples)
        return await update(policy, step, samples)

    monkeypatch.setattr(update_module, "update_policy", spy)
    return batches
