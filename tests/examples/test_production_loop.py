"""The production loop's serving and rating: served requests become traces whose inputs and
outputs the rule reads as a user would, and its verdict equals the training reward computed
on the same served output state. (Training from the traces is tested in tests/production.)"""

from __future__ import annotations

import asyncio

import mlflow
from langchain_core.messages import messages_from_dict

import agentrl_sdk as sdk
from examples.production_loop.loop import EXPERIMENT, called_right_tool, rate, serve_requests
from examples.tool_selection.agent import make_rows, right_tool_reward


def test_served_requests_are_traced_and_rated_by_the_rule(tmp_path):
    uri = f"sqlite:///{tmp_path / 'served.db'}"
    counts = asyncio.run(serve_requests(uri, 12, seed=11))
    assert counts["traces_written"] == 12 and counts["traces_lost"] == 0, counts
    rows = {r["messages"][-1]["content"]: r for r in make_rows(12, seed=11)}
    records = sdk.traces(uri, experiment=EXPERIMENT).records
    assert len(records) == 12
    for record in records:
        if record.inputs is None or record.outputs is None:  # the agent failed (answered 500)
            assert called_right_tool(record) is False
            continue
        row = rows[record.inputs["messages"][-1]["content"]]
        state = {"messages": messages_from_dict(
            [{"type": m["type"], "data": m} for m in record.outputs["messages"]])}
        assert called_right_tool(record) == bool(right_tool_reward(state, row, None))

    assert rate(uri, share=0.5) == 6
    mlflow.set_tracking_uri(uri)
    rated = sdk.traces(uri, experiment=EXPERIMENT, reward="correct")
    assert len(rated) == 6 and rated.counts["no_feedback"] == 6
    assert {r.reward for r in rated.records} <= {0.0, 1.0}
    assert all(r.reward == float(called_right_tool(r)) for r in rated.records)
