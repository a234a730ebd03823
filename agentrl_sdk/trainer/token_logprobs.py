"""Response-token logprobs (and entropies) of a causal LM, projected to the vocabulary only where
a token is trained, a chunk of positions at a time.

The LM head is the memory peak of an update: ``(B, T, V)`` float32 logits (and their
log-softmax, kept for the backward pass) over every response position — tool outputs and
padding included — are ~1 GB per micro-batch for a 49k vocabulary. Here the head runs inside
the model's own forward (so FSDP has its weights gathered) on the trained positions only, in
chunks whose ``(chunk, V)`` temporaries are recomputed in the backward pass instead of kept:
the same values and gradients, with a peak of one chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from agentrl_sdk.trainer.packing import PackedBatch

__all__ = ["CHUNK_POSITIONS", "response_logprobs"]

CHUNK_POSITIONS = 512
"""Trained positions projected at once: a ``(512, V)`` float32 block is 100 MB at V = 49k."""


def response_logprobs(
    model: nn.Module,
    batch: PackedBatch,
    temperature: float,
    *,
    with_entropy: bool,
    chunk: int = CHUNK_POSITIONS,
) -> tuple[Tensor, Tensor | None]:
    """Logprobs ``(B, T)`` of ``batch.response_ids`` at ``temperature``, and the entropies
    ``(B, T)`` of the same distributions when ``with_entropy``; 0 where ``response_mask`` is 0.

    Both carry gradient when autograd is on. ``model`` is a transformers causal LM whose
    forward takes ``logits_to_keep`` and returns its head's output as ``logits`` unchanged
    (Llama, Qwen2, Mistral and most others; a model that post-processes logits, e.g. Gemma 2's
    soft-capping, is refused).
    """
    rows, cols = (batch.response_mask > 0).nonzero(as_tuple=True)  # (N,) trained positions
    kept = batch.logit_index[rows, cols]  # the kept logit position predicting each
    targets = batch.response_ids[rows, cols]
    input_rows = batch.rows[rows]

    def select(hidden: Tensor, project: Callable[[Tensor], Tensor]) -> Tensor:
        picked = hidden[input_rows, kept]  # (N, H)
        parts = [
            _chunk_outputs(h, t, project, temperature, with_entropy)
            if not torch.is_grad_enabled()
            else checkpoint(_chunk_outputs, h, t, project, temperature, with_entropy,
                            use_reentrant=False)  # fmt: skip
            for h, t in zip(picked.split(chunk), targets.split(chunk), strict=True)
        ]
        return torch.cat(parts) if parts else hidden.new_zeros((0, 2), dtype=torch.float32)

    with _head_replaced(model, select) as returned:
        out = model(**batch.model_inputs(), logits_to_keep=batch.num_logits, use_cache=False)
    if out.logits is not returned[0]:
        raise ValueError(
            f"{type(model).__name__} post-processes its LM head's output (e.g. logit "
            "soft-capping); the trainer cannot compute its response logprobs position by position"
        )
    shape = batch.response_mask.shape
    values = out.logits  # (N, 2): logprob, entropy
    logp = values.new_zeros(shape).index_put((rows, cols), values[:, 0])
    entropy = None
    if with_entropy:
        entropy = values.new_zeros(shape).index_put((rows, cols), values[:, 1])
    return logp, entropy


def _chunk_outputs(
    hidden: Tensor,
    targets: Tensor,
    project: Callable[[Tensor], Tensor],
    temperature: float,
    with_entropy: bool,
) -> Tensor:
    """``(n, 2)``: the target's logprob and the entropy (0 unless ``with_entropy``) of ``n``
    positions, from their ``(n, H)`` hidden states."""
    z = project(hidden).float() / temperature  # (n, V)
    # log_softmax, not z - logsumexp(z): the same rounding as a full-vocabulary log_softmax.
    logp = z.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    if not with_entropy:
        return torch.stack([logp, torch.zeros_like(logp)], dim=-1)
    z = z.clamp_min(torch.finfo(z.dtype).min)  # -inf -> finite: probability 0, no NaN
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    entropy = lse.squeeze(-1) - (torch.exp(z - lse) * z).sum(-1)  # as `entropy_from_logits`
    return torch.stack([logp, entropy], dim=-1)


@contextmanager
def _head_replaced(
    model: nn.Module, select: Callable[[Tensor, Callable[[Tensor], Tensor]], Tensor]
) -> Iterator[list[Tensor]]:
    """The model's output embedding (LM head) computes ``select(hidden, head)`` instead of
    logits, ``head`` being its own forward (LoRA layers included). Yields a list that holds
    the returned tensor after the forward."""
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embedding (LM head)")
    project = head.forward
    returned: list[Tensor] = []

    def forward(hidden: Tensor) -> Tensor:
        returned.append(select(hidden, project))
        return returned[-1]

    head.forward = forward
    try:
        yield returned
    finally:
        del head.forward  # the class's forward again
