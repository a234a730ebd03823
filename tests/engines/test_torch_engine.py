"""TorchEngine: exact greedy ids, logprobs, seeded sampling, batching, weights, failures."""

from __future__ import annotations

import asyncio
import copy
import math
import threading
import time

import pytest
import torch
from transformers import PreTrainedModel

import agentrl_sdk.engines as engines
from agentrl_sdk.engines import Engine, TorchEngine
from agentrl_sdk.engines.torch.sampling import SamplingBuffers, sample_next
from agentrl_sdk.errors import EngineError
from agentrl_sdk.types import SamplingParams
from agentrl_sdk.weights.push import StateDict, WeightIntake
from tests.engines._tiny import ID_VOCAB, hf_greedy, id_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
LENGTHS = [1, 3, 5, 7, 9, 12, 17, 30]


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return id_model(0)


@pytest.fixture(scope="module")
def engine(model: PreTrainedModel):
    served = TorchEngine(model)
    yield served
    served.close()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, ID_VOCAB, (n,), generator=g).tolist() for n in LENGTHS * 3]


def reference_logprobs(
    model: PreTrainedModel, prompt: list[int], response: list[int], temperature: float
) -> list[float]:
    """One forward over prompt + response; log_softmax(logits / T) of each response token."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]  # (R, V)
    logp = (logits / (temperature or 1.0)).log_softmax(-1)
    return logp.gather(1, torch.tensor(response)[:, None]).squeeze(1).tolist()


async def test_package_exports_engine_and_torch_engine(engine: TorchEngine) -> None:
    assert engines.__all__ == ["Engine", "EnginePool", "TorchEngine", "create_engine"]
    assert isinstance(engine, Engine)
    assert await engine.health()


async def test_greedy_alone_matches_hf_generate(engine, model, prompts) -> None:
    for prompt in prompts[: len(LENGTHS)]:
        result = await engine.generate(prompt, GREEDY, "alone")
        assert result.token_ids == hf_greedy(model, prompt, GREEDY.max_tokens)
        assert result.finish_reason == "length"
        assert result.policy_version == 0


async def test_greedy_batched_matches_hf_generate(engine, model, prompts) -> None:
    # Different budgets make rows leave the batch at different steps while others go on.
    budgets = [4 + i % 9 for i in range(len(prompts))]
    results = await asyncio.gather(
        *(
            engine.generate(p, GREEDY.model_copy(update={"max_tokens": n}), f"r{i}")
            for i, (p, n) in enumerate(zip(prompts, budgets, strict=True))
        )
    )
    assert len(prompts) == 24
    for prompt, n, result in zip(prompts, budgets, results, strict=True):
        assert result.token_ids == hf_greedy(model, prompt, n)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
async def test_logprobs_match_a_full_forward(engine, model, prompts, temperature) -> None:
    sampling = SamplingParams(temperature=temperature, max_tokens=10, seed=3)
    results = await asyncio.gather(
        *(engine.generate(p, sampling, f"r{i}") for i, p in enumerate(prompts[:12]))
    )
    for prompt, result in zip(prompts, results, strict=False):
        expected = reference_logprobs(model, prompt, result.token_ids, temperature)
        assert result.logprobs == pytest.approx(expected, abs=1e-4)


async def test_seeded_sampling_is_batch_invariant(engine, prompts) -> None:
    sampling = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, max_tokens=16, seed=7)
    prompt = prompts[3]
    alone = await engine.generate(prompt, sampling, "alone")
    others = [
        engine.generate(p, sampling.model_copy(update={"seed": i}), f"o{i}")
        for i, p in enumerate(prompts)
    ]
    batched, *_ = await asyncio.gather(engine.generate(prompt, sampling, "batched"), *others)
    assert batched.token_ids == alone.token_ids
    assert batched.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    other_seed = await engine.generate(prompt, sampling.model_copy(update={"seed": 8}), "s8")
    assert other_seed.token_ids != alone.token_ids
    # top_k=40 and top_p=0.9 renormalise onto fewer tokens: every logprob beats uniform-over-V.
    assert all(lp > -math.log(ID_VOCAB) for lp in alone.logprobs)


async def test_a_groups_shared_prompt_is_prefilled_once(model, prompts, monkeypatch) -> None:
    from agentrl_sdk.engines.torch.scheduler import Scheduler

    prefilled: list[int] = []  # rows of each prefill forward
    forward = Scheduler._forward

    def counting(self, rows, **inputs):
        if inputs["input_ids"].shape[1] > 1:
            prefilled.append(inputs["input_ids"].shape[0])
        return forward(self, rows, **inputs)

    monkeypatch.setattr(Scheduler, "_forward", counting)
    engine = TorchEngine(model)
    try:
        sampling = SamplingParams(temperature=1.0, max_tokens=8)
        group = [sampling.model_copy(update={"seed": i}) for i in range(4)]
        alone = [await engine.generate(prompts[5], s, f"a{i}") for i, s in enumerate(group)]
        prefilled.clear()
        await engine.pause()
        calls = [engine.generate(prompts[5], s, f"g{i}") for i, s in enumerate(group)]
        calls.append(engine.generate(prompts[6], group[0], "other"))
        tasks = [asyncio.ensure_future(c) for c in calls]
        await asyncio.sleep(0.05)  # all five wait, then start together
        await engine.resume()
        together = await asyncio.gather(*tasks)
    finally:
        engine.close()
    assert prefilled == [2]  # the group's prompt and the other prompt
    for one, other in zip(alone, together, strict=False):
        assert other.token_ids == one.token_ids
        assert other.logprobs == pytest.approx(one.logprobs, abs=1e-5)
    assert len({tuple(r.token_ids) for r in together[:4]}) > 1  # each sample its own


async def test_stop_token_ends_generation_and_is_included(engine, model, prompts) -> None:
    prompt = prompts[5]
    full = hf_greedy(model, prompt, GREEDY.max_tokens)
    stop = full[4]
    cut = full.index(stop) + 1
    result = await engine.generate(
        prompt, GREEDY.model_copy(update={"stop_token_ids": (stop,)}), "stop"
    )
    assert result.token_ids == full[:cut]
    assert result.finish_reason == "stop"
    short = await engine.generate(prompt, GREEDY.model_copy(update={"max_tokens": 3}), "len")
    assert short.token_ids == full[:3]
    assert short.finish_reason == "length"


async def test_eos_defaults_to_generation_config(model, prompts, monkeypatch) -> None:
    prompt = prompts[2]
    full = hf_greedy(model, prompt, GREEDY.max_tokens)
    monkeypatch.setattr(model.generation_config, "eos_token_id", [full[2]])
    served = TorchEngine(model)
    try:
        result = await served.generate(prompt, GREEDY, "eos")
    finally:
        served.close()
    assert result.token_ids == full[: full.index(full[2]) + 1]
    assert result.finish_reason == "stop"


async def test_requests_joining_mid_decode_match_alone(engine, prompts) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=40)
    sampled = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=40, seed=11)
    jobs = [(p, greedy if i % 2 else sampled) for i, p in enumerate(prompts[:10])]
    alone = [await engine.generate(p, s, "alone") for p, s in jobs]

    async def staggered(i: int, prompt: list[int], sampling: SamplingParams):
        await asyncio.sleep(0.004 * i)
        return await engine.generate(prompt, sampling, f"late{i}")

    joined = await asyncio.gather(*(staggered(i, p, s) for i, (p, s) in enumerate(jobs)))
    assert [r.token_ids for r in joined] == [r.token_ids for r in alone]


async def test_generate_from_asyncio_run_in_worker_threads(engine, model, prompts) -> None:
    results: dict[int, list[int]] = {}

    def worker(i: int) -> None:
        out = asyncio.run(engine.generate(prompts[i], GREEDY, f"t{i}"))
        results[i] = out.token_ids

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == {i: hf_greedy(model, prompts[i], GREEDY.max_tokens) for i in range(6)}


async def test_cancelled_request_leaves_the_batch(model, prompts) -> None:
    served = TorchEngine(model, eos_token_ids=(), max_batch_size=1)
    try:
        endless = asyncio.create_task(
            served.generate(prompts[0], SamplingParams(temperature=0, max_tokens=100_000), "x")
        )
        await asyncio.sleep(0.05)
        endless.cancel()
        # With one batch slot, this only finishes if the cancelled request was dropped.
        result = await asyncio.wait_for(served.generate(prompts[1], GREEDY, "next"), timeout=20)
    finally:
        served.close()
    assert endless.cancelled()
    assert result.token_ids == hf_greedy(model, prompts[1], GREEDY.max_tokens)


def test_torch_engine_takes_tensors_staged_files_and_adapters(engine) -> None:
    from agentrl_sdk.weights.shared_files import host_id

    assert engine.weight_intake == WeightIntake(
        frozenset({"state_dict", "shared_files", "adapter"}), host_id(), "float32"
    )


async def test_adapter_view_refuses_full_weights_and_other_adapters(model) -> None:
    """A view takes its own named adapter only: full weights would change the base every
    adapter policy shares, and another adapter's push is not its policy's."""
    from agentrl_sdk.engines.adapter_view import AdapterView
    from tests.engines.test_row_adapters import peft_adapter

    served = TorchEngine(copy.deepcopy(model))
    try:
        view, frozen = AdapterView(served, "a"), AdapterView(served, None)
        assert view.weight_intake == WeightIntake(frozenset({"adapter"}))
        _, other = peft_adapter(model, 2, "b")
        with pytest.raises(EngineError, match="got a push of state_dict"):
            await view.load_weights(StateDict(id_model(seed=1).state_dict()), 1)
        with pytest.raises(EngineError, match="got a push of adapter 'b'"):
            await view.load_weights(other, 1)
        with pytest.raises(EngineError, match="got a push of adapter 'b'"):
            await frozen.load_weights(other, 1)  # the bare base takes no adapter
        assert view.policy_version == frozen.policy_version == served.policy_version == 0
        assert all(torch.equal(v, model.state_dict()[k]) for k, v in served.model.state_dict().items())
        _, own = peft_adapter(model, 1, "a")
        await view.load_weights(own, 4)  # its own adapter loads, as the version given
        assert view.policy_version == served.policy_version == 4
    finally:
        served.close()


async def test_load_weights_between_steps(model, prompts) -> None:
    served = TorchEngine(copy.deepcopy(model))
    new_model = id_model(seed=1)
    try:
        assert served.policy_version == 0
        before = await served.generate(prompts[4], GREEDY, "before")
        # The driver assigns the version: 7 skips numbers, so the engine is not counting.
        await served.load_weights(StateDict(new_model.state_dict()), 7)
        assert served.policy_version == 7
        after = await served.generate(prompts[4], GREEDY, "after")
    finally:
        served.close()
    assert served.policy_version == 7
    assert (before.policy_version, after.policy_version) == (0, 7)
    assert after.token_ids == hf_greedy(new_model, prompts[4], GREEDY.max_tokens)
    assert after.token_ids != before.token_ids


async def test_in_flight_request_finishes_on_new_weights(model, prompts) -> None:
    served = TorchEngine(copy.deepcopy(model), eos_token_ids=())
    long = SamplingParams(temperature=0.0, max_tokens=300)
    try:
        running = asyncio.ensure_future(served.generate(prompts[4], long, "long"))
        await asyncio.sleep(0.02)
        await served.load_weights(StateDict(id_model(seed=1).state_dict()), 1)
        version = served.policy_version
        result = await running
    finally:
        served.close()
    assert version == result.policy_version == 1  # the version current when it finished
    assert len(result.token_ids) == 300
    assert result.token_ids != hf_greedy(model, prompts[4], 300)


async def test_mismatched_weights_fail_and_keep_the_version(engine, model, prompts) -> None:
    with pytest.raises(EngineError, match="missing"):
        await engine.load_weights(StateDict({"lm_head.weight": torch.zeros(ID_VOCAB, 64)}), 1)
    assert engine.policy_version == 0
    kept = await engine.generate(prompts[2], GREEDY, "kept")  # the old weights still serve
    assert kept.token_ids == hf_greedy(model, prompts[2], GREEDY.max_tokens)
    assert kept.policy_version == 0


async def test_failing_forward_fails_in_flight_and_engine_recovers(model, prompts) -> None:
    flaky = copy.deepcopy(model)
    real_forward = flaky.forward
    calls = {"n": 0}

    def flaky_forward(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("boom")
        return real_forward(*args, **kwargs)

    flaky.forward = flaky_forward
    served = TorchEngine(flaky)
    try:
        failed = await asyncio.gather(
            *(served.generate(p, GREEDY, f"f{i}") for i, p in enumerate(prompts[:4])),
            return_exceptions=True,
        )
        later = await served.generate(prompts[1], GREEDY, "later")
        healthy = await served.health()
    finally:
        served.close()
    assert all(isinstance(e, EngineError) for e in failed)
    assert isinstance(failed[0].__cause__, RuntimeError)
    assert later.token_ids == hf_greedy(model, prompts[1], GREEDY.max_tokens)
    assert healthy


async def test_close_fails_pending_and_refuses_new_requests(model, prompts) -> None:
    served = TorchEngine(model, eos_token_ids=())
    pending = asyncio.ensure_future(
        served.generate(prompts[0], SamplingParams(temperature=0, max_tokens=100_000), "p")
    )
    await asyncio.sleep(0.05)
    await asyncio.to_thread(served.close)
    with pytest.raises(EngineError, match="closed"):
        await pending
    assert not await served.health()
    with pytest.raises(EngineError, match="closed"):
        await served.generate(prompts[0], GREEDY, "late")


async def test_invalid_prompt_is_rejected(engine) -> None:
    with pytest.raises(ValueError, match="out of range"):
        await engine.generate([1, ID_VOCAB], GREEDY, "bad")
    with pytest.raises(ValueError, match="non-empty"):
        await engine.generate([], GREEDY, "empty")


async def test_from_pretrained_loads_a_local_directory(model, prompts, tmp_path) -> None:
    model.save_pretrained(tmp_path)
    served = TorchEngine.from_pretrained(tmp_path, dtype=torch.float32)
    try:
        result = await served.generate(prompts[2], GREEDY, "loaded")
    finally:
        served.close()
    assert result.token_ids == hf_greedy(model, prompts[2], GREEDY.max_tokens)
    with pytest.raises(FileNotFoundError, match="never downloads"):
        TorchEngine.from_pretrained(tmp_path / "missing")


def test_sample_next_greedy_and_filtered_distributions() -> None:
    probs = torch.tensor([0.1, 0.5, 0.15, 0.25])
    logits = probs.log().expand(2, 4)
    # Row 0 greedy. Row 1 top_k=2 keeps {1: 0.5, 3: 0.25} -> {1: 2/3, 3: 1/3}; the noise
    # favours tokens 0 and 2, yet they are filtered out, and a large E_1 hands the race to 3.
    noise = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1e-6, 10.0, 1e-6, 1.0]])
    tokens, logp = sample_next(
        logits, torch.tensor([0.0, 1.0]), torch.tensor([-1, 2]), torch.tensor([1.0, 1.0]), noise
    )
    assert tokens.tolist() == [1, 3]
    assert logp.tolist() == pytest.approx([math.log(0.5), math.log(1 / 3)], abs=1e-6)

    # top_p=0.7 keeps the smallest prefix reaching 0.7: {1: 0.5, 3: 0.25} again.
    ones = torch.ones(1, 4)
    tokens, logp = sample_next(
        logits[:1], torch.tensor([1.0]), torch.tensor([-1]), torch.tensor([0.7]), ones
    )
    assert tokens.tolist() == [1]
    assert logp.tolist() == pytest.approx([math.log(2 / 3)], abs=1e-6)

    # Temperature 0.5 squares then renormalises the probabilities.
    tokens, logp = sample_next(
        logits[:1], torch.tensor([0.5]), torch.tensor([-1]), torch.tensor([1.0]), ones
    )
    squared = probs**2
    assert tokens.tolist() == [1]
    assert logp.item() == pytest.approx(math.log(squared[1] / squared.sum()), abs=1e-6)


def test_sample_next_draws_from_the_filtered_distribution() -> None:
    n = 20_000
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([0.1, 0.5, 0.15, 0.25]).log().expand(n, 4)
    noise = torch.empty(n, 4).exponential_(generator=g)
    tokens, _ = sample_next(
        logits, torch.ones(n), torch.full((n,), 3), torch.ones(n), noise
    )
    freq = torch.bincount(tokens, minlength=4).float() / n
    expected = torch.tensor([0.0, 0.5, 0.15, 0.25]) / 0.9  # top-3, renormalised
    assert freq.tolist() == pytest.approx(expected.tolist(), abs=0.015)


def test_sample_next_equals_the_textbook_race_at_a_real_vocabulary() -> None:
    """Mixed rows (greedy, temperature, top-k, top-p) at 49k tokens: the same ids as
    ``argmax(softmax(logits / T) / E)`` over the filtered distribution, the same logprobs."""
    g = torch.Generator().manual_seed(3)
    rows, vocab = 24, 49_152
    logits = torch.randn(rows, vocab, generator=g) * 4
    temperature = torch.rand(rows, generator=g) + 0.3
    temperature[:4] = 0.0
    top_k = torch.where(torch.arange(rows) % 3 == 0, 40, -1)
    top_p = torch.where(torch.arange(rows) % 4 == 1, 0.9, 1.0)
    noise = torch.empty(rows, vocab).exponential_(generator=g)
    tokens, logp = sample_next(logits, temperature, top_k, top_p, noise)
    for i in range(rows):
        if temperature[i] == 0:
            assert tokens[i] == logits[i].argmax()
            expected = logits[i].log_softmax(-1)[tokens[i]]
        else:
            probs = (logits[i] / temperature[i]).softmax(-1)
            order = probs.argsort(descending=True)[: int(top_k[i]) if top_k[i] > 0 else vocab]
            top = probs[order] / probs[order].sum()  # top-k renormalised, then top-p
            kept = order[top.cumsum(0) - top < top_p[i]]
            filtered = torch.zeros(vocab).index_put_((kept,), probs[kept])
            filtered /= filtered.sum()
            assert tokens[i] == (filtered / noise[i]).argmax(), i
            expected = filtered[tokens[i]].log()
        assert logp[i].item() == pytest.approx(expected.item(), abs=1e-4), i


def test_sample_next_in_reused_buffers_is_bit_identical() -> None:
    """Draws written into buffers kept across steps of growing and shrinking batches equal
    fresh draws bit for bit (bf16 logits too), and an unfiltered row's logprob is exactly
    ``log_softmax(logits / T)`` at its token: the rounding the trainer's logprobs reproduce."""
    g = torch.Generator().manual_seed(5)
    buffers = SamplingBuffers()
    for rows in (12, 5, 20):
        vocab = 3_000
        logits = torch.randn(rows, vocab, generator=g) * 4
        temperature = torch.rand(rows, generator=g) + 0.3
        temperature[::4] = 0.0
        top_k = torch.where(torch.arange(rows) % 3 == 1, 30, -1)
        top_p = torch.where(torch.arange(rows) % 5 == 2, 0.8, 1.0)
        noise = torch.empty(rows, vocab).exponential_(generator=g)
        fresh = sample_next(logits, temperature, top_k, top_p, noise)
        reused = sample_next(logits, temperature, top_k, top_p, noise, buffers)
        assert torch.equal(fresh[0], reused[0]) and torch.equal(fresh[1], reused[1])
        half = logits.bfloat16()  # a bf16 model's logits: widened into a buffer, exactly
        widened = sample_next(half.float(), temperature, top_k, top_p, noise)
        in_buffer = sample_next(half, temperature, top_k, top_p, noise, buffers)
        assert torch.equal(widened[0], in_buffer[0]) and torch.equal(widened[1], in_buffer[1])
        for i in range(rows):
            if top_k[i] <= 0 and top_p[i] == 1.0:
                scale = temperature[i] if temperature[i] > 0 else torch.tensor(1.0)
                exact = (logits[i : i + 1] / scale).log_softmax(-1)[0, reused[0][i]]
                assert reused[1][i].item() == exact.item(), i


