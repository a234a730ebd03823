"""An engine of your own: the least `agentrl_sdk` needs to sample from a model you serve.

This one runs a Hugging Face model's ``generate`` on CPU; a client of a remote server, a cache
or a test double has the same shape. Token ids in, token ids and their logprobs out: the
engine never sees text. Enough for rollouts and evaluation; to be trained, an engine also
takes weights (`load_weights`, `weight_intake`: see `agentrl_sdk.engines.Engine`).
"""

from __future__ import annotations

import asyncio

import torch

from agentrl_sdk.types import GenerateResult, SamplingParams


class HFGenerateEngine:
    """``model.generate`` behind the `Engine` call the chat model makes."""

    def __init__(self, model, eos_token_ids: list[int]) -> None:
        self.model = model.eval()
        self.eos_token_ids = eos_token_ids
        self.policy_version = 0  # the weights never change here
        self._lock = asyncio.Lock()  # one generate at a time: this model is not batched

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, request_id: str, *,
        session_id: str | None = None,
    ) -> GenerateResult:
        async with self._lock:
            return await asyncio.to_thread(self._generate, prompt_ids, sampling)

    @torch.no_grad()
    def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        sample = sampling.temperature > 0
        out = self.model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=sampling.max_tokens, do_sample=sample,
            temperature=sampling.temperature if sample else None,
            top_p=sampling.top_p if sample else None,
            top_k=sampling.top_k if sample and sampling.top_k > 0 else None,
            eos_token_id=list(sampling.stop_token_ids) or self.eos_token_ids,
            pad_token_id=self.eos_token_ids[0], output_scores=True,
            return_dict_in_generate=True,
        )  # fmt: skip
        ids = out.sequences[0, len(prompt_ids):].tolist()
        scores = self.model.compute_transition_scores(out.sequences, out.scores,
                                                      normalize_logits=True)  # fmt: skip
        stopped = bool(ids) and ids[-1] in (list(sampling.stop_token_ids) or self.eos_token_ids)
        return GenerateResult(
            token_ids=ids, logprobs=scores[0].tolist(), policy_version=self.policy_version,
            finish_reason="stop" if stopped else "length",
        )
