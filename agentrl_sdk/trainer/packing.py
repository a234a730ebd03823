"""Pure data plumbing of the trainer: samples to flat arrays, shards, micro-batches, padded tensors.

Nothing here talks to torch.distributed or Ray. Every rank runs the same deterministic planning
functions on the same batch, so all ranks agree on who trains what without exchanging plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from agentrl_sdk.types import Sample

__all__ = [
    "FlatSamples",
    "PackedBatch",
    "deal",
    "micro_batches",
    "mini_batches",
    "pack",
    "padded",
    "per_token_fields",
    "shard_plan",
]


@dataclass(frozen=True)
class FlatSamples:
    """A batch of samples as a few flat numpy arrays: cheap to ship through Ray's object store.

    Token lists are concatenated; sample ``i`` owns ``[offsets[i], offsets[i + 1])`` of them.
    """

    prompt_ids: np.ndarray  # (sum P,) int64
    prompt_offsets: np.ndarray  # (N + 1,) int64
    response_ids: np.ndarray  # (sum R,) int64
    response_mask: np.ndarray  # (sum R,) int8
    old_logprobs: np.ndarray  # (sum R,) float32
    response_offsets: np.ndarray  # (N + 1,) int64
    advantages: np.ndarray  # (sum R,) float32 per token
    weights: np.ndarray  # (N,) float32
    token_weights: np.ndarray | None = None  # (sum R,) float32 off-policy weights; None: ones
    values: np.ndarray | None = None  # (sum R,) float32 critic values scored with; None: none
    returns: np.ndarray | None = None  # (sum R,) float32 critic targets; None: none

    @classmethod
    def from_samples(cls, samples: Sequence[Sample]) -> FlatSamples:
        """Flattens ``samples``, keeping their order.

        Raises:
            ValueError: A sample has no prompt token (its first response token would have no
                position to be predicted from).
        """
        if empty := [i for i, s in enumerate(samples) if not s.prompt_ids]:
            raise ValueError(
                f"samples {empty[:5]} have empty prompt_ids; every sample needs at least one "
                "prompt token to predict its first response token from"
            )

        def offsets(lengths: list[int]) -> np.ndarray:
            return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)

        def cat(lists: list[list], dtype: type) -> np.ndarray:
            return np.fromiter((x for xs in lists for x in xs), dtype=dtype)

        responses = [s.response_ids for s in samples]
        critic = {}
        if samples and all(s.values and s.returns for s in samples if s.response_ids):
            critic = {name: cat([getattr(s, name) or [0] * len(s.response_ids) for s in samples],
                                np.float32) for name in ("values", "returns")}  # fmt: skip
        return cls(
            prompt_ids=cat([s.prompt_ids for s in samples], np.int64),
            prompt_offsets=offsets([len(s.prompt_ids) for s in samples]),
            response_ids=cat(responses, np.int64),
            response_mask=cat([s.response_mask for s in samples], np.int8),
            old_logprobs=cat([s.old_logprobs for s in samples], np.float32),
            response_offsets=offsets([len(r) for r in responses]),
            advantages=cat([s.token_advantages for s in samples], np.float32),
            weights=np.array([s.weight for s in samples], dtype=np.float32),
            **critic,
        )

    @classmethod
    def placeholder(cls, pad_id: int = 0) -> FlatSamples:
        """One weightless, fully masked 2-token sample: what a rank with no work runs so that it
        still joins the collectives of a forward/backward."""
        return cls.from_samples([Sample(
            row_id="", sample_index=0, prompt_ids=[pad_id], response_ids=[pad_id],
            response_mask=[0], old_logprobs=[0.0], token_advantages=[0.0], weight=0.0,
        )])  # fmt: skip

    def __len__(self) -> int:
        return len(self.weights)

    @property
    def prompt_lengths(self) -> np.ndarray:
        """``(N,)`` prompt tokens per sample."""
        return np.diff(self.prompt_offsets)

    @property
    def response_lengths(self) -> np.ndarray:
        """``(N,)`` response tokens per sample (mask 0 and 1)."""
        return np.diff(self.response_offsets)

    @property
    def trained_tokens(self) -> np.ndarray:
        """``(N,)`` mask-1 response tokens per sample."""
        cumulative = np.concatenate([[0], np.cumsum(self.response_mask, dtype=np.int64)])
        return cumulative[self.response_offsets[1:]] - cumulative[self.response_offsets[:-1]]

    @property
    def carries_signal(self) -> np.ndarray:
        """``(N,)`` whether some trained (mask-1) token of the sample has an advantage."""
        signal = np.concatenate([[0], np.cumsum((self.advantages != 0) & (self.response_mask > 0))])
        return signal[self.response_offsets[1:]] > signal[self.response_offsets[:-1]]

    @property
    def lengths(self) -> np.ndarray:
        """``(N,)`` prompt plus response tokens per sample."""
        return self.prompt_lengths + self.response_lengths

    def response_slice(self, i: int) -> slice:
        """Where sample ``i``'s response lives in the flat response arrays."""
        return slice(int(self.response_offsets[i]), int(self.response_offsets[i + 1]))

    def tokens(self, i: int) -> np.ndarray:
        """Sample ``i``'s prompt then response ids."""
        prompt = self.prompt_ids[self.prompt_offsets[i] : self.prompt_offsets[i + 1]]
        return np.concatenate([prompt, self.response_ids[self.response_slice(i)]])

    def with_old_logprobs(self, old_logprobs: np.ndarray) -> FlatSamples:
        """A copy whose old logprobs are ``old_logprobs`` (same layout as ``response_ids``)."""
        return self._with_per_token("old_logprobs", old_logprobs)

    def with_token_weights(self, token_weights: np.ndarray) -> FlatSamples:
        """A copy whose per-token loss weights are ``token_weights`` (layout of ``response_ids``)."""
        return self._with_per_token("token_weights", token_weights)

    def _with_per_token(self, name: str, values: np.ndarray) -> FlatSamples:
        shape = self.response_ids.shape
        if values.shape != shape:
            raise ValueError(f"{name} must have shape {shape}, got {values.shape}")
        return replace(self, **{name: values.astype(np.float32, copy=False)})


