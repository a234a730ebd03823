"""Samples laid out as a prefix tree: what several samples share is run once.

The samples of a group share their system prompt, tool schema and question, and the leaves of
a rollout tree their trunk's replies and tool outputs. `prefix_plan` orders a batch so that
samples sharing a prefix are neighbours and cuts it into micro-batches by the tokens they lay
out; `pack_shared` lays one micro-batch in one input row, each shared token once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from agentrl_sdk.trainer.packing import FlatSamples, PackedBatch, deal, padded, per_token_fields

__all__ = ["pack_shared", "prefix_plan"]


def prefix_plan(
    flat: FlatSamples, indices: Sequence[int], world_size: int, micro_batch_tokens: int
) -> list[list[list[int]]]:
    """`shard_plan` for `pack_shared`: ``plan[rank]`` is that rank's list of micro-batches.

    Samples are taken in the lexicographic order of their tokens, where the longest prefix a
    sample shares with any earlier one is the one it shares with its predecessor; a
    micro-batch takes them while the tokens it lays out stay within ``micro_batch_tokens`` (a
    sample longer than that gets one of its own). Micro-batches go, largest first, to the rank
    laying out the fewest tokens so far (`deal`), and every rank gets as many (`padded`).
    """
    order = sorted(indices, key=lambda i: (flat.tokens(i).tolist(), i))
    batches: list[list[int]] = []
    costs: list[int] = []
    previous = None
    for i in order:
        seq = flat.tokens(i)
        shared = _shared_length(seq, previous) if previous is not None else 0
        if batches and costs[-1] + len(seq) - shared <= micro_batch_tokens:
            batches[-1].append(i)
            costs[-1] += len(seq) - shared
        else:
            batches.append([i])
            costs.append(len(seq))
        previous = seq
    shares = deal(costs, range(len(batches)), world_size)
    return padded([[batches[b] for b in share] for share in shares])


def pack_shared(flat: FlatSamples, indices: Sequence[int], pad_id: int = 0) -> PackedBatch:
    """Lays samples ``indices`` of ``flat`` in one input row as a prefix tree: each sample's
    longest prefix that an earlier sample holds is laid out once, and only the rest is added;
    every token attends to the tokens of its own sample before it, wherever they lie.

    The n samples of a group (and every group of one agent) share a long system prompt and
    tool schema, the samples of a group their question, and the leaves of a rollout tree
    their trunk's replies and tool outputs: the model runs on each shared token once, and on
    no padding. A response token laid out once is predicted there for every sample that holds
    it, each with its own advantage, so the loss and gradients equal `pack`'s up to float
    rounding.

    Args and returns as `pack`; ``T`` is the longest response, the per-token fields are laid
    out as in `pack`.
    """
    if len(indices) == 0:
        raise ValueError("pack_shared needs at least one sample index")
    idx = np.asarray(indices, dtype=np.int64)
    tokens = [flat.tokens(int(i)) for i in idx]
    prompt_lengths = flat.prompt_lengths[idx].tolist()
    responses = [flat.response_ids[flat.response_slice(int(i))] for i in idx]
    # Where each sample's tokens lie in the row: its longest prefix an earlier sample holds
    # (at that sample's places), then its own tokens, appended.
    places: list[np.ndarray] = []
    added: list[tuple[int, int]] = []  # (shared tokens, the row's length before the sample)
    length = 0
    for seq in tokens:
        shared, source = 0, None
        for j, earlier in enumerate(tokens[: len(places)]):
            n = _shared_length(seq, earlier)
            if n > shared:
                shared, source = n, j
        head = places[source][:shared] if source is not None else np.zeros(0, dtype=np.int64)
        places.append(np.concatenate([head, np.arange(length, length + len(seq) - shared)]))
        added.append((shared, length))
        length += len(seq) - shared
    input_ids = np.empty(length, dtype=np.int64)
    position_ids = np.empty(length, dtype=np.int64)
    allowed = np.zeros((length, length), dtype=bool)
    for seq, at, (shared, start) in zip(tokens, places, added, strict=True):
        input_ids[start : start + len(seq) - shared] = seq[shared:]
        position_ids[start : start + len(seq) - shared] = np.arange(shared, len(seq))
        # A token added for this sample sees this sample's tokens up to itself (causal).
        allowed[np.ix_(at[shared:], at)] = np.tri(len(seq), dtype=bool)[shared:]
    # Response token j is predicted at the sample's position len(prompt) - 1 + j.
    predicted_at = [at[p - 1 : p - 1 + len(r)]
                    for at, p, r in zip(places, prompt_lengths, responses, strict=True)]  # fmt: skip
    first_logit = min((int(a.min()) for a in predicted_at if len(a)), default=length - 1)
    B, T = len(idx), max(1, max(len(r) for r in responses))
    logit_index = np.zeros((B, T), dtype=np.int64)
    response_ids = np.full((B, T), pad_id, dtype=np.int64)
    for row, (at, resp) in enumerate(zip(predicted_at, responses, strict=True)):
        logit_index[row, : len(resp)] = at - first_logit
        response_ids[row, : len(resp)] = resp
    return PackedBatch(
        input_ids=torch.from_numpy(input_ids)[None],
        attention_mask=torch.from_numpy(allowed)[None, None],
        num_logits=length - first_logit,
        logit_index=torch.from_numpy(logit_index),
        response_ids=torch.from_numpy(response_ids),
        weights=torch.from_numpy(flat.weights[idx].copy()),
        position_ids=torch.from_numpy(position_ids)[None],
        logit_rows=torch.zeros(B, dtype=torch.long),
        **per_token_fields(flat, idx, T),
    )


def _shared_length(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest prefix ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    differs = np.flatnonzero(a[:n] != b[:n])
    return int(differs[0]) if len(differs) else n
