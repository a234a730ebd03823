"""TrainerGroup on Ray (gloo, CPU): FSDP2 updates equal a single-process reference, exact
resume from a checkpoint, weight sync into TorchEngines and export.

One Ray session for the module; group A (2 ranks) runs one scenario whose results the tests
read; group B (2 ranks, fresh) resumes A's checkpoint; group C (1 rank) covers micro-batching
with mini-batches, epochs, recomputed old logprobs, a cosine schedule and Dr.GRPO aggregation.
"""

from __future__ import annotations

import copy
import json
import random
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl_sdk.algorithms import (
    PolicyLossConfig,
    aggregate,
    entropy_from_logits,
    kl_loss,
    ppo_policy_loss,
)
from agentrl_sdk.engines.torch.engine import TorchEngine
from agentrl_sdk.trainer import (
    FlatSamples,
    TrainerConfig,
    TrainerError,
    TrainerGroup,
    WeightSync,
)
from agentrl_sdk.trainer.layers import freeze_all_but_last
from agentrl_sdk.trainer.packing import shard_plan
from agentrl_sdk.types import Batch, Sample, SamplingParams
from agentrl_sdk.weights.push import StateDict, WeightIntake

pytestmark = pytest.mark.slow

# Half a CPU per worker: groups A and B (or A and C) are alive at once on 2 logical CPUs.
CONFIG_A = TrainerConfig(
    num_cpus_per_worker=0.5, world_size=2, lr=1e-3, weight_decay=0.1, max_grad_norm=0.3,
    micro_batch_tokens=20, temperature=0.7,
)  # fmt: skip
LOSS_A = PolicyLossConfig(kl_coef=0.1, entropy_coef=0.01, clip_c=3.0)
CONFIG_C = TrainerConfig(
    num_cpus_per_worker=0.5, world_size=1, lr=1e-3, micro_batch_tokens=20, num_mini_batches=2,
    ppo_epochs=2, recompute_old_logprobs=True, lr_schedule="cosine", warmup_steps=1,
    total_steps=8,
)  # fmt: skip
LOSS_C = PolicyLossConfig(agg="seq-mean-token-sum-norm")
TOL = 1e-5
TEACH_UPDATES = 6
IN_THIS_PROCESS = {"placement": "in_process"}
"""For 1-rank tests of what the rank computes, not of Ray: the rank in the test's process
starts in about a second, a Ray actor in ~10 s (it imports torch and transformers afresh)."""
# lr 1e-3 keeps the comparison meaningful: Adam's first steps are ~lr * g / (|g| + eps), so for
# the rare ~1e-9 gradients fp32 reduction-order noise becomes ~1e-3 * lr of parameter noise.
# Adam ignores a uniform gradient scale, so the tests also compare loss and grad_norm.


def make_batch(seed: int, n: int) -> Batch:
    """Random token ids, masks, behaviour logprobs, advantages and weights."""
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        p, r = rng.randint(1, 6), rng.randint(1, 9)
        prompt = [rng.randrange(1000) for _ in range(p)]
        response = [rng.randrange(1000) for _ in range(r)]
        mask = [int(j == 0 or rng.random() < 0.75) for j in range(r)]
        old = [-rng.uniform(5.5, 8.5) for _ in range(r)]
        samples.append(Sample(
            row_id=f"{seed}-{i}", sample_index=0, prompt_ids=prompt, response_ids=response,
            response_mask=mask, old_logprobs=old, token_advantages=[rng.gauss(0.0, 1.0)] * r,
            weight=rng.choice([1.0, 0.5]),
        ))  # fmt: skip
    return Batch(samples=samples)


BATCHES = [make_batch(seed, n=7) for seed in (3, 4, 5)]