@dataclass(frozen=True)
class PackedBatch:
    """Right-padded tensors of one micro-batch, with the response laid out on its own axis.

    The model runs on ``input_ids`` keeping only the last ``num_logits`` positions of logits
    (``logits_to_keep``); response token ``j`` of sample ``i`` is predicted by kept position
    ``logit_index[i, j]`` of input row ``logit_rows[i]``.

    `pack` lays one sample per input row, right-padded (``attention_mask`` ``(B, L)``);
    `pack_shared` (`prefix_tree`) lays them all in one row as a prefix tree, with a
    ``(1, 1, L, L)`` boolean ``attention_mask`` and ``position_ids``.
    """

    input_ids: torch.Tensor  # (B, L) long, padded with pad_id; (1, L) when shared
    attention_mask: torch.Tensor  # (B, L) long; (1, 1, L, L) bool when shared
    num_logits: int  # L - the earliest position that predicts a response token
    logit_index: torch.Tensor  # (B, T) long, 0 at padding
    response_ids: torch.Tensor  # (B, T) long, targets; pad_id at padding
    response_mask: torch.Tensor  # (B, T) float32, 0 at padding
    old_logprobs: torch.Tensor  # (B, T) float32, 0 at padding
    advantages: torch.Tensor  # (B, T) float32, 0 at padding
    weights: torch.Tensor  # (B,) float32
    token_weights: torch.Tensor | None = None  # (B, T) float32, 0 at padding; None: ones
    values: torch.Tensor | None = None  # (B, T) float32 critic values, 0 at padding
    returns: torch.Tensor | None = None  # (B, T) float32 critic targets, 0 at padding
    position_ids: torch.Tensor | None = None  # (1, L) long when shared; None: 0, 1, 2, ...
    logit_rows: torch.Tensor | None = None  # (B,) long when shared; None: sample i is row i

    @property
    def rows(self) -> torch.Tensor:
        """``(B,)`` the input row of each sample."""
        if self.logit_rows is not None:
            return self.logit_rows
        return torch.arange(self.input_ids.shape[0], device=self.input_ids.device)

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """The keyword arguments of the model's forward that describe the input."""
        inputs = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        if self.position_ids is not None:
            inputs["position_ids"] = self.position_ids
        return inputs

    def to(self, device: torch.device | str) -> PackedBatch:
        """The same batch on ``device``."""
        moved = {
            k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()
        }
        return PackedBatch(**moved)


