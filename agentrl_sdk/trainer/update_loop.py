"""The update loop of policy and critic ranks: an `Objective` over mini-batches (one optimizer
step each) and micro-batches (one forward/backward each, its loss scaled by its share of the
step's, `micro_batch_share`, so that FSDP's summed gradients are the whole batch's).

Every rank gets the whole batch and takes its part by the deterministic `shard_plan`.
"""

from __future__ import annotations

import resource
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from agentrl_sdk.algorithms import LossAgg, micro_batch_share, sequence_mass, token_share
from agentrl_sdk.algorithms.objectives import MetricShares
from agentrl_sdk.trainer.lora import lora_dropout_active
from agentrl_sdk.trainer.packing import (
    FlatSamples,
    PackedBatch,
    mini_batches,
    pack,
    shard_plan,
)
from agentrl_sdk.trainer.prefix_tree import pack_shared, prefix_plan

if TYPE_CHECKING:
    from agentrl_sdk.trainer.sharded_model import ShardedModel

__all__ = ["Objective", "per_token", "train"]


@dataclass(frozen=True)
class Objective:
    """What a rank trains: the loss of one packed micro-batch and how its metrics add up.

    Args:
        loss: ``batch -> (loss, metrics)``: the micro-batch's scalar loss, aggregated over its
            own tokens with ``agg``, and its metrics (floats): the model's forward, then an
            objective of `agentrl_sdk.algorithms.objectives`.
        agg: The loss aggregation, which sets each micro-batch's share of the step's loss.
        shares: Which metrics add up by loss share and which by token share.
        skips_inert: A sample none of whose trained tokens has an advantage adds nothing to
            the loss or its gradient (`inert_without_signal`): it is left out of the forward
            and backward passes but kept in the loss's denominator, so the update is the
            same; by-token metrics are then over the samples trained. A mini-batch of inert
            samples only steps the optimizer on zero gradients (AdamW's momentum and decay
            still move the weights, as they would have); its by-loss metrics are 0 and it
            has no by-token ones.
    """

    loss: Callable[[PackedBatch], tuple[torch.Tensor, dict[str, float]]]
    agg: LossAgg
    shares: MetricShares
    skips_inert: bool = False


