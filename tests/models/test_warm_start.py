"""Supervised warm start: exact SFT ids and masks; tiny models that replay tool calls greedily."""

from __future__ import annotations

import time

import pytest
import torch

from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.models.tiny import build_tiny_model
from agentrl_sdk.models.tokenizers import build_small_tokenizer
from agentrl_sdk.models.warm_start import (
    _collate,
    _masked_next_token_loss,
    build_sft_example,
    build_sft_examples,
    supervised_warm_start,
    train_on_sft_examples,
)

IM_START, IM_END, NL = 151644, 151645, 198
SYSTEM, USER, ASSISTANT = 8948, 872, 77091
DEFAULT_SYSTEM = [2610, 525, 264, 10950, 17847, 13]  # "You are a helpful assistant."


def _tool(name: str, description: str) -> dict:
    params = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "required": ["a", "b"]}
    return {"type": "function",
            "function": {"name": name, "description": description, "parameters": params}}


def _call(name: str, a: int, b: int) -> dict:
    content = f'<tool_call>\n{{"name":"{name}","arguments":{{"a":{a},"b":{b}}}}}\n</tool_call>'
    return {"role": "assistant", "content": content}


def _result(value: int) -> dict:
    return {"role": "tool", "content": str(value)}


TOOLS = [_tool("add", "Add two integers."), _tool("multiply", "Multiply two integers.")]
CONVERSATIONS = [
    [{"role": "user", "content": "What is 12 + 7?"}, _call("add", 12, 7), _result(19),
     {"role": "assistant", "content": "The answer is 19."}],
    [{"role": "user", "content": "What is 6 * 9?"}, _call("multiply", 6, 9), _result(54),
     {"role": "assistant", "content": "The answer is 54."}],
    [{"role": "user", "content": "Multiply 3 by 5, then add 4."}, _call("multiply", 3, 5),
     _result(15), _call("add", 15, 4), _result(19),
     {"role": "assistant", "content": "The answer is 19."}],
]


def _masked(ids: list[int], mask: list[int]) -> list[int]:
    return [t for t, m in zip(ids, mask) if m]


def test_single_turn_ids_and_mask(qwen_tokenizer):
    messages = [{"role": "system", "content": "Be terse."},
                {"role": "user", "content": "What is 2+3?"},
                {"role": "assistant", "content": "5"}]
    ids, mask = build_sft_example(qwen_tokenizer, messages)
    assert ids == [
        IM_START, SYSTEM, NL, 3430, 50537, 13, IM_END, NL,            # system: Be terse.
        IM_START, USER, NL, 3838, 374, 220, 17, 10, 18, 30, IM_END, NL,  # user: What is 2+3?
        IM_START, ASSISTANT, NL, 20, IM_END, NL,                      # assistant: 5
    ]
    assert mask == [0] * 23 + [1, 1, 0]  # the content and its <|im_end|>, not the header or \n


def test_tool_conversation_ids_and_mask(qwen_tokenizer):
    messages = [{"role": "user", "content": "Add 2 and 3."}, _call("add", 2, 3), _result(5),
                {"role": "assistant", "content": "5"}]
    ids, mask = build_sft_example(qwen_tokenizer, messages)
    call = [151657, NL, 4913, 606, 3252, 718, 2198, 16370, 22317, 64, 788, 17, 1335, 65, 788, 18,
            11248, 151658]  # <tool_call>\n{"name":"add","arguments":{"a":2,"b":3}}\n</tool_call>
    head = [IM_START, SYSTEM, NL, *DEFAULT_SYSTEM, IM_END, NL,
            IM_START, USER, NL, 2212, 220, 17, 323, 220, 18, 13, IM_END, NL,
            IM_START, ASSISTANT, NL]
    tool_turn = [NL, IM_START, USER, NL, 151665, NL, 20, NL, 151666, IM_END, NL,
                 IM_START, ASSISTANT, NL]
    assert ids == [*head, *call, IM_END, *tool_turn, 20, IM_END, NL]
    assert mask == [0] * len(head) + [1] * (len(call) + 1) + [0] * len(tool_turn) + [1, 1, 0]
    assert ids == qwen_tokenizer.encode(
        qwen_tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)