async def test_busy_seconds_count_forward_time_not_idle_time(model, prompts) -> None:
    served = TorchEngine(model)
    try:
        assert served.busy_seconds == 0.0
        started = time.perf_counter()
        await asyncio.gather(*(served.generate(p, GREEDY, f"b{i}") for i, p in enumerate(prompts)))
        await asyncio.sleep(0.1)  # the engine thread adds a step's time just after answering
        after_work = served.busy_seconds
        assert 0.0 < after_work <= time.perf_counter() - started
        await asyncio.sleep(0.3)  # an idle engine waits on its inbox: no busy time accrues
        assert served.busy_seconds == after_work
    finally:
        served.close()


async def test_cpu_threads_limit_the_engine_thread_only(model, prompts, monkeypatch) -> None:
    from agentrl_sdk.engines.torch.scheduler import Scheduler

    seen: list[int] = []
    decode = Scheduler._decode

    def counting_decode(self):
        seen.append(torch.get_num_threads())
        return decode(self)

    monkeypatch.setattr(Scheduler, "_decode", counting_decode)
    before = torch.get_num_threads()
    served = TorchEngine(model, cpu_threads=1)
    try:
        got = await served.generate(prompts[0], GREEDY, "threads")
        assert got.token_ids == hf_greedy(model, prompts[0], GREEDY.max_tokens)
        assert seen and set(seen) == {1}  # every decode step ran on one torch thread
        assert torch.get_num_threads() == before  # the caller's threads are untouched
    finally:
        served.close()