class Reference:
    """Plain single-process torch: the same loss over the whole (mini-)batch at once."""

    def __init__(self, model_path, cfg: TrainerConfig, lc: PolicyLossConfig):
        self.cfg, self.lc = cfg, lc
        self.model = load_model(model_path)
        self.ref = copy.deepcopy(self.model).requires_grad_(False) if lc.kl_coef else None
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
        )  # fmt: skip
        self.steps = 0

    def update(self, samples: list[Sample]) -> dict[str, float]:
        cfg, lc = self.cfg, self.lc
        behaviour = None
        if lc.correction != "none":  # proximal logprobs now, weights from the recorded ones
            behaviour = [list(s.old_logprobs) for s in samples]
        if cfg.recompute_old_logprobs or behaviour is not None:
            with torch.no_grad():
                old = reference_logprobs(self.model, samples, cfg.temperature)[0]
            samples = [
                s.model_copy(update={"old_logprobs": old[i, : len(s.response_ids)].tolist()})
                for i, s in enumerate(samples)
            ]
        losses, norms = [], []
        for _ in range(cfg.ppo_epochs):
            for part in np.array_split(np.arange(len(samples)), cfg.num_mini_batches):
                mini = [samples[i] for i in part]
                logp, scaled, mask, old, adv, w = reference_logprobs(
                    self.model, mini, cfg.temperature
                )
                entropy = entropy_from_logits(scaled)
                token_w = None
                if behaviour is not None:
                    behav = torch.zeros_like(old)
                    for row, i in enumerate(part):
                        behav[row, : len(behaviour[i])] = torch.tensor(behaviour[i])
                    token_w = correction_weights(old, behav, mask, lc.correction, lc.is_cap)
                loss, _ = ppo_policy_loss(
                    logp, old, adv, mask, lc.clip_low, lc.clip_high, lc.clip_c, lc.agg, w,
                    token_weights=token_w,
                )
                if self.ref is not None:
                    with torch.no_grad():
                        ref_logp = reference_logprobs(self.ref, mini, cfg.temperature)[0]
                    kl, _ = kl_loss(logp, ref_logp, mask, lc.kl_kind, lc.agg, w)
                    loss = loss + lc.kl_coef * kl
                loss = loss - lc.entropy_coef * aggregate(entropy, mask, lc.agg, w)
                for group in self.opt.param_groups:
                    group["lr"] = cfg.lr * cfg.lr_factor(self.steps)
                loss.backward()
                norms.append(float(torch.nn.utils.clip_grad_norm_(
                    self.model.parameters(), cfg.max_grad_norm or float("inf")
                )))  # fmt: skip
                self.opt.step()
                self.opt.zero_grad()
                losses.append(loss.item())
                self.steps += 1
        return {"loss": sum(losses) / len(losses), "grad_norm": sum(norms) / len(norms)}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def correction_weights(prox, behav, mask, correction: str, cap: float | None):
    """pi_prox / pi_behav per token, written out: truncated (tis) or dropped above cap."""
    w = torch.exp(prox - behav) * mask
    if correction == "tis":
        return torch.minimum(w, torch.full_like(w, cap))
    return w * (w <= cap) if cap is not None else w


def load_model(path):
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    return model.eval()


def reference_logprobs(model, samples: list[Sample], temperature: float):
    """Whole batch right-padded by hand; logprobs of response tokens at ``temperature``."""
    B = len(samples)
    L = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    T = max(len(s.response_ids) for s in samples)
    ids, att = torch.zeros(B, L, dtype=torch.long), torch.zeros(B, L, dtype=torch.long)
    pos, tgt = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long)
    mask, old = torch.zeros(B, T), torch.zeros(B, T)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        ids[i, : p + r] = torch.tensor(s.prompt_ids + s.response_ids)
        att[i, : p + r] = 1
        pos[i, :r] = torch.arange(p - 1, p - 1 + r)
        tgt[i, :r] = torch.tensor(s.response_ids)
        mask[i, :r] = torch.tensor(s.response_mask, dtype=torch.float32)
        old[i, :r] = torch.tensor(s.old_logprobs)
    logits = model(input_ids=ids, attention_mask=att).logits.float()  # (B, L, V)
    scaled = logits[torch.arange(B)[:, None], pos] / temperature  # (B, T, V)
    logp = scaled.log_softmax(-1).gather(-1, tgt[..., None]).squeeze(-1)  # (B, T)
    adv = torch.tensor([s.advantage for s in samples])
    w = torch.tensor([s.weight for s in samples])
    return logp, scaled, mask, old, adv, w


def full_state(group: TrainerGroup, bucket_bytes: int = 64 << 10) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for bucket in group.weights.full_state_dict(bucket_bytes):
        unique = {id(t): t for t in bucket.values()}.values()
        assert sum(t.numel() * t.element_size() for t in unique) <= bucket_bytes or len(unique) == 1
        state.update(bucket)
    return state


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def scenario_a(ray_session, model_path, tmp_path_factory):
    """Group A: steps 1-2, checkpoint, step 3; states and metrics after each step."""
    ckpt = tmp_path_factory.mktemp("ckpt") / "step2"
    group = TrainerGroup(model_path, CONFIG_A, LOSS_A)
    states, metrics = [], []
    try:
        for i, batch in enumerate(BATCHES):
            if i == 2:
                group.save_checkpoint(ckpt, extra={"next_row": 12, "epoch": 0})
            metrics.append(group.update(batch))
            states.append(full_state(group))
        yield {"group": group, "states": states, "metrics": metrics, "ckpt": ckpt}
    finally:
        group.shutdown()