def test_structured_tool_calls_and_tools_are_rendered_by_the_template(qwen_tokenizer):
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    messages = [{"role": "user", "content": "Add 2 and 3."},
                {"role": "assistant", "content": None, "tool_calls": [call]}]
    ids, mask = build_sft_example(qwen_tokenizer, messages, TOOLS)
    assert qwen_tokenizer.decode(_masked(ids, mask)) == (
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>')
    assert "# Tools" in qwen_tokenizer.decode(ids[: mask.index(1)])
    assert ids[mask.index(1) - 3 : mask.index(1)] == [IM_START, ASSISTANT, NL]


def test_every_assistant_turn_is_learned_and_nothing_else(qwen_tokenizer):
    ids, mask = build_sft_example(qwen_tokenizer, CONVERSATIONS[2], TOOLS)
    turns = [m["content"] for m in CONVERSATIONS[2] if m["role"] == "assistant"]
    expected = [t for text in turns
                for t in [*qwen_tokenizer.encode(text, add_special_tokens=False), IM_END]]
    assert _masked(ids, mask) == expected
    assert mask.count(1) == len(expected)


def test_qwen3_rewritten_history_becomes_extra_examples(qwen3_tokenizer):
    messages = [{"role": "user", "content": "Say hi."},
                {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nhi"},
                {"role": "user", "content": "Again."},
                {"role": "assistant", "content": "<think>\nOnce more.\n</think>\n\nhi again"}]
    examples = build_sft_examples(qwen3_tokenizer, messages)
    learned = [qwen3_tokenizer.decode(_masked(ids, mask)) for ids, mask in examples]
    assert learned == ["<think>\nA greeting.\n</think>\n\nhi<|im_end|>",
                       "<think>\nOnce more.\n</think>\n\nhi again<|im_end|>"]
    # The second example's history is what the template shows at turn 3: the think block gone.
    history = qwen3_tokenizer.decode(examples[1][0])
    assert "A greeting." not in history and "<|im_start|>assistant\nhi<|im_end|>" in history
    with pytest.raises(ValueError, match="build_sft_examples"):
        build_sft_example(qwen3_tokenizer, messages)


def test_hermes_gives_a_single_example(qwen_tokenizer):
    assert build_sft_examples(qwen_tokenizer, CONVERSATIONS[2], TOOLS) == [
        build_sft_example(qwen_tokenizer, CONVERSATIONS[2], TOOLS)]


def test_a_token_merging_across_the_turn_boundary_is_refused(qwen_tokenizer):
    # "\n" + "\nhi" tokenizes as "\n\n" inside the conversation: the span would be misaligned.
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "\nhi"}]
    with pytest.raises(ValueError, match="merges across a turn boundary"):
        build_sft_example(qwen_tokenizer, messages)


def test_bad_conversations_are_refused(qwen_tokenizer):
    with pytest.raises(ValueError, match="open with an assistant"):
        build_sft_example(qwen_tokenizer, [{"role": "assistant", "content": "hi"}])
    model = build_tiny_model(qwen_tokenizer, hidden_size=16, num_layers=1, num_heads=2,
                             num_kv_heads=1)
    with pytest.raises(ValueError, match="at least one conversation"):
        supervised_warm_start(model, qwen_tokenizer, [], progress=False)
    with pytest.raises(ValueError, match="conversation 1 has no assistant message"):
        supervised_warm_start(model, qwen_tokenizer,
                              [CONVERSATIONS[0], [{"role": "user", "content": "hi"}]],
                              progress=False)