def pack(flat: FlatSamples, indices: Sequence[int], pad_id: int = 0) -> PackedBatch:
    """Pads samples ``indices`` (in row order; not empty) of ``flat`` into one micro-batch,
    right-padded with ``pad_id`` (masked out everywhere); ``T`` is the longest response of the
    rows (at least 1)."""
    if len(indices) == 0:
        raise ValueError("pack needs at least one sample index")
    idx = np.asarray(indices, dtype=np.int64)
    p_len, r_len = flat.prompt_lengths[idx], flat.response_lengths[idx]
    B, L, T = len(idx), int((p_len + r_len).max()), max(1, int(r_len.max()))
    first_logit = int(p_len.min()) - 1  # the earliest position that predicts a response token
    input_ids = np.full((B, L), pad_id, dtype=np.int64)
    attention_mask = np.zeros((B, L), dtype=np.int64)
    logit_index = np.zeros((B, T), dtype=np.int64)
    response_ids = np.full((B, T), pad_id, dtype=np.int64)
    for row, i in enumerate(idx):
        p, r = int(p_len[row]), int(r_len[row])
        prompt = flat.prompt_ids[flat.prompt_offsets[i] : flat.prompt_offsets[i + 1]]
        resp = flat.response_slice(int(i))
        input_ids[row, :p] = prompt
        input_ids[row, p : p + r] = flat.response_ids[resp]
        attention_mask[row, : p + r] = 1
        # Token at position p + j is predicted by the logits at p + j - 1.
        logit_index[row, :r] = np.arange(p - 1, p - 1 + r) - first_logit
        response_ids[row, :r] = flat.response_ids[resp]
    return PackedBatch(
        input_ids=torch.from_numpy(input_ids),
        attention_mask=torch.from_numpy(attention_mask),
        num_logits=L - first_logit,
        logit_index=torch.from_numpy(logit_index),
        response_ids=torch.from_numpy(response_ids),
        weights=torch.from_numpy(flat.weights[idx].copy()),
        **per_token_fields(flat, idx, T),
    )


def per_token_fields(flat: FlatSamples, idx: np.ndarray, T: int) -> dict[str, torch.Tensor]:
    """The float per-token fields of samples ``idx``, ``(B, T)`` each, 0 at padding; the
    optional ones only when ``flat`` has them."""
    fields = {}
    for name in _PER_TOKEN:
        source = getattr(flat, name)
        if source is None:
            continue
        values = np.zeros((len(idx), T), dtype=np.float32)
        for row, i in enumerate(idx):
            span = flat.response_slice(int(i))
            values[row, : span.stop - span.start] = source[span]
        fields[name] = torch.from_numpy(values)
    return fields


_PER_TOKEN = (
    "response_mask", "old_logprobs", "advantages", "token_weights", "values", "returns",
)  # fmt: skip
"""The float per-token fields `pack` pads from ``FlatSamples`` into ``PackedBatch``."""


def micro_batches(
    lengths: Sequence[int], indices: Sequence[int], micro_batch_tokens: int
) -> list[list[int]]:
    """Groups ``indices`` into micro-batches of at most ``micro_batch_tokens`` padded tokens.

    A micro-batch costs ``rows * longest row`` tokens. Samples are taken longest first (less
    padding) and added to the current micro-batch while it stays within the budget; a sample
    longer than the budget forms a micro-batch of its own. ``lengths``: the tokens (prompt +
    response) of every sample of the batch, indexed by sample.
    """
    order = sorted(indices, key=lambda i: (-int(lengths[i]), i))
    groups: list[list[int]] = []
    for i in order:
        # Longest first, so the first row of a group is its longest.
        if groups and (len(groups[-1]) + 1) * int(lengths[groups[-1][0]]) <= micro_batch_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def shard_plan(
    lengths: Sequence[int], indices: Sequence[int], world_size: int, micro_batch_tokens: int
) -> list[list[list[int]]]:
    """Who trains samples ``indices`` (e.g. one mini-batch): ``plan[rank]`` is that rank's list
    of micro-batches (`micro_batches`). Samples go, longest first, to the rank with the fewest
    tokens so far (`deal`), and every rank gets as many micro-batches (`padded`)."""
    shards = deal(lengths, indices, world_size)
    return padded([micro_batches(lengths, shard, micro_batch_tokens) for shard in shards])


def deal(costs: Sequence[int], items: Sequence[int], world_size: int) -> list[list[int]]:
    """``items`` (indices of ``costs``) dealt, costliest first, each to the rank with the least
    cost so far (ties: lowest rank)."""
    load = [0] * world_size
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(items, key=lambda i: (-int(costs[i]), i)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        shares[rank].append(i)
        load[rank] += int(costs[i])
    return shares


def padded(plan: list[list[list[int]]]) -> list[list[list[int]]]:
    """``plan`` with every rank's micro-batches padded with empty ones to the same count: each
    forward/backward of an FSDP model is a collective that all ranks must join."""
    steps = max(len(p) for p in plan)
    return [p + [[] for _ in range(steps - len(p))] for p in plan]


def mini_batches(num_samples: int, num_mini_batches: int) -> list[list[int]]:
    """Cuts ``range(num_samples)`` into ``num_mini_batches`` contiguous, near-equal parts.

    Raises:
        ValueError: Fewer samples than mini-batches.
    """
    if num_samples < num_mini_batches:
        raise ValueError(
            f"a batch of {num_samples} samples cannot be cut into num_mini_batches="
            f"{num_mini_batches} mini-batches; lower num_mini_batches or collect more samples"
        )
    return [part.tolist() for part in np.array_split(np.arange(num_samples), num_mini_batches)]