def test_batches_exercise_micro_batching_and_idle_ranks():
    for batch in BATCHES:
        lengths = FlatSamples.from_samples(batch.samples).lengths
        plan = shard_plan(lengths, range(len(lengths)), 2, CONFIG_A.micro_batch_tokens)
        assert len(plan[0]) >= 2  # gradient accumulation over micro-batches
        assert any(mb == [] for rank in plan for mb in rank)  # a rank runs a placeholder


def test_two_ranks_match_single_process_reference(scenario_a, model_path):
    reference = Reference(model_path, CONFIG_A, LOSS_A)
    for step in range(2):
        expected = reference.update(BATCHES[step].samples)
        got = scenario_a["metrics"][step]
        assert max_diff(scenario_a["states"][step], reference.state_dict()) < TOL
        assert got["loss"] == pytest.approx(expected["loss"], abs=TOL)
        assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-4)
        assert got["grad_norm"] > CONFIG_A.max_grad_norm  # clipping was active
        assert got["step"] == step + 1 and got["lr"] == CONFIG_A.lr
        assert got["tokens"] == BATCHES[step].num_tokens
    assert max_diff(scenario_a["states"][1], reference.state_dict()) < TOL


def two_updates_match_reference(
    model_path, config, loss, batches=BATCHES
) -> list[dict[str, float]]:
    """Two updates of a group, each equal to the reference's; their metrics."""
    reference = Reference(model_path, config, loss)
    metrics = []
    with TrainerGroup(model_path, config, loss) as group:
        for step in range(2):
            metrics.append(group.update(batches[step]))
            expected = reference.update(batches[step].samples)
            assert max_diff(full_state(group), reference.state_dict()) < TOL
            assert metrics[-1]["loss"] == pytest.approx(expected["loss"], abs=TOL)
    return metrics


# seq-mean-token-sum-norm in this setup (2 ranks, 2 mini-batches) is the next test's: its
# batches keep live samples in three of the four mini-batches, so it is that mode's run too
# (one trainer group fewer to start).
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_two_ranks_micro_batched_match_reference_in_every_agg_mode(ray_session, model_path, agg):
    """Scenario A covers token-mean; the seq-mean modes on 2 ranks, micro-batched (the
    batches split into several micro-batches per rank) and in two mini-batches."""
    config = CONFIG_A.model_copy(update={"num_mini_batches": 2})
    metrics = two_updates_match_reference(model_path, config, PolicyLossConfig(agg=agg))
    assert [m["optimizer_steps"] for m in metrics] == [2, 2]


def without_signal(batch: Batch, inert: set[int]) -> Batch:
    """``batch`` with zero advantages for the samples ``inert`` (a group whose rewards agree)."""
    return Batch(samples=[
        s.model_copy(update={"token_advantages": [0.0] * len(s.response_ids)}) if i in inert else s
        for i, s in enumerate(batch.samples)
    ])  # fmt: skip


def test_samples_without_signal_are_skipped_and_the_update_is_unchanged(ray_session, model_path):
    """No KL or entropy term: inert samples stay out of the forward and backward passes (on 2
    ranks, micro-batched, 2 mini-batches of 4 and 3) yet count in the loss's denominator, so
    the weights equal the reference that computes them. Batch 0's first mini-batch is all
    inert: it is not computed either, and its step on zero gradients moves the weights by
    weight decay alone, as the reference's does."""
    batches = [without_signal(BATCHES[0], {0, 1, 2, 3, 5}), without_signal(BATCHES[1], {1, 4, 5})]
    config = CONFIG_A.model_copy(update={"num_mini_batches": 2})
    loss = PolicyLossConfig(agg="seq-mean-token-sum-norm")
    metrics = two_updates_match_reference(model_path, config, loss, batches)
    assert [m["samples_skipped"] for m in metrics] == [5, 3]
    assert [m["optimizer_steps"] for m in metrics] == [2, 2]  # (the agg-mode test's check)


