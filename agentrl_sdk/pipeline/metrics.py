"""Per-step rollout metrics: rewards, statuses, tokens — pure functions of trajectories."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence

from agentrl_sdk.types import Trajectory


def rollout_metrics(trajectories: Sequence[Trajectory], seconds: float) -> dict[str, float]:
    """Reward mean/std (and per component), status counts, token counts and throughput."""
    scored = [t.reward for t in trajectories if t.reward is not None]
    generated = sum(sum(s.response_mask) for t in trajectories for s in t.segments)
    out: dict[str, float] = {
        "rollouts": float(len(trajectories)),
        "reward/mean": statistics.fmean(scored) if scored else 0.0,
        "reward/std": statistics.pstdev(scored) if len(scored) > 1 else 0.0,
        "tokens/generated": float(generated),
        "tokens/generated_per_s": generated / seconds if seconds > 0 else 0.0,
        "llm_calls/mean": statistics.fmean(len(t.calls) for t in trajectories),
        "time/rollout_s": seconds,
    }
    versions = [c.policy_version for t in trajectories for c in t.calls]
    if versions:  # the weights that sampled this step: one version when on-policy
        out["policy_version/sampled_min"] = float(min(versions))
        out["policy_version/sampled_max"] = float(max(versions))
    components: dict[str, list[float]] = {}
    for t in trajectories:
        for name, value in t.rewards.items():
            components.setdefault(name, []).append(value)
    out.update({f"reward/{k}": statistics.fmean(v) for k, v in components.items()})
    for status, count in Counter(t.status for t in trajectories).items():
        out[f"status/{status}"] = float(count)
    counters: Counter[str] = Counter()
    for t in trajectories:
        counters.update(t.metrics)
    out.update({f"rollout/{k}": float(v) for k, v in counters.items()})
    return out
