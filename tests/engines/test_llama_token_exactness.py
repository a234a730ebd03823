"""Token exactness beyond Qwen: a Llama model with a Llama-3 tokenizer and template (native JSON
tool calls, ``llama3_json`` parser) on the TorchEngine and vLLM-CPU, and a ChatML template
without tool support run through the Hermes tool prompt.

Each policy is warm-started to act out the calculator agent's three turns, then run greedily:
mask-1 ids are the sampled ids, mask-0 runs decode to the template's text, logprobs equal a
fresh forward pass. The warm-started folders are cached (``cached_build``) after the first run.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch
from langchain_core.messages import ToolMessage

import agentrl_sdk as sdk
from agentrl_sdk.chat.messages import to_openai_tools
from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.config import ChatConfig
from agentrl_sdk.engines import TorchEngine
from agentrl_sdk.models.cache import cached_build
from agentrl_sdk.models.llama_tokenizer import build_llama3_tokenizer
from agentrl_sdk.models.templates import CHATML_TEMPLATE
from agentrl_sdk.models.tiny import build_tiny_model, load_pretrained_pair, save_pretrained_pair
from agentrl_sdk.models.tokenizers import build_small_tokenizer
from agentrl_sdk.models.warm_start import supervised_warm_start
from examples.calculator.agent import build_graph, calculator, expert_conversation, make_rows
from tests.rollout.test_rollouts_on_torch_engine import _reference_logprobs, _runs

ROWS = make_rows(4, seed=3)
TOOLS = to_openai_tools([calculator])
# head_dim 64 (a size vLLM's CPU attention supports); untied, as tests/engines/_tiny.py.
SIZES = {"hidden_size": 128, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
         "tie_word_embeddings": False, "max_position_embeddings": 2048}
WARM_START = {"steps": 80, "lr": 1e-2}
LLAMA_GREEDY = sdk.RolloutConfig(
    sampling=sdk.SamplingParams(temperature=0.0, max_tokens=48),
    chat=ChatConfig(tool_parser="llama3_json"),
)
HERMES_GREEDY = sdk.RolloutConfig(sampling=sdk.SamplingParams(temperature=0.0, max_tokens=48))
LOGPROB_TOL = 1e-4  # as tests/engines/test_vllm_engine.py (measured ~5e-7 in float32)


def _llama_expert(row: dict) -> list[dict]:
    """The calculator expert with structured calls: the Llama template writes the JSON."""

    def call(expression: str) -> dict:
        function = {"name": "calculator", "arguments": {"expression": expression}}
        return {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                                                                    "function": function}]}

    a, b, c = row["operands"]
    return [
        *row["messages"],
        call(f"{a}+{b}"), {"role": "tool", "content": str(a + b)},
        call(f"{a + b}*{c}"), {"role": "tool", "content": str((a + b) * c)},
        {"role": "assistant", "content": f"The answer is {(a + b) * c}."},
    ]


def _warm_dir(name: str, tokenizer, architecture: str, conversations: list) -> Path:
    vocab = hashlib.sha1(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()
    recipe = {"architecture": architecture, "vocab": vocab, "template": tokenizer.chat_template,
              "conversations": conversations, "tools": TOOLS, **SIZES, **WARM_START}

    def build(folder: Path) -> None:
        model = build_tiny_model(tokenizer, architecture=architecture, **SIZES)
        supervised_warm_start(model, tokenizer, conversations, tools=TOOLS, progress=False,
                              **WARM_START)
        save_pretrained_pair(model, tokenizer, folder)

    return cached_build(name, recipe, build)


@pytest.fixture(scope="module")
def llama_dir() -> Path:
    return _warm_dir("llama-calc", build_llama3_tokenizer(), "llama",
                     [_llama_expert(r) for r in ROWS])


@pytest.fixture(scope="module")
def llama(llama_dir):
    """``(model, tokenizer, engine)`` of the warm-started Llama policy on the TorchEngine."""
    model, tokenizer = load_pretrained_pair(llama_dir)
    engine = TorchEngine(model)
    yield model, tokenizer, engine
    engine.close()


@pytest.fixture(scope="module")
def chatml():
    """A Qwen2 policy whose template is ChatML without tool support (as SmolLM2's)."""
    tokenizer = build_small_tokenizer()
    tokenizer.chat_template = CHATML_TEMPLATE
    # auto -> hermes: the warm start renders through the tool prompt the rollouts will use.
    folder = _warm_dir("chatml-calc", tokenizer, "qwen2", [expert_conversation(r) for r in ROWS])
    model, tokenizer = load_pretrained_pair(folder)
    engine = TorchEngine(model)
    yield model, tokenizer, engine
    engine.close()


def _tool_results(traj) -> list[str]:
    return [m.content for m in traj.final_state["messages"] if isinstance(m, ToolMessage)]


def _assert_token_exact(traj, model, tokenizer, first_prompt: list[int],
                        observation: str) -> None:
    """Three calls in one segment: sampled ids, template text, logprobs all exact."""
    assert traj.status == "ok", traj.error
    assert len(traj.calls) == 3
    (seg,) = traj.segments
    assert seg.prompt_ids == first_prompt
    # Mask-1 tokens are exactly what the engine sampled, call after call.
    assert seg.generated_ids == [t for call in traj.calls for t in call.response_ids]
    for call in traj.calls:
        assert (seg.prompt_ids + seg.response_ids)[: len(call.prompt_ids)] == call.prompt_ids
    # Mask-0 runs are the template's text around each tool result.
    observed = [tokenizer.decode(ids) for mask, ids in _runs(seg) if mask == 0]
    assert observed == [observation.format(v) for v in _tool_results(traj)]
    assert len(observed) == 2
    # Logprobs align 1:1 with tokens and equal a fresh forward pass (greedy: raw logprobs).
    mask = torch.tensor(seg.response_mask, dtype=torch.bool)
    recorded = torch.tensor(seg.response_logprobs)
    reference = _reference_logprobs(model, seg)
    torch.testing.assert_close(recorded[mask], reference[mask], atol=LOGPROB_TOL, rtol=0)
    assert (recorded[~mask] == 0).all()


LLAMA_OBSERVATION = (
    "<|start_header_id|>ipython<|end_header_id|>\n\n{}<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)
HERMES_OBSERVATION = (
    "\n<|im_start|>user\n<tool_response>\n{}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
)


def _first_prompt(tokenizer, row, tool_prompt="auto") -> list[int]:
    template = ChatTemplate(tokenizer, tool_prompt)
    return template.encode(template.render(row["messages"], TOOLS, add_generation_prompt=True))


async def _llama_rollout(engine, tokenizer, row):
    (traj,) = await sdk.arollout(build_graph(), row, engine, tokenizer=tokenizer,
                                 config=LLAMA_GREEDY)
    return traj


async def test_llama_tool_rollout_is_token_exact_on_the_torch_engine(llama):
    model, tokenizer, engine = llama
    assert type(model).__name__ == "LlamaForCausalLM"
    assert ChatTemplate(tokenizer).tool_prompt == "native"
    for row in ROWS[:2]:
        traj = await _llama_rollout(engine, tokenizer, row)
        _assert_token_exact(traj, model, tokenizer, _first_prompt(tokenizer, row),
                            LLAMA_OBSERVATION)
        text = tokenizer.decode(traj.segments[0].generated_ids)
        assert text.startswith('{"name": "calculator", "parameters": {"expression": "')
        assert text.count("<|eot_id|>") == 3


async def test_hermes_prompt_around_chatml_is_token_exact_and_native_refuses(chatml):
    model, tokenizer, engine = chatml
    row = ROWS[0]
    assert ChatTemplate(tokenizer).tool_prompt == "hermes"
    (traj,) = await sdk.arollout(build_graph(), row, engine, tokenizer=tokenizer,
                                 config=HERMES_GREEDY)
    _assert_token_exact(traj, model, tokenizer, _first_prompt(tokenizer, row, "hermes"),
                        HERMES_OBSERVATION)
    prompt = tokenizer.decode(traj.segments[0].prompt_ids)
    assert "# Tools" in prompt and '"name": "calculator"' in prompt
    assert traj.final_state["messages"][-1].content.startswith("The answer is ")

    native = HERMES_GREEDY.model_copy(update={"chat": ChatConfig(tool_prompt="native")})
    (refused,) = await sdk.arollout(build_graph(), row, engine, tokenizer=tokenizer,
                                    config=native)
    assert refused.status == "graph_error"
    assert "chat.tool_prompt: hermes" in refused.error
    assert refused.calls == []


@pytest.fixture(scope="module")
def llama_vllm(llama_dir):
    # CI sets AGENTRL_REQUIRE_VLLM so a missing vllm fails instead of skipping.
    if os.environ.get("AGENTRL_REQUIRE_VLLM"):
        import vllm  # noqa: F401
    else:
        pytest.importorskip("vllm")
    from agentrl_sdk.engines.vllm.engine import VLLMEngine

    engine = VLLMEngine(llama_dir, max_batch_size=8, max_model_len=1024)
    yield engine
    engine.close()


@pytest.mark.slow
async def test_llama_tool_rollout_is_token_exact_on_vllm(llama, llama_vllm):
    model, tokenizer, torch_engine = llama
    for row in ROWS[:2]:
        traj = await _llama_rollout(llama_vllm, tokenizer, row)
        _assert_token_exact(traj, model, tokenizer, _first_prompt(tokenizer, row),
                            LLAMA_OBSERVATION)
        # Greedy: vLLM samples the TorchEngine's ids.
        on_torch = await _llama_rollout(torch_engine, tokenizer, row)
        assert traj.segments[0].response_ids == on_torch.segments[0].response_ids