def test_one_rank_micro_batched_matches_reference(ray_session, model_path):
    metrics = two_updates_match_reference(model_path, CONFIG_C, LOSS_C)
    assert [(m["optimizer_steps"], m["step"]) for m in metrics] == [(4, 4), (4, 8)]
    assert metrics[-1]["lr"] == pytest.approx(CONFIG_C.lr * CONFIG_C.lr_factor(7))


@pytest.mark.parametrize(
    ("correction", "cap"), [("tis", 2.0), ("decoupled", 3.0)], ids=["tis", "decoupled"]
)
def test_off_policy_corrections_match_reference(model_path, correction, cap):
    # In this process: the correction is the loss's arithmetic, the same wherever the rank
    # runs (a 1-rank Ray group of CONFIG_C is the test above); no actor start per case.
    config = CONFIG_C.model_copy(update={"recompute_old_logprobs": False, **IN_THIS_PROCESS})
    loss = PolicyLossConfig(correction=correction, is_cap=cap)
    got = two_updates_match_reference(model_path, config, loss)[-1]
    # The recorded logprobs are random, so the weights spread and some pass the cap.
    assert got["is_capped_frac"] > 0 and got["is_weight_max"] > cap
    assert got["mismatch_kl"] > 0


def test_resume_in_fresh_group_is_exact(scenario_a, model_path):
    with TrainerGroup(model_path, CONFIG_A, LOSS_A) as fresh:
        extra = fresh.load_checkpoint(scenario_a["ckpt"])
        assert extra == {"next_row": 12, "epoch": 0}
        metrics = fresh.update(BATCHES[2])
        state = full_state(fresh)
    expected = scenario_a["metrics"][2]
    machine = ("time_s", "peak_rss_gb")  # wall time and memory are not the update's
    assert {k: v for k, v in metrics.items() if k not in machine} == {
        k: v for k, v in expected.items() if k not in machine
    }
    assert all(torch.equal(state[k], scenario_a["states"][2][k]) for k in state)
    assert max_diff(state, scenario_a["states"][1]) > 1e-3  # step 3 did move the weights


def test_compute_logprobs_match_reference(scenario_a):
    group = scenario_a["group"]
    model = load_model(group.model_path)
    model.load_state_dict(full_state(group))
    batch = BATCHES[0]
    got = group.compute_logprobs(batch)
    with torch.no_grad():
        logp, *_ = reference_logprobs(model, batch.samples, CONFIG_A.temperature)
    for i, s in enumerate(batch.samples):
        want = [v if m else 0.0 for v, m in zip(logp[i].tolist(), s.response_mask)]
        assert got[i] == pytest.approx(want, abs=TOL)


def teach(group: TrainerGroup, prompt: list[int], target: int, updates: int) -> None:
    """PPO updates rewarding ``target`` after ``prompt`` (and after itself)."""
    sample = Sample(
        row_id="teach", sample_index=0, prompt_ids=prompt, response_ids=[target] * 4,
        response_mask=[1] * 4, old_logprobs=[0.0] * 4, token_advantages=[1.0] * 4,
    )  # fmt: skip
    for _ in range(updates):
        old = group.compute_logprobs(Batch(samples=[sample]))[0]
        group.update(Batch(samples=[sample.model_copy(update={"old_logprobs": old})]))