def test_masked_loss_equals_the_standard_loss_with_ignored_labels():
    tokenizer = build_small_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32)
    examples = [build_sft_example(tokenizer, conv, TOOLS) for conv in CONVERSATIONS[:2]]
    input_ids, attention_mask, loss_mask = _collate(examples, tokenizer.pad_token_id)
    assert input_ids.shape == (2, max(len(ids) for ids, _ in examples))
    labels = input_ids.masked_fill(~loss_mask, -100)
    with torch.no_grad():
        reference = model(input_ids, attention_mask=attention_mask, labels=labels).loss
        ours = _masked_next_token_loss(model, input_ids, attention_mask, loss_mask)
    assert ours.item() == pytest.approx(reference.item(), rel=1e-5)


def test_warm_start_is_deterministic():
    tokenizer = build_small_tokenizer()
    runs = []
    for _ in range(2):
        model = build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2,
                                 num_kv_heads=1)
        losses = supervised_warm_start(model, tokenizer, CONVERSATIONS, tools=TOOLS, steps=3,
                                       batch_size=2, progress=False)
        runs.append((losses, model.model.embed_tokens.weight.detach().clone()))
    assert runs[0][0] == runs[1][0]
    assert torch.equal(runs[0][1], runs[1][1])
    assert not runs[0][1].requires_grad and not model.training


def test_prebuilt_examples_train_as_the_warm_start_does():
    """A mixture rendered with two tool lists trains through the same loop."""
    tokenizer = build_small_tokenizer()
    template = ChatTemplate(tokenizer)
    examples = [e for c in CONVERSATIONS for e in build_sft_examples(template, c, TOOLS)]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    losses, weights = [], []
    for way in ("conversations", "examples"):
        model = build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2,
                                 num_kv_heads=1)
        kwargs = {"steps": 3, "batch_size": 2, "progress": False}
        if way == "conversations":
            losses.append(supervised_warm_start(model, tokenizer, CONVERSATIONS, tools=TOOLS,
                                                **kwargs))
        else:
            losses.append(train_on_sft_examples(model, examples, pad_token_id=pad, **kwargs))
        weights.append(model.model.embed_tokens.weight.detach().clone())
    assert losses[0] == losses[1] and torch.equal(weights[0], weights[1]) and not model.training
    mixed = examples + build_sft_examples(template, CONVERSATIONS[0], None)
    assert len(train_on_sft_examples(model, mixed, pad_token_id=0, steps=2, progress=False)) == 2
    with pytest.raises(ValueError, match="at least one example"):
        train_on_sft_examples(model, [], pad_token_id=0)


def _assert_replays_every_assistant_turn(model, tokenizer) -> None:
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for conversation in CONVERSATIONS:
        for turn, message in enumerate(conversation):
            if message["role"] != "assistant":
                continue
            prompt = tokenizer.apply_chat_template(conversation[:turn], tools=TOOLS, tokenize=False,
                                                   add_generation_prompt=True)
            prompt_ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
            out = model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids),
                                 max_new_tokens=40, do_sample=False)
            generated = out[0, prompt_ids.shape[1]:].tolist()
            expected = [*tokenizer.encode(message["content"], add_special_tokens=False), im_end]
            assert generated == expected, (turn, tokenizer.decode(generated))


def test_small_vocab_model_replays_multi_turn_tool_calls():
    tokenizer = build_small_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2)
    started = time.perf_counter()
    losses = supervised_warm_start(model, tokenizer, CONVERSATIONS, tools=TOOLS, steps=100, lr=1e-2,
                                   progress=False)
    print(f"small-vocab warm start: {time.perf_counter() - started:.1f} s")
    assert len(losses) == 100
    assert losses[0] > 5.0 and losses[-1] < 0.05
    _assert_replays_every_assistant_turn(model, tokenizer)


