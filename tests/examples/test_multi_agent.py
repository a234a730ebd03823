"""Supervisor + two workers: two trained policies and one frozen one in a single graph."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import agentrl_sdk.pipeline.loop as loop_module
from agentrl_sdk.algorithms import compute_grpo_advantages
from agentrl_sdk.pipeline import TrainConfig
from agentrl_sdk.tracing import load_trace_view, search_rollout_traces
from examples.multi_agent.train import HERE, run

pytestmark = pytest.mark.slow


OWN_CREDIT = {"supervisor": "routing", "default": "answer"}
"""The reward each trained policy learns from: its own nodes' credit, nothing shared."""


def test_brief_run_trains_two_policies_and_keeps_the_frozen_one(tmp_path, monkeypatch):
    batches = []  # (trajectories, samples) of every step
    trace = loop_module.trace_step

    def record(run, tracking, step, trajectories, samples, **kwargs):
        batches.append((trajectories, samples))
        return trace(run, tracking, step, trajectories, samples, **kwargs)

    monkeypatch.setattr(loop_module, "trace_step", record)
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    config.max_steps = 2
    config.data.batch_size = 4
    config.checkpoint.dir = str(tmp_path / "ckpt")
    config.checkpoint.every = 0
    config.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config.tracking.traces = "all"

    result = run(config)

    for step, metrics in enumerate(result.history, start=1):
        # Each trained policy got its own update and weight sync; the frozen one none.
        assert metrics["policy_version"] == step and metrics["policy_version/supervisor"] == step
        assert _updated_or_skipped(metrics, "train/supervisor/")
        assert not any(key.startswith(("train/words", "policy_version/words")) for key in metrics)
        assert "reward/routing" in metrics  # the supervisor's per-node reward
    _check_each_policy_learns_from_its_own_credit(batches)
    # Both trained policies were exported; the default one moved off its warm start if and
    # only if one of its batches had a signal (a batch without one takes no optimizer step).
    assert set(result.final_models) == {"supervisor"}
    before = load_file(f"{config.model.path}/model.safetensors")
    after = load_file(f"{result.final_model}/model.safetensors")
    updated = any(m.get("train/skipped_no_signal") == 0.0 for m in result.history)
    assert updated == any(not (before[k] == after[k]).all() for k in before)
    assert (tmp_path / "ckpt" / "policies" / "supervisor" / "step_2").is_dir()
    # The frozen worker ran: some rollout holds its segments, recorded as not trained.
    infos = search_rollout_traces(config.tracking.uri, run_id=result.run_id, limit=100)
    assert len(infos) == 64  # 2 steps x 4 rows x 8 samples
    segments = [s for i in infos for s in load_trace_view(config.tracking.uri, i.trace_id).segments]
    frozen = [s for s in segments if s["policy"] == "words"]
    assert frozen and all(not s["trained"] and s["node"] == "words_worker" for s in frozen)
    # No decorators: config.yaml's path rules attribute every node, the prebuilt math agent's
    # model node by its path.
    assert {(s["node"], s["policy"]) for s in segments} == {
        ("supervisor", "supervisor"), ("math_worker/agent", "default"), ("words_worker", "words")}
    assert all(s["trained"] for s in segments if s["policy"] != "words")


def _updated_or_skipped(metrics: dict[str, float], prefix: str) -> bool:
    """The policy's step either updated on trained tokens or, its batch without signal, was
    counted as skipped with no optimizer step."""
    if metrics[f"{prefix}skipped_no_signal"] == 1.0:
        return metrics[f"{prefix}optimizer_steps"] == 0.0
    return metrics[f"{prefix}trained_tokens"] > 0 and metrics[f"{prefix}optimizer_steps"] > 0


