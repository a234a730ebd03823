"""`sdk.traces` selects by experiment, time, tags and filter, and reads rewards from feedback
or a function; every trace it does not keep is counted under its reason."""

from __future__ import annotations

import mlflow
import pytest
from mlflow.entities import AssessmentError

import agentrl_sdk as sdk
from agentrl_sdk.production import rollout_reward, search
from examples.calculator.agent import make_rows
from examples.calculator.reward import calculator_reward
from tests.conftest import ScriptedEngine
from tests.production.conftest import serve


@pytest.fixture
def feedback(served):
    """Feedback ``correct`` on the served traces: True, 0.25, text, and none."""
    mlflow.set_tracking_uri(served.uri)
    ids = served.trace_ids
    mlflow.log_feedback(trace_id=ids[0], name="correct", value=True)
    mlflow.log_feedback(trace_id=ids[1], name="correct", value=0.25)
    mlflow.log_feedback(trace_id=ids[2], name="correct", value="yes")
    mlflow.log_feedback(trace_id=ids[3], name="helpful", value=1.0)
    return ids


def test_feedback_values_become_rewards_and_the_rest_is_counted(served, feedback):
    selection = sdk.traces(served.uri, experiment="served", reward="correct")
    assert {r.trace_id: r.reward for r in selection.records} == {feedback[0]: 1.0,
                                                                 feedback[1]: 0.25}
    assert selection.left_out == {"feedback_not_a_number": [feedback[2]],
                                  "no_feedback": [feedback[3]]}
    assert selection.counts == {"found": 4, "kept": 2, "feedback_not_a_number": 1,
                                "no_feedback": 1}


def test_the_latest_valid_feedback_counts(served):
    mlflow.set_tracking_uri(served.uri)
    first, second, third, _ = served.trace_ids
    mlflow.log_feedback(trace_id=first, name="correct", value=True)
    mlflow.log_feedback(trace_id=first, name="correct", value=False)
    old = mlflow.log_feedback(trace_id=second, name="correct", value=False)
    mlflow.override_feedback(trace_id=second, assessment_id=old.assessment_id, value=True)
    mlflow.log_feedback(trace_id=third, name="correct", value=True)
    mlflow.log_feedback(trace_id=third, name="correct",
                        error=AssessmentError(error_code="JUDGE_DOWN", error_message="timeout"))
    selection = sdk.traces(served.uri, experiment="served", reward="correct")
    assert {r.trace_id: r.reward for r in selection.records} == {first: 0.0, second: 1.0,
                                                                 third: 1.0}
    assert selection.counts["no_feedback"] == 1


def test_a_reward_function_reads_the_traced_input_and_output(served):
    def reward(record):
        answer = record.outputs["messages"][-1]["content"]
        question = record.inputs["messages"][-1]["content"]
        if "(" not in question:
            return None
        return float(record.expectations.get("answer", "?") in answer)

    mlflow.set_tracking_uri(served.uri)
    for trace_id, row in zip(served.trace_ids, served.rows, strict=True):
        mlflow.log_expectation(trace_id=trace_id, name="answer",
                               value=row["answer"] if row is not served.rows[0] else "-1")
    selection = sdk.traces(served.uri, experiment="served", reward=reward)
    rewards = {r.trace_id: r.reward for r in selection.records}
    assert rewards == {served.trace_ids[0]: 0.0, **{i: 1.0 for i in served.trace_ids[1:]}}


def test_a_failing_or_silent_reward_function_leaves_traces_out_counted(served, caplog):
    first = served.trace_ids[0]

    def reward(record):
        if record.trace_id == first:
            raise RuntimeError("judge unavailable")
        return None if record.trace_id == served.trace_ids[1] else "high"

    selection = sdk.traces(served.uri, experiment="served", reward=reward)
    assert selection.records == []
    assert selection.left_out["reward_error"] == [first]
    assert sorted(selection.left_out["no_reward"]) == sorted(served.trace_ids[1:])
    assert "judge unavailable" in caplog.text


