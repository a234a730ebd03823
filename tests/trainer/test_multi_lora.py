"""Several policies as LoRA adapters of one base in one trainer group: each adapter trains with
its own optimizer on its own batches exactly as a group holding it alone (= PEFT in one
process), an update of one leaves the other as it was, each push serves its own adapter in one
TorchEngine with the trainer's logprobs, and a checkpoint of every adapter resumes exactly.

Group M (1 rank, adapters "default" and "b"): b steps on batches 0 and 1, default on batch 1.
"""

from __future__ import annotations

import pytest
import torch

from agentrl_sdk.engines.adapter_view import AdapterView
from agentrl_sdk.engines.torch.engine import TorchEngine
from agentrl_sdk.trainer import TrainerGroup, WeightSync
from agentrl_sdk.trainer.adapter_group import AdapterGroup
from agentrl_sdk.types import Batch, Sample, SamplingParams
from tests.trainer.test_lora import CONFIG_L1, PeftReference
from tests.trainer.test_trainer_group import BATCHES, LOSS_C, TOL, max_diff

pytestmark = pytest.mark.slow

NAMES = ("default", "b")
STEPS = [("b", 0), ("default", 1), ("b", 1)]  # (adapter, batch) in order


@pytest.fixture(scope="module")
def scenario_m(ray_session, model_path, tmp_path_factory):
    """Group M after STEPS (checkpointed after the first two), with what each step returned."""
    ckpt = tmp_path_factory.mktemp("multi_lora_ckpt")
    group = TrainerGroup(model_path, CONFIG_L1, LOSS_C, adapters=NAMES)
    views = {name: AdapterGroup(group, name) for name in NAMES}
    initial = {name: views[name].weights.adapter_state_dict() for name in NAMES}
    metrics, states = [], []
    try:
        for i, (name, batch) in enumerate(STEPS):
            if i == 2:
                for other in NAMES:
                    views[other].save_checkpoint(ckpt / other, extra={"adapter": other})
            metrics.append(views[name].update(BATCHES[batch]))
            states.append({n: views[n].weights.adapter_state_dict() for n in NAMES})
        yield {"group": group, "views": views, "initial": initial, "metrics": metrics,
               "states": states, "ckpt": ckpt}  # fmt: skip
    finally:
        group.shutdown()


def test_each_adapter_trains_alone_like_a_single_lora_group(scenario_m, model_path):
    references = {name: PeftReference(model_path, CONFIG_L1, LOSS_C) for name in NAMES}
    assert max_diff(scenario_m["initial"]["b"], references["b"].adapter()) == 0.0
    for i, (name, batch) in enumerate(STEPS):
        expected = references[name].update(BATCHES[batch].samples)
        got, state = scenario_m["metrics"][i], scenario_m["states"][i]
        assert max_diff(state[name], references[name].adapter()) < TOL
        assert got["loss"] == pytest.approx(expected["loss"], abs=TOL)
        for other in NAMES:  # the other adapter did not move
            if other != name:
                before = (
                    scenario_m["states"][i - 1][other]
                    if i
                    else scenario_m["initial"][other]
                )
                assert max_diff(state[other], before) == 0.0
    # each adapter counts its own optimizer steps (2 mini-batches x 2 epochs per update)
    assert [m["step"] for m in scenario_m["metrics"]] == [4.0, 4.0, 8.0]


async def test_each_push_serves_its_adapter_with_the_trainers_logprobs(
    scenario_m, model_path
):
    views = scenario_m["views"]
    engine = TorchEngine.from_pretrained(model_path)
    try:
        served = {name: AdapterView(engine, name) for name in NAMES}
        syncs = {name: WeightSync() for name in NAMES}
        for version, name in enumerate(NAMES, 1):  # versions the driver picks, per push
            await syncs[name].push(views[name].weights, [served[name]], version)
            assert syncs[name].last_stats.adapter
        assert [served[n].policy_version for n in NAMES] == [1, 2]
        prompt = [5, 99, 310, 7]
        for name in NAMES:
            params = SamplingParams(
                temperature=CONFIG_L1.temperature, max_tokens=12, seed=3
            )
            sampled = await served[name].generate(prompt, params, name)
            assert sampled.policy_version == served[name].policy_version
            n = len(sampled.token_ids)
            sample = Sample(
                row_id="x", sample_index=0, prompt_ids=prompt, response_ids=sampled.token_ids,
                response_mask=[1] * n, old_logprobs=sampled.logprobs, token_advantages=[0.0] * n,
            )  # fmt: skip
            trainer = views[name].compute_logprobs(Batch(samples=[sample]))[0]
            assert trainer == pytest.approx(sampled.logprobs, abs=1e-4), name
    finally:
        engine.close()


def test_checkpoints_of_several_adapters_resume_exactly(scenario_m, model_path):
    ckpt = scenario_m["ckpt"]
    with TrainerGroup(model_path, CONFIG_L1, LOSS_C, adapters=NAMES) as fresh:
        views = {name: AdapterGroup(fresh, name) for name in NAMES}
        for name in NAMES:
            assert views[name].load_checkpoint(ckpt / name) == {"adapter": name}
            assert (
                max_diff(
                    views[name].weights.adapter_state_dict(), scenario_m["states"][1][name]
                )
                == 0
            )
        metrics = views["b"].update(BATCHES[1])
        state = {n: views[n].weights.adapter_state_dict() for n in NAMES}
    expected = scenario_m["metrics"][2]
    machine = ("time_s", "peak_rss_gb")
    assert {k: v for k, v in metrics.items() if k not in machine} == {
        k: v for k, v in expected.items() if k not in machine
    }
    for name in NAMES:
        want = scenario_m["states"][2][name]
        assert all(torch.equal(state[name][k], want[k]) for k in want)


def test_views_refuse_what_a_shared_base_cannot_do(scenario_m):
    group = scenario_m["group"]
    with pytest.raises(ValueError, match="holds adapters"):
        AdapterGroup(group, "nope")
    with pytest.raises(Exception, match="pushes its adapter only"):
        scenario_m["views"]["b"].weights.full_state_dict()


def test_two_ranks_train_one_adapter_while_the_other_idles(ray_session, model_path):
    """FSDP2 over 2 ranks: the idle adapter's parameters get no gradient (its modules do not
    run) and the trained one matches PEFT; then the other adapter trains from its own start."""
    from tests.trainer.test_lora import CONFIG_L
    from tests.trainer.test_trainer_group import LOSS_A

    with TrainerGroup(model_path, CONFIG_L, LOSS_A, adapters=NAMES) as group:
        views = {name: AdapterGroup(group, name) for name in NAMES}
        initial = views["default"].weights.adapter_state_dict()
        references = {name: PeftReference(model_path, CONFIG_L, LOSS_A) for name in NAMES}
        got = views["b"].update(BATCHES[0])
        expected = references["b"].update(BATCHES[0].samples)
        assert max_diff(views["b"].weights.adapter_state_dict(), references["b"].adapter()) < TOL
        assert got["loss"] == pytest.approx(expected["loss"], abs=TOL)
        assert max_diff(views["default"].weights.adapter_state_dict(), initial) == 0.0
        views["default"].update(BATCHES[1])
        references["default"].update(BATCHES[1].samples)
        assert max_diff(views["default"].weights.adapter_state_dict(), references["default"].adapter()) < TOL
