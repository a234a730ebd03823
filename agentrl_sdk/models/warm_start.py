"""Supervised warm start: fine-tune a model on chat conversations, loss on assistant tokens only."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentrl_sdk.algorithms.schedule import warmup_cosine
from agentrl_sdk.allocator import keep_memory_lean, return_free_memory
from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.config import ToolPromptMode
from agentrl_sdk.hardware import resolve_dtype

__all__ = ["build_sft_example", "build_sft_examples", "supervised_warm_start"]

Message = dict[str, Any]


def _template(tokenizer: PreTrainedTokenizerBase | ChatTemplate, tool_prompt: ToolPromptMode
              ) -> ChatTemplate:
    # A ChatTemplate given by the caller is reused: compiling one per conversation is waste.
    return tokenizer if isinstance(tokenizer, ChatTemplate) else ChatTemplate(tokenizer, tool_prompt)


def _assistant_turns(messages: Sequence[Message]) -> list[int]:
    if messages and messages[0]["role"] == "assistant":
        raise ValueError("a conversation must not open with an assistant message")
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"]


def _turn_span(
    template: ChatTemplate,
    messages: Sequence[Message],
    tools: list[dict[str, Any]] | None,
    turn: int,
    full: str,
) -> tuple[int, int] | None:
    """Where, in characters of ``full``, assistant message ``turn`` was generated.

    The span starts where the generation prompt (``<|im_start|>assistant\\n``) of the
    conversation so far ends and stops after the turn's closing token (``<|im_end|>``).
    ``None`` when ``full`` renders the history differently (e.g. Qwen3 drops ``<think>``
    blocks of turns before the last user message).
    """
    # The rollouts' renderer, tool prompt included: SFT and RL see the same prompts.
    prompt = template.render(list(messages[:turn]), tools, add_generation_prompt=True)
    with_turn = template.render(list(messages[: turn + 1]), tools, add_generation_prompt=False)
    if not (full.startswith(with_turn) and with_turn.startswith(prompt)):
        return None
    # The token that closes an assistant turn (``<|im_end|>``, ``<|eot_id|>``): the model
    # generates it, the rest of the template's suffix is prompt.
    end_of_turn = template.decode(template.encode(template.assistant_suffix)[:1])
    end = with_turn.rfind(end_of_turn) + len(end_of_turn)
    if end <= len(prompt):
        raise ValueError(f"assistant message {turn} does not end with {end_of_turn}")
    return len(prompt), end


def _tokenize_spans(
    tokenizer: PreTrainedTokenizerBase, full: str, spans: list[tuple[int, int]]
) -> tuple[list[int], list[int]]:
    input_ids: list[int] = []
    loss_mask: list[int] = []
    cursor = 0
    for start, end in [*spans, (len(full), len(full))]:
        for text, mask in ((full[cursor:start], 0), (full[start:end], 1)):
            ids = tokenizer.encode(text, add_special_tokens=False) if text else []
            input_ids += ids
            loss_mask += [mask] * len(ids)
        cursor = end
    expected = tokenizer.encode(full, add_special_tokens=False)
    if input_ids != expected:
        shorter = min(len(input_ids), len(expected))
        at = next((k for k in range(shorter) if input_ids[k] != expected[k]), shorter)
        raise ValueError(
            "tokenizing the assistant spans separately does not reproduce the conversation's "
            f"tokens (first difference at token {at}): a token merges across a turn boundary"
        )
    return input_ids, loss_mask


def build_sft_examples(
    tokenizer: PreTrainedTokenizerBase | ChatTemplate,
    messages: Sequence[Message],
    tools: list[dict[str, Any]] | None = None,
    tool_prompt: ToolPromptMode = "auto",
) -> list[tuple[list[int], list[int]]]:
    """Tokenizes a conversation into one or more examples, as the token ledger would see it.

    With a prefix-preserving template (Hermes) this is ``[build_sft_example(...)]``. When the
    template rewrites history (Qwen3 drops earlier ``<think>`` blocks), an assistant turn that
    the full rendering rewrites is learned in an extra example that ends with that turn, so
    every turn is trained in the context it was generated in.

    Args:
        tokenizer: A tokenizer with a chat template, or a `ChatTemplate` to reuse (its tool
            prompt then wins over ``tool_prompt``).
        messages: OpenAI-style messages (``role`` system/user/assistant/tool, ``content``).
        tool_prompt: How tools reach the prompt, as ``rollout.chat.tool_prompt`` of the
            rollouts.

    Returns:
        ``(input_ids, loss_mask)`` pairs, ordered by their last assistant turn; a single
        all-zero-mask pair for a conversation without assistant turns.

    Raises:
        ValueError: If the conversation opens with an assistant message, or a span does not
            tokenize on its own the way it does inside the conversation.
    """
    template = _template(tokenizer, tool_prompt)
    tokenizer = template.tokenizer
    pending = _assistant_turns(messages)
    if not pending:
        full = template.render(list(messages), tools, add_generation_prompt=False)
        return [_tokenize_spans(tokenizer, full, [])]
    examples = []
    end, first = len(messages), True
    while pending:
        full = template.render(list(messages[:end]), tools, add_generation_prompt=False)
        spans = {i: _turn_span(template, messages, tools, i, full) for i in pending}
        # The whole conversation may cover no turn (a trailing user message rewrote them all);
        # a prefix ending with the turn itself must cover it.
        if covered := [spans[i] for i in pending if spans[i] is not None]:
            examples.append(_tokenize_spans(tokenizer, full, covered))
        elif not first:
            raise ValueError(
                f"the chat template renders assistant message {pending[-1]} differently even "
                "when it is the last message"
            )
        pending = [i for i in pending if spans[i] is None]
        end, first = (pending[-1] + 1 if pending else end), False
    return examples[::-1]


def build_sft_example(
    tokenizer: PreTrainedTokenizerBase | ChatTemplate,
    messages: Sequence[Message],
    tools: list[dict[str, Any]] | None = None,
    tool_prompt: ToolPromptMode = "auto",
) -> tuple[list[int], list[int]]:
    """Tokenizes a conversation for supervised fine-tuning, marking the tokens to learn.

    The conversation is rendered with the tokenizer's chat template. ``loss_mask`` is 1 on what
    the model generates in each assistant turn, i.e. its content and the closing
    ``<|im_end|>``, and 0 elsewhere: system, user and tool turns, the
    ``<|im_start|>assistant\\n`` header, and the ``\\n`` after ``<|im_end|>``.

    Args: as in :func:`build_sft_examples`.

    Returns:
        ``(input_ids, loss_mask)``, two lists of the same length. ``input_ids`` equals the
        tokenization of the whole rendered conversation.

    Raises:
        ValueError: If the template rewrites earlier turns once later messages follow (use
            :func:`build_sft_examples`), or a span does not tokenize on its own the way it
            does inside the conversation.
    """
    template = _template(tokenizer, tool_prompt)
    tokenizer = template.tokenizer
    full = template.render(list(messages), tools, add_generation_prompt=False)
    spans = [_turn_span(template, messages, tools, i, full) for i in _assistant_turns(messages)]
    if None in spans:
        raise ValueError(
            "the chat template renders earlier assistant turns differently once later "
            "messages follow (e.g. qwen3 drops <think> blocks): use build_sft_examples"
        )
    return _tokenize_spans(tokenizer, full, spans)


def _collate(
    examples: Sequence[tuple[list[int], list[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = [torch.tensor(ids, dtype=torch.long) for ids, _ in examples]
    masks = [torch.tensor(mask, dtype=torch.bool) for _, mask in examples]
    return (  # each (B, T), right-padded
        pad_sequence(ids, batch_first=True, padding_value=pad_id),
        pad_sequence([torch.ones_like(row) for row in ids], batch_first=True),
        pad_sequence(masks, batch_first=True),
    )


def _masked_next_token_loss(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
) -> torch.Tensor:
    """Mean cross-entropy of the tokens where ``loss_mask`` is set, given those before them."""
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                 use_cache=False)
    hidden = hidden.last_hidden_state[:, :-1]  # (B, T-1, H): position t predicts token t+1
    targets = loss_mask[:, 1:]  # (B, T-1)
    # Projecting only the learned positions keeps a 151k-row head affordable on CPU.
    logits = model.get_output_embeddings()(hidden[targets])  # (N, V)
    return F.cross_entropy(logits.float(), input_ids[:, 1:][targets])


def _progress_bar(enabled: bool) -> Progress | nullcontext[None]:
    if not enabled:
        return nullcontext()
    return Progress(
        TextColumn("warm start"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TimeRemainingColumn(),
    )


def supervised_warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    conversations: Sequence[Sequence[Message]],
    *,
    tools: list[dict[str, Any]] | None = None,
    steps: int = 200,
    lr: float = 3e-3,
    batch_size: int = 8,
    seed: int = 0,
    progress: bool = True,
    dtype: Literal["float32", "bfloat16", "prefer-bfloat16"] = "float32",
    tool_prompt: ToolPromptMode = "auto",
    activation_checkpointing: bool = False,
) -> list[float]:
    """Fine-tunes ``model`` in place on ``conversations``, learning only the assistant turns.

    Conversations become examples with :func:`build_sft_examples`. Each step draws
    ``batch_size`` examples without replacement (all of them when there are fewer) and takes
    one AdamW step on their masked next-token loss, gradient norm clipped at 1; the learning
    rate warms up over the first 10% of the steps, then follows a cosine down to ``lr / 10``.
    Meant to teach a tiny model a fixed behaviour (e.g. exact tool-call text) before RL.

    Args:
        model: A causal LM with ``get_decoder()`` and ``get_output_embeddings()``.
        conversations: Conversations of OpenAI-style messages. Assistant ``content`` is the
            exact text to learn, e.g. ``'<tool_call>\\n{"name":"add",...}\\n</tool_call>'``.
        tools: Tool schemas rendered into every conversation's system turn.
        lr: Peak AdamW learning rate (no weight decay).
        seed: Seed of the batch sampling (the model's initialisation is the caller's).
        dtype: Compute dtype. ``bfloat16`` autocasts each step's forward pass (fast on CPUs
            with AMX; ``prefer-bfloat16``: only there, see `agentrl_sdk.hardware`); weights
            and optimizer state stay in the model's dtype. The autocast opens and closes per
            step: its cache of bf16 weight copies lives as long as the context, so one context
            around the loop would train against stale copies.
        tool_prompt: How tools reach the prompt (``rollout.chat.tool_prompt``): give the
            rollouts' setting so the warm start learns the prompts RL will show.
        activation_checkpointing: Keep only each decoder layer's input through the forward
            pass and recompute the layer in the backward pass (the same gradients): a step's
            activations, mostly attention scores, shrink from ~2.6 GB to a layer's worth for
            SmolLM2-135M at 8 x 300 tokens, for ~30% more compute. Needs a transformers model
            that supports gradient checkpointing.

    Returns:
        The loss of every step, in order.

    Raises:
        ValueError: If ``conversations`` is empty, a conversation has no assistant message,
            or :func:`build_sft_examples` rejects one.
    """
    if not conversations:
        raise ValueError("supervised_warm_start needs at least one conversation")
    examples = []
    template = ChatTemplate(tokenizer, tool_prompt)
    for k, conversation in enumerate(conversations):
        converted = build_sft_examples(template, conversation, tools)
        if not any(any(mask) for _, mask in converted):
            raise ValueError(f"conversation {k} has no assistant message to learn from")
        examples += converted
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return train_on_sft_examples(model, examples, pad_token_id=pad_id, steps=steps, lr=lr,
                                 batch_size=batch_size, seed=seed, progress=progress, dtype=dtype,
                                 activation_checkpointing=activation_checkpointing)


def train_on_sft_examples(
    model: PreTrainedModel,
    examples: Sequence[tuple[list[int], list[int]]],
    *,
    pad_token_id: int,
    steps: int = 200,
    lr: float = 3e-3,
    batch_size: int = 8,
    seed: int = 0,
    progress: bool = True,
    dtype: Literal["float32", "bfloat16", "prefer-bfloat16"] = "float32",
    activation_checkpointing: bool = False,
) -> list[float]:
    """`supervised_warm_start`'s training loop on examples built beforehand (``(ids, mask)``
    pairs from :func:`build_sft_examples`): for a mixture of conversations rendered with
    different tools, or examples of your own. Arguments as in `supervised_warm_start`.

    The process's allocator is made lean first (`keep_memory_lean`: each step's activations
    differ in size, and glibc's heap would keep every step's high-water mark) and trimmed at
    the end (`return_free_memory`).

    Raises:
        ValueError: If ``examples`` is empty, or ``activation_checkpointing`` is asked of a
            model that does not support it.
    """
    if not examples:
        raise ValueError("train_on_sft_examples needs at least one example")
    if activation_checkpointing and not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(model).__name__} does not support activation checkpointing")
    keep_memory_lean()
    autocast_dtype = torch.bfloat16 if resolve_dtype(dtype) == "bfloat16" else None
    generator = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=True)
    schedule = functools.partial(warmup_cosine, warmup=max(1, steps // 10), total=steps, floor=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    losses: list[float] = []
    if activation_checkpointing:
        # Non-reentrant: the recompute runs under the step's autocast, as the forward did.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    try:
        with _progress_bar(progress) as bar:
            task = bar.add_task("sft", total=steps, loss=float("nan")) if bar is not None else None
            for _ in range(steps):
                picked = torch.randperm(len(examples), generator=generator)[:batch_size]
                batch = _collate([examples[k] for k in picked], pad_token_id)
                # Checkpointing is for memory: no cache of bf16 weight copies beside it.
                with torch.autocast(model.device.type, autocast_dtype,
                                    enabled=autocast_dtype is not None,
                                    cache_enabled=not activation_checkpointing):
                    loss = _masked_next_token_loss(model, *batch)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                scheduler.step()
                losses.append(loss.item())
                if bar is not None:
                    bar.update(task, advance=1, loss=losses[-1])
    finally:
        model.eval()
        if activation_checkpointing:
            model.gradient_checkpointing_disable()
        del optimizer, scheduler
        return_free_memory()
    return losses