def _check_each_policy_learns_from_its_own_credit(batches) -> None:
    """Every sample's reward is its policy's own component, and its advantage the group's GRPO
    advantage of those rewards: the routing reward never moves the math worker, and back."""
    moved = False
    for trajectories, samples in batches:
        rollouts = {(t.row_id, t.sample_index): t for t in trajectories}
        groups: dict[tuple[str, str], dict[int, tuple[float, float]]] = {}
        for s in samples:
            traj = rollouts[s.row_id, s.sample_index]
            own = sum(c.value for c in traj.components if c.name == OWN_CREDIT[s.policy])
            assert s.reward == own
            moved |= s.reward != traj.reward  # the total holds the other policy's credit
            groups.setdefault((s.row_id, s.policy), {})[s.sample_index] = (s.reward, s.advantage)
        for group in groups.values():
            rewards, advantages = zip(*group.values(), strict=True)
            expected, _ = compute_grpo_advantages(torch.tensor(rewards, dtype=torch.float64),
                                                  [0] * len(rewards))
            assert list(advantages) == pytest.approx(expected.tolist())
    assert moved


def test_brief_lora_run_trains_two_adapters_of_one_base(tmp_path):
    """config_lora.yaml: the three policies are adapters of one base in one engine and one
    trainer; each trained adapter gets its own update and an adapter-only push."""
    config = TrainConfig.from_yaml(HERE / "config_lora.yaml")
    config.max_steps = 2
    config.data.batch_size = 4
    config.checkpoint.dir = str(tmp_path / "ckpt")
    config.checkpoint.every = 0
    config.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    result = run(config)

    full_bytes = sum(t.numel() * t.element_size()
                     for t in load_file(f"{config.model.path}/model.safetensors").values())
    for step, metrics in enumerate(result.history, start=1):
        assert _updated_or_skipped(metrics, "train/")
        assert _updated_or_skipped(metrics, "train/supervisor/")
        # One engine, the driver's versions: each adapter is the updates it has seen (its
        # initial push was version 0), whatever the order of the pushes.
        assert metrics["policy_version"] == step
        assert metrics["policy_version/supervisor"] == step
        for prefix in ("weight_sync/", "weight_sync/supervisor/"):
            assert 0 < metrics[f"{prefix}bytes"] < 0.5 * full_bytes  # adapters only
        assert not any(key.startswith(("train/words", "policy_version/words")) for key in metrics)
    # Both trained adapters were exported merged: each moved off the base when it had a
    # gradient, and they differ from each other.
    assert set(result.final_models) == {"supervisor"}
    base = load_file(f"{config.model.path}/model.safetensors")
    exported = {"train/": load_file(f"{result.final_model}/model.safetensors"),
                "train/supervisor/": load_file(
                    f"{result.final_models['supervisor']}/model.safetensors")}
    for prefix, weights in exported.items():
        pushed = any(m.get(f"{prefix}grad_norm", 0.0) > 0 for m in result.history)
        assert pushed == any(not torch.equal(base[k], weights[k]) for k in base), prefix
    assert any(m["train/supervisor/grad_norm"] > 0 for m in result.history)
    assert any(not torch.equal(exported["train/"][k], exported["train/supervisor/"][k])
               for k in base)
    assert (tmp_path / "ckpt" / "policies" / "supervisor" / "step_2").is_dir()


def test_brief_lora_run_fully_async(tmp_path):
    """The same three adapters under the fully-async pipeline: per-adapter pushes, and every
    trained token's version maps to a push of its own policy (else the staleness check raises)."""
    config = TrainConfig.from_yaml(HERE / "config_lora.yaml")
    config.pipeline = "fully_async"
    config.max_steps = 2
    config.data.batch_size = 2  # what it checks (versions, adapter pushes) needs no more rows
    config.checkpoint.dir = str(tmp_path / "ckpt")
    config.checkpoint.every = 0
    config.tracking.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    result = run(config)

    for step, metrics in enumerate(result.history, start=1):
        assert metrics["policy_version"] == metrics["policy_version/supervisor"] == step
        assert metrics["weight_sync/bytes"] == metrics["weight_sync/supervisor/bytes"] > 0
