"""Pure next-token sampling math for the torch engine: logits in, token ids and logprobs out."""

from __future__ import annotations

import torch

__all__ = ["filtered_logprobs", "sample_next"]


def filtered_logprobs(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Each row's sampling distribution: temperature, then top-k, then top-p, renormalised.

    The order matches Hugging Face's and vLLM's samplers: top-p is taken on the top-k
    renormalised distribution and keeps the smallest prefix of the sorted tokens whose mass
    reaches ``top_p``. Each row keeps the tokens whose scaled logit is at least its cut-off
    value, so exact ties at the cut-off are all kept. Only the first ``max(k)`` sorted values
    are computed unless some row needs top-p over the whole vocabulary.

    Args:
        logits: Raw next-token logits, ``(B, V)``.
        temperature: ``(B,)``, strictly positive.
        top_k: ``(B,)``; values ``<= 0`` keep the whole vocabulary.
        top_p: ``(B,)`` in ``(0, 1]``.

    Returns:
        ``logp``, ``(B, V)`` in vocabulary order; filtered tokens are ``-inf``.
    """
    vocab = logits.shape[-1]
    scaled = logits / temperature[:, None]  # (B, V)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)  # (B,)
    needs_p = top_p < 1.0  # (B,)
    filtered = (k < vocab) | needs_p  # (B,)
    if not bool(filtered.any()):
        return scaled.log_softmax(dim=-1)

    width = vocab if bool((needs_p & (k == vocab)).any()) else int(k[filtered].max())
    top, _ = scaled.topk(width, dim=-1)  # (B, W), descending
    ranks = torch.arange(width, device=logits.device)  # (W,)
    top = top.masked_fill(ranks[None, :] >= k[:, None], float("-inf"))
    probs = top.softmax(dim=-1)  # (B, W), the top-k renormalised distribution
    mass_before = probs.cumsum(dim=-1) - probs  # (B, W); 0 at rank 0, so one token always stays
    kept = torch.isfinite(top) & ((mass_before < top_p[:, None]) | ~needs_p[:, None])  # (B, W)
    cutoff = top.gather(1, (kept.sum(dim=-1, keepdim=True) - 1))  # (B, 1), smallest kept value
    cutoff = torch.where(filtered[:, None], cutoff, float("-inf"))
    return scaled.masked_fill(scaled < cutoff, float("-inf")).log_softmax(dim=-1)


def sample_next(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    noise: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row and its logprob under the distribution it was drawn from.

    Rows with ``temperature == 0`` are greedy: ``argmax(logits)`` with the raw
    ``log_softmax`` logprob. Other rows use the exponential race (vLLM's sampler):
    ``argmax_i p_i / E_i`` with ``E_i ~ Exp(1)`` is an exact draw from ``p``. A row's draw
    depends only on its own logits, parameters and noise, so a seeded request samples the
    same tokens in any batch; and unlike an inverse CDF it only flips when two noisy scores
    tie to float precision, so the ~1e-7 logit jitter between batch shapes does not show.

    Args:
        logits: Raw next-token logits, ``(B, V)``.
        temperature: ``(B,)``; ``0`` means greedy.
        top_k: ``(B,)``; values ``<= 0`` keep the whole vocabulary.
        top_p: ``(B,)`` in ``(0, 1]``.
        noise: ``(B, V)`` positive ``Exp(1)`` draws; ignored for greedy rows.

    Returns:
        ``(tokens, logprobs)``, both ``(B,)`` (long and float).
    """
    logits = logits.float()
    greedy = temperature <= 0  # (B,)
    any_greedy = bool(greedy.any())
    if any_greedy:
        greedy_tokens = logits.argmax(dim=-1)  # (B,)
        greedy_logp = logits.log_softmax(dim=-1).gather(1, greedy_tokens[:, None]).squeeze(1)
        if bool(greedy.all()):
            return greedy_tokens, greedy_logp

    safe_temperature = torch.where(greedy, torch.ones_like(temperature), temperature)
    logp = filtered_logprobs(logits, safe_temperature, top_k, top_p)  # (B, V)
    sampled_tokens = (logp.exp() / noise).argmax(dim=-1)  # (B,); filtered tokens score 0
    sampled_logp = logp.gather(1, sampled_tokens[:, None]).squeeze(1)  # (B,)
    if not any_greedy:
        return sampled_tokens, sampled_logp
    return (
        torch.where(greedy, greedy_tokens, sampled_tokens),
        torch.where(greedy, greedy_logp, sampled_logp),
    )