@pytest.mark.slow
def test_qwen_vocab_model_replays_multi_turn_tool_calls(qwen_tokenizer):
    model = build_tiny_model(qwen_tokenizer, hidden_size=64, num_layers=2)
    started = time.perf_counter()
    losses = supervised_warm_start(model, qwen_tokenizer, CONVERSATIONS, tools=TOOLS, steps=60,
                                   lr=1e-2, progress=False)
    print(f"Qwen-vocab warm start: {time.perf_counter() - started:.1f} s")
    assert losses[0] > 11.0 and losses[-1] < 0.1  # starts at ln(151680) ~ 11.9
    _assert_replays_every_assistant_turn(model, qwen_tokenizer)


def test_progress_bar_reports_the_loss(capsys):
    tokenizer = build_small_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
    losses = supervised_warm_start(model, tokenizer, CONVERSATIONS[:1], tools=TOOLS, steps=2)
    out = capsys.readouterr().out
    assert "warm start" in out and "2/2" in out and f"loss {losses[-1]:.4f}" in out


def test_qwen3_conversation_ending_with_a_user_turn_gives_no_empty_example(qwen3_tokenizer):
    messages = [{"role": "user", "content": "Say hi."},
                {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nhi"},
                {"role": "user", "content": "Again."}]
    examples = build_sft_examples(qwen3_tokenizer, messages)
    assert len(examples) == 1
    ids, mask = examples[0]
    assert qwen3_tokenizer.decode(_masked(ids, mask)) == (
        "<think>\nA greeting.\n</think>\n\nhi<|im_end|>")
    assert "Again." not in qwen3_tokenizer.decode(ids)
    with pytest.raises(ValueError, match="build_sft_examples"):
        build_sft_example(qwen3_tokenizer, messages)


def test_a_conversation_without_assistant_turns_has_an_empty_mask(qwen_tokenizer):
    [(ids, mask)] = build_sft_examples(qwen_tokenizer, [{"role": "user", "content": "hi"}])
    assert ids[-3:] == [6023, IM_END, NL] and set(mask) == {0}


def test_bf16_warm_start_follows_the_fp32_one_and_keeps_fp32_weights():
    # Autocast per step: every step's forward uses the weights the previous step wrote. A
    # single autocast around the loop would keep reusing the first step's bf16 copies.
    tokenizer = build_small_tokenizer()
    losses = {}
    for dtype in ("float32", "bfloat16"):
        model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2)
        losses[dtype] = supervised_warm_start(model, tokenizer, CONVERSATIONS, tools=TOOLS,
                                              steps=40, lr=1e-2, progress=False, dtype=dtype)
        assert {p.dtype for p in model.parameters()} == {torch.float32}
    fp32, bf16 = losses["float32"], losses["bfloat16"]
    assert bf16 != fp32  # bf16 compute did happen
    assert bf16[-1] < bf16[0] / 10
    assert bf16[-1] == pytest.approx(fp32[-1], rel=0.5, abs=0.05)


def test_activation_checkpointing_trains_the_same_weights():
    """Recomputing each layer in the backward pass changes memory, not the gradients."""
    tokenizer = build_small_tokenizer()
    runs = []
    for checkpointing in (False, True):
        model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2,
                                 num_kv_heads=1)
        losses = supervised_warm_start(model, tokenizer, CONVERSATIONS, tools=TOOLS, steps=4,
                                       batch_size=2, lr=1e-2, progress=False,
                                       activation_checkpointing=checkpointing)
        runs.append((losses, [p.detach().clone() for p in model.parameters()]))
        # Switched off again: the caller's model is left as it was given.
        assert not model.is_gradient_checkpointing and not model.training
    (plain, plain_weights), (checkpointed, checkpointed_weights) = runs
    assert checkpointed == pytest.approx(plain, rel=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain_weights,
                                                                checkpointed_weights))


def test_activation_checkpointing_of_a_model_without_it_is_refused():
    tokenizer = build_small_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2,
                             num_kv_heads=1)
    model.supports_gradient_checkpointing = False
    with pytest.raises(ValueError, match="does not support activation checkpointing"):
        supervised_warm_start(model, tokenizer, CONVERSATIONS, tools=TOOLS, steps=1,
                              progress=False, activation_checkpointing=True)
