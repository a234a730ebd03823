"""Per-step rollout metrics: rewards, statuses, tokens — pure functions of trajectories."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence

from agentrl_sdk.types import Trajectory


def _generated_tokens(traj: Trajectory) -> float:
    """Tokens the engine sampled for ``traj`` alone: a tree leaf's segments repeat its trunk,
    whose tokens its recorder counted at one leaf of the tree only."""
    if traj.tree_path is not None:
        return traj.metrics.get("generated_tokens", 0.0)
    return sum(sum(s.response_mask) for s in traj.segments)


def rollout_metrics(trajectories: Sequence[Trajectory], seconds: float) -> dict[str, float]:
    """Reward mean/std (and per component name), status counts, token counts and throughput."""
    scored = [t.reward for t in trajectories if t.reward is not None]
    generated = sum(map(_generated_tokens, trajectories))
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
        for name, value in t.rewards.items():  # a name's credited parts (nodes, steps) summed
            components.setdefault(name, []).append(value)
    out.update({f"reward/{k}": statistics.fmean(v) for k, v in components.items()})
    out |= {f"status/{s}": float(c) for s, c in Counter(t.status for t in trajectories).items()}
    counters: Counter[str] = Counter()
    for t in trajectories:
        counters.update(t.metrics)
    out.update({f"rollout/{k}": float(v) for k, v in counters.items()})
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one row: ``1 - C(n - c, k) / C(n, k)``.

    The chance that at least one of ``k`` samples drawn without replacement from ``n``, of
    which ``c`` pass, passes (Chen et al., 2021, "Evaluating Large Language Models Trained on
    Code"). Raises ``ValueError`` unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def eval_metrics(
    trajectories: Sequence[Trajectory], seconds: float, *, pass_threshold: float = 1.0
) -> dict[str, float]:
    """`rollout_metrics` of held-out rollouts plus pass@k under the keys ``pass_at_1``,
    ``pass_at_2``, ``pass_at_4``, ... up to the samples per row (and that number itself),
    averaged over rows.

    A sample passes when its reward is at least ``pass_threshold``; an unscored one (reward
    dropped) does not pass.
    """
    out = rollout_metrics(trajectories, seconds)
    rows: dict[str, list[bool]] = {}
    for t in trajectories:
        rows.setdefault(t.row_id, []).append(t.reward is not None and t.reward >= pass_threshold)
    if not rows:
        return out
    n = min(len(passed) for passed in rows.values())
    ks = sorted({*(2**i for i in range(n.bit_length()) if 2**i <= n), n})
    for k in ks:
        out[f"pass_at_{k}"] = statistics.fmean(
            pass_at_k(len(passed), sum(passed), k) for passed in rows.values()
        )
    out["rows"] = float(len(rows))
    return out