async def test_weight_sync_to_engines_and_export(scenario_a, model_path, tmp_path):
    group = scenario_a["group"]
    prompt, target = [17, 300, 42, 9, 512], 77
    engines = [TorchEngine.from_pretrained(model_path) for _ in range(2)]
    greedy = SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=())
    try:
        before = (await engines[0].generate(prompt, greedy, "before")).token_ids
        assert target not in before
        teach(group, prompt, target, updates=TEACH_UPDATES)
        trained = full_state(group)
        sync = WeightSync(bucket_bytes=64 << 10)
        await sync.push(group.weights, engines, 1)
        assert [e.policy_version for e in engines] == [1, 1]
        stats = sync.last_stats
        print(f"\nweight sync: {stats.bytes / 1e3:.0f} kB, {stats.buckets} buckets, "
              f"{stats.total_s * 1e3:.1f} ms (gather {stats.gather_s * 1e3:.1f} ms, "
              f"load {stats.load_s * 1e3:.1f} ms)")  # fmt: skip
        assert stats.buckets > 1
        assert stats.via == "shared_memory"  # rank 0 staged the buckets; the engines mapped them
        for engine in engines:
            served = engine.model.state_dict()
            assert served.keys() == trained.keys()
            assert all(torch.equal(served[k], trained[k]) for k in trained)
        after = await engines[0].generate(prompt, greedy, "after")
        assert after.policy_version == 1
        assert after.token_ids[0] == target and after.token_ids != before

        # Sampled at the trainer's temperature, the engine's logprobs are the trainer's.
        sampled = await engines[1].generate(
            prompt, SamplingParams(temperature=CONFIG_A.temperature, max_tokens=12, seed=3), "t"
        )
        n = len(sampled.token_ids)
        sample = Sample(
            row_id="x", sample_index=0, prompt_ids=prompt, response_ids=sampled.token_ids,
            response_mask=[1] * n, old_logprobs=sampled.logprobs, token_advantages=[0.0] * n,
        )  # fmt: skip
        recomputed = group.compute_logprobs(Batch(samples=[sample]))[0]
        assert recomputed == pytest.approx(sampled.logprobs, abs=1e-4)

        exported = TorchEngine.from_pretrained(group.export_pretrained(tmp_path / "export"))
        try:
            again = await exported.generate(prompt, greedy, "exported")
            assert again.token_ids == after.token_ids
            assert all(torch.equal(exported.model.state_dict()[k], trained[k]) for k in trained)
            assert (tmp_path / "export" / "tokenizer.json").is_file()
        finally:
            exported.close()
    finally:
        for engine in engines:
            engine.close()


async def test_shared_memory_push_reaches_engine_actors_and_matches_the_driver_path(
    scenario_a, model_path
):
    from agentrl_sdk.engines.ray import RayEngine
    from agentrl_sdk.weights.shared_files import shm_root

    group = scenario_a["group"]
    trained = full_state(group)
    prompt = [17, 300, 42, 9, 512]
    greedy = SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=())
    actor = RayEngine("torch", str(model_path))
    by_driver, fresh = TorchEngine.from_pretrained(model_path), TorchEngine.from_pretrained(model_path)
    try:
        shared = WeightSync(bucket_bytes=64 << 10)
        assert (await shared.push(group.weights, [actor], 1)).version == actor.policy_version == 1
        assert shared.last_stats.via == "shared_memory" and shared.last_stats.buckets > 1
        staged = Path(shm_root() or tempfile.gettempdir()).glob(f"agentrl-weights-{group.ranks.pids[0]}-*")
        assert len(list(staged)) == 1  # rank 0's files, overwritten in place by later pushes
        driver = WeightSync(bucket_bytes=64 << 10, transport="driver")
        await driver.push(group.weights, [by_driver], 1)
        assert driver.last_stats.via == "driver"
        assert driver.last_stats.bytes == shared.last_stats.bytes
        assert all(torch.equal(by_driver.model.state_dict()[k], trained[k]) for k in trained)
        want = await by_driver.generate(prompt, greedy, "driver")
        got = await actor.generate(prompt, greedy, "actor")
        # Same weights, other memory: the actor's are views at the files' offsets, whose
        # alignment can change a matmul's summation order in the last bit.
        assert got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
        untrained = await fresh.generate(prompt, greedy, "fresh")
        assert untrained.logprobs != want.logprobs  # the push did change the actor's weights

        # Two more actors, each started once (~10 s a start) and used twice: the first, as on
        # another machine, then with the second for the push group.
        actors = [RayEngine("torch", str(model_path)) for _ in range(2)]
        try:
            # An actor on another machine (as it would say) fetches from rank 0's object store.
            remote = actors[0]
            own_intake = remote.weight_intake
            remote.weight_intake = WeightIntake(own_intake.kinds, "another-machine/0")
            stored = WeightSync(bucket_bytes=64 << 10)
            await stored.push(group.weights, [remote], 1)
            assert stored.last_stats.via == "object_store" and stored.last_stats.buckets > 1
            got = await remote.generate(prompt, greedy, "remote")
            assert got.token_ids == want.token_ids  # (logprobs: as above, to the last bit)
            assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
            remote.weight_intake = own_intake
            # Zeros again, so the push group below must bring it the weights as to a fresh one.
            zeros = {k: torch.zeros_like(v) for k, v in trained.items()}
            await remote.load_weights(StateDict(zeros), 2)
            assert (await remote.generate(prompt, greedy, "zeroed")).logprobs != want.logprobs

            # Asked for, the object store even to an actor on this machine.
            asked = WeightSync(bucket_bytes=64 << 10, transport="object_store")
            await asked.push(group.weights, [actor], 2)
            assert actor.policy_version == 2
            assert asked.last_stats.via == "object_store"
            got = await actor.generate(prompt, greedy, "asked")
            assert got.token_ids == want.token_ids

            # A push group (gloo here, NCCL on GPUs): rank 0 broadcasts, two actors receive.
            collective = WeightSync(bucket_bytes=64 << 10, transport="collective")
            for version in (3, 4):  # the second push reuses the group
                await collective.push(group.weights, actors, version)
                assert [e.policy_version for e in actors] == [version, version]
                assert collective.last_stats.via == "collective"
                assert collective.last_stats.buckets > 1
            for i, engine in enumerate(actors):
                got = await engine.generate(prompt, greedy, f"collective-{i}")
                assert got.token_ids == want.token_ids
                assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
        finally:
            for engine in actors:
                engine.close()
    finally:
        for engine in (actor, by_driver, fresh):
            engine.close()