def test_tags_time_range_filter_and_experiments_select(served, qwen_tokenizer):
    later = serve(ScriptedEngine, qwen_tokenizer, served.uri, "served", make_rows(2, seed=5),
                  tags={"segment": "beta"})
    serve(ScriptedEngine, qwen_tokenizer, served.uri, "elsewhere", make_rows(1, seed=6))
    everything = sdk.traces(served.uri)
    assert len(everything) == 7
    assert len(sdk.traces(served.uri, experiment=["served", "elsewhere"])) == 7
    tagged = sdk.traces(served.uri, experiment="served", tags={"segment": "beta"})
    assert {r.trace_id for r in tagged.records} == set(later.trace_ids)
    recent = sdk.traces(served.uri, experiment="served", start=later.written_after_ms)
    assert {r.trace_id for r in recent.records} == set(later.trace_ids)
    older = sdk.traces(served.uri, experiment="served", end=later.written_after_ms)
    assert {r.trace_id for r in older.records} == set(served.trace_ids)
    mlflow.set_tracking_uri(served.uri)
    mlflow.log_feedback(trace_id=served.trace_ids[2], name="correct", value=True)
    liked = sdk.traces(served.uri, experiment="served", filter_string="feedback.correct = 'true'")
    assert [r.trace_id for r in liked.records] == [served.trace_ids[2]]
    assert liked.records[0].feedback == {"correct": True}
    named = sdk.traces(served.uri, tags={"mlflow.traceName": f"rollout {served.rows[1]['id']}#0"})
    assert [r.trace_id for r in named.records] == [served.trace_ids[1]]
    newest = sdk.traces(served.uri, experiment="served", limit=3)
    assert len(newest) == 3 and newest.found == 3
    assert set(later.trace_ids) < {r.trace_id for r in newest.records}


def test_bad_selections_are_refused(served):
    with pytest.raises(ValueError, match="no experiment named 'nope'"):
        sdk.traces(served.uri, experiment="nope")
    with pytest.raises(ValueError, match="must be after start"):
        sdk.traces(served.uri, start=2000, end=1000)


def test_records_carry_the_tokenizer_identity_and_tags(served, qwen_tokenizer):
    record = sdk.traces(served.uri, experiment="served").records[0]
    assert record.tokenizer.vocab_size == 151669
    assert record.tags["kind"] == "rollout" and record.tags["step"] == "0"
    assert record.timestamp_ms >= served.written_after_ms
    assert record.reward is None


def test_the_search_pages_through_the_store(served, monkeypatch):
    monkeypatch.setattr(search, "PAGE_SIZE", 3)
    every = sdk.traces(served.uri, experiment="served", limit=None)
    assert sorted(r.trace_id for r in every.records) == sorted(served.trace_ids)
    assert len(sdk.traces(served.uri, experiment="served", limit=2)) == 2


def test_the_training_reward_function_scores_traces_after_the_fact(served):
    mlflow.set_tracking_uri(served.uri)
    for trace_id, row in zip(served.trace_ids, served.rows, strict=True):
        mlflow.log_expectation(trace_id=trace_id, name="operands", value=row["operands"])
        mlflow.log_expectation(trace_id=trace_id, name="answer",
                               value=row["answer"] if row is not served.rows[2] else "0")

    def row_fn(record):
        return {**record.inputs, **record.expectations}

    selection = sdk.traces(served.uri, experiment="served",
                           reward=rollout_reward(calculator_reward, row_fn))
    rewards = {r.trace_id: r.reward for r in selection.records}
    # the served agent computed (a+b)*c in one tool call: no step credit (0.25 for a+b, 0.25
    # for the product); the answer's 0.5 everywhere but where the expectation disagrees
    assert rewards == {i: 0.5 * (i != served.trace_ids[2]) for i in served.trace_ids}

    async def judge(state, row, trajectory):
        if row["answer"] == "0":
            raise RuntimeError("judge unavailable")
        return float(len(trajectory.calls) == 2)

    selection = sdk.traces(served.uri, experiment="served", reward=rollout_reward(judge, row_fn))
    assert selection.left_out == {"reward_error": [served.trace_ids[2]]}
    assert {r.reward for r in selection.records} == {1.0}
    with pytest.raises(TypeError, match="cannot be called as"):
        rollout_reward(lambda state: 1.0)