def train(sharded: ShardedModel, flat: FlatSamples, objective: Objective) -> dict[str, float]:
    """``ppo_epochs`` passes over ``num_mini_batches`` mini-batches, one optimizer step each.

    Returns:
        The objective's metrics, ``grad_norm`` and ``lr`` averaged over the optimizer steps
        (``lr`` is the last step's), plus ``tokens``, ``trained_tokens``, ``samples``,
        ``samples_skipped`` (left out as inert, per pass), ``optimizer_steps``, ``step`` and
        ``peak_rss_gb``.
    """
    if len(flat) == 0:
        raise ValueError("update got an empty batch")
    cfg = sharded.config
    steps = [
        _optimizer_step(sharded, flat, mini, objective)
        for _ in range(cfg.ppo_epochs)
        for mini in mini_batches(len(flat), cfg.num_mini_batches)
    ]
    sharded.updates += 1
    # By-token metrics are means over the steps that trained tokens (see `_zero_step`).
    keys = dict.fromkeys(k for s in steps for k in s)
    metrics = {k: float(np.mean([s[k] for s in steps if k in s])) for k in keys}
    metrics["lr"] = steps[-1]["lr"]
    metrics["samples_skipped"] *= len(steps) / cfg.ppo_epochs  # a sum over one pass
    return metrics | {
        "tokens": float(flat.lengths.sum()),
        "trained_tokens": float(flat.trained_tokens.sum()),
        "samples": float(len(flat)),
        "optimizer_steps": float(len(steps)),
        "step": float(sharded.step),
        # This process's peak resident memory so far, in GiB (Linux reports KiB).
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


@torch.no_grad()
def per_token(
    sharded: ShardedModel, flat: FlatSamples, forward: Callable[[PackedBatch], torch.Tensor]
) -> np.ndarray:
    """``forward``'s (B, T) output for every response token of ``flat``, each rank computing
    its share (`shard_plan`), laid out like ``flat.response_ids`` with 0.0 at mask-0 positions;
    identical on every rank (a collective)."""
    plan = _plan(sharded, flat, range(len(flat)))
    out = np.zeros(len(flat.response_ids), dtype=np.float32)
    for indices in plan[sharded.rank]:
        values = forward(_packed(sharded, flat, indices)).cpu().numpy()
        for row, i in enumerate(indices):
            span = flat.response_slice(i)
            out[span] = values[row, : span.stop - span.start]
    out *= flat.response_mask
    total = torch.from_numpy(out).to(sharded.device)
    dist.all_reduce(total)  # each position is nonzero on one rank at most
    return total.cpu().numpy()


def _optimizer_step(
    sharded: ShardedModel, flat: FlatSamples, mini: list[int], objective: Objective
) -> dict[str, float]:
    cfg, agg = sharded.config, objective.agg
    # The loss's denominators are the whole mini-batch's (every rank holds the whole batch).
    mass, longest = _mass(flat, mini, agg), int(flat.response_lengths[mini].max(initial=1))
    trained = mini
    if objective.skips_inert:  # samples without signal skip the passes (see `Objective`)
        signal = flat.carries_signal
        trained = [i for i in mini if signal[i]]
    if not trained:
        return _zero_step(sharded, objective, skipped=len(mini))
    tokens = float(flat.trained_tokens[trained].sum())
    mine = _plan(sharded, flat, trained)
    shares = objective.shares
    sums = dict.fromkeys((*shares.by_loss, *shares.by_token), 0.0)
    sharded.optimizer.zero_grad(set_to_none=True)
    with lora_dropout_active(sharded.model, cfg.lora is not None):
        for indices in mine[sharded.rank]:
            batch = _packed(sharded, flat, indices)
            mask = batch.response_mask
            # share * (S_mb / d_mb) = S_mb / D: the micro-batch's part of the whole-batch loss.
            share = micro_batch_share(_mass(flat, indices, agg), mass, agg, mask.shape[1], longest)
            tokens_share = token_share(float(mask.sum()), tokens)
            loss, metrics = objective.loss(batch)
            (loss * share).backward()
            for key in shares.by_loss:
                sums[key] += metrics[key] * share
            for key in shares.by_token:
                sums[key] += metrics[key] * tokens_share
    stepped = sharded.optimizer_step()
    totals = torch.tensor(list(sums.values()), dtype=torch.float64, device=sharded.device)
    dist.all_reduce(totals)
    skipped = float(len(mini) - len(trained))
    return dict(zip(sums, totals.tolist(), strict=True)) | stepped | {"samples_skipped": skipped}


def _zero_step(sharded: ShardedModel, objective: Objective, skipped: int) -> dict[str, float]:
    """The optimizer step of a mini-batch whose samples are all inert: on zero gradients, as
    their forward and backward passes would have left them (every rank skips them alike)."""
    sharded.optimizer.zero_grad(set_to_none=True)
    for group in sharded.optimizer.param_groups:
        for param in group["params"]:
            param.grad = torch.zeros_like(param)
    stepped = sharded.optimizer_step()
    return dict.fromkeys(objective.shares.by_loss, 0.0) | stepped | {"samples_skipped": skipped}


def _mass(flat: FlatSamples, indices: Sequence[int], agg: LossAgg) -> float:
    """The aggregation's denominator over ``indices`` (see `sequence_mass`)."""
    idx = np.asarray(indices, dtype=np.int64)
    n = flat.trained_tokens[idx].astype(np.float64)
    w = flat.weights[idx].astype(np.float64)
    return float(sequence_mass(w, n, agg).sum())


def _plan(sharded: ShardedModel, flat: FlatSamples, indices: Sequence[int]) -> list[list[list[int]]]:
    """Who trains which of ``indices``: micro-batches per rank, laid out as prefix trees
    (`prefix_plan`) with ``share_prefix``, padded rows otherwise (`shard_plan`)."""
    cfg = sharded.config
    if cfg.share_prefix:
        return prefix_plan(flat, indices, sharded.world_size, cfg.micro_batch_tokens)
    return shard_plan(flat.lengths, indices, sharded.world_size, cfg.micro_batch_tokens)


def _packed(sharded: ShardedModel, flat: FlatSamples, indices: Sequence[int]) -> PackedBatch:
    if not indices:  # a rank with no work still joins the collectives of a forward/backward
        return pack(FlatSamples.placeholder(sharded.pad_id), [0], sharded.pad_id).to(sharded.device)
    packer = pack_shared if sharded.config.share_prefix else pack
    return packer(flat, indices, sharded.pad_id).to(sharded.device)