async def test_engines_serve_staged_weights_without_a_copy_and_never_write_them(
    scenario_a, model_path
):
    group = scenario_a["group"]
    engine = TorchEngine.from_pretrained(model_path)
    try:
        first = group.weights.stage(64 << 10)
        await engine.load_weights(first, 1)
        staged = first.state_dict()
        served = engine.model.state_dict()
        assert all(served[k].data_ptr() == staged[k].data_ptr() for k in staged)  # no copy
        second = group.weights.stage(64 << 10)  # the next push writes the other file set
        assert set(second.paths).isdisjoint(first.paths)
        before = {k: v.clone() for k, v in staged.items()}
        zeros = {k: torch.zeros_like(v) for k, v in served.items()}
        await engine.load_weights(StateDict(zeros), 2)  # a copy-in update...
        assert all(torch.equal(first.state_dict()[k], before[k]) for k in before)  # ...files kept
        assert not any(v.any() for v in engine.model.state_dict().values())
    finally:
        engine.close()
    # An engine serving bfloat16 gets the files in bfloat16: half the bytes, served in place,
    # the values its own copy-in cast would give.
    engine = TorchEngine.from_pretrained(model_path, dtype="bfloat16")
    try:
        assert engine.weight_intake.dtype == "bfloat16"
        full = group.weights.stage(64 << 10)
        fp32 = {k: v.clone() for k, v in full.state_dict().items()}
        half = group.weights.stage(64 << 10, "bfloat16")
        assert half.nbytes * 2 == full.nbytes
        await engine.load_weights(half, 3)
        served = engine.model.state_dict()
        assert all(served[k].data_ptr() == v.data_ptr() for k, v in half.state_dict().items())
        assert all(torch.equal(served[k], v.to(torch.bfloat16)) for k, v in fp32.items())
    finally:
        engine.close()


def test_worker_errors_name_the_rank(scenario_a, tmp_path):
    group = scenario_a["group"]
    with pytest.raises(TrainerError, match=r"rank \d failed in load_checkpoint: FileNotFoundError"):
        group.load_checkpoint(tmp_path / "missing")
    with pytest.raises(TypeError, match="JSON"):
        group.save_checkpoint(tmp_path / "bad", extra={"x": object()})
    assert group.compute_logprobs(Batch(samples=BATCHES[0].samples[:1]))  # still usable


def test_bf16_compute_keeps_fp32_weights_and_tracks_the_fp32_update(model_path):
    config = TrainerConfig(world_size=1, lr=1e-3, dtype="bfloat16", **IN_THIS_PROCESS)
    reference = Reference(model_path, config.model_copy(update={"dtype": "float32"}), LOSS_C)
    expected = reference.update(BATCHES[0].samples)
    with TrainerGroup(model_path, config, LOSS_C) as group:
        assert group.info["dtype"] == "bfloat16"
        got = group.update(BATCHES[0])
        state = full_state(group)
    assert {t.dtype for t in state.values()} == {torch.float32}  # master weights stay fp32
    # bf16 keeps ~3 significant digits: close to the fp32 update, and not it to the bit.
    assert got["loss"] == pytest.approx(expected["loss"], rel=2e-2, abs=1e-3)
    assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=2e-2)
    assert got["loss"] != expected["loss"] or got["grad_norm"] != expected["grad_norm"]


@pytest.fixture(scope="module")
def last_layer(ray_session, model_path):
    """A 1-rank Ray group training the last layer alone (activation checkpointing, 2 threads):
    two updates, with metrics and states after each. The push test then pushes from it (one
    group start for both)."""
    config = CONFIG_C.model_copy(
        update={"trainable_layers": 1, "activation_checkpointing": True, "cpu_threads": 2}
    )
    with TrainerGroup(model_path, config, LOSS_C) as group:
        metrics, states = [], []
        for step in range(2):
            metrics.append(group.update(BATCHES[step]))
            states.append(full_state(group))
        yield {"group": group, "config": config, "metrics": metrics, "states": states}


def test_last_layer_only_with_activation_checkpointing_matches_reference(last_layer, model_path):
    group, config = last_layer["group"], last_layer["config"]
    reference = Reference(model_path, config, LOSS_C)
    freeze_all_but_last(reference.model, reference.model.model.layers, 1)
    start = reference.state_dict()
    trained = sum(p.numel() for p in reference.model.parameters() if p.requires_grad)
    assert group.info["trained_params"] == trained < group.info["num_params"]
    assert group.info["nice"] == 0  # not Ray's nice 15
    assert group.info["threads"] == 2  # cpu_threads, not Ray's one OMP thread
    for step in range(2):
        got, state = last_layer["metrics"][step], last_layer["states"][step]
        expected = reference.update(BATCHES[step].samples)
        assert max_diff(state, reference.state_dict()) < TOL
        assert got["loss"] == pytest.approx(expected["loss"], abs=TOL)
        assert got["peak_rss_gb"] > 0
    moved = {k for k in state if not torch.equal(state[k], start[k])}
    assert moved and all(k.startswith(("model.layers.1.", "model.norm.")) for k in moved)


async def test_pushes_of_the_changed_tensors_give_engines_the_trainers_weights(
    last_layer, model_path, tmp_path
):
    """With the last layer trained, a push carries it and the final norm alone; an engine
    started from the model folder then serves exactly the trainer's weights. A checkpoint says
    which tensors moved; one that does not says all."""
    group = last_layer["group"]
    engine = TorchEngine.from_pretrained(model_path)
    try:
        trained = full_state(group)
        sync = WeightSync(bucket_bytes=64 << 10, changed_only=True)
        await sync.push(group.weights, [engine], 1)
        moved = {k for k in trained if k.startswith(("model.layers.1.", "model.norm."))}
        assert sync.last_stats.tensors == len(moved) and sync.last_stats.via == "shared_memory"
        unique = {id(t): t for t in trained.values()}.values()
        full = sum(t.numel() * t.element_size() for t in unique)
        print(f"\npartial push: {sync.last_stats.bytes} of {full} bytes")
        assert sync.last_stats.bytes < 0.5 * full
        served = engine.model.state_dict()
        assert served.keys() == trained.keys()
        assert all(torch.equal(served[k], trained[k]) for k in trained)
        group.save_checkpoint(tmp_path / "ckpt")
    finally:
        engine.close()
    # Reading a checkpoint is the same wherever the rank runs: the fresh group is in this
    # process (no second actor start).
    config = last_layer["config"].model_copy(update=IN_THIS_PROCESS)
    with TrainerGroup(model_path, config, LOSS_C) as resumed:
        resumed.load_checkpoint(tmp_path / "ckpt")
        push = resumed.weights.export_weights("state_dict", 64 << 10, changed_only=True)
        assert push.partial and push.tensors.keys() == moved
        state_file = tmp_path / "ckpt" / "trainer_state.json"
        state = json.loads(state_file.read_text())
        del state["changed_keys"]  # as written before the record existed
        state_file.write_text(json.dumps(state))
        resumed.load_checkpoint(tmp_path / "ckpt")
        push = resumed.weights.export_weights("state_dict", 64 << 10, changed_only=True)
        assert push.tensors.keys() == trained.keys()


def test_trainable_layers_beyond_the_model_is_refused(model_path):
    # The rank's setup refuses it; test_worker_errors_name_the_rank has a Ray rank's error.
    config = TrainerConfig(trainable_layers=3, **IN_THIS_PROCESS)
    with pytest.raises(TrainerError, match="trainable_layers=3 but the model has 2 decoder layers"):
        TrainerGroup(model_path, config, LOSS_C)
