"""A row that cannot become its graph's input is reported when the dataset loads, not as a
`graph_error` in every rollout later."""

from __future__ import annotations

import pytest
from langgraph.graph import END, START, MessagesState, StateGraph
from typer.testing import CliRunner
from typing_extensions import TypedDict

import agentrl_sdk as sdk
from agentrl_sdk.cli import app
from agentrl_sdk.data import DatasetError, GraphInputCheck, load_rows
from agentrl_sdk.rollout import default_input

GOOD = {"id": "q0", "messages": [{"role": "user", "content": "2 + 2?"}]}
VERL = {"id": "q1", "prompt": [{"role": "user", "content": "3 + 3?"}]}
NO_MESSAGES = {"id": "q7", "question": "4 + 4?"}


class QuestionState(TypedDict, total=False):
    question: str
    answer: str


def _graph(state: type) -> object:
    builder = StateGraph(state)
    builder.add_node("solve", lambda s: {})
    builder.add_edge(START, "solve")
    builder.add_edge("solve", END)
    return builder.compile()


def question_input(row: dict) -> dict:
    return {"messages": [{"role": "user", "content": row["question"]}]}


def test_a_row_without_messages_or_prompt_is_refused_before_any_step():
    with pytest.raises(DatasetError) as caught:
        sdk.train(_graph(MessagesState), [GOOD, NO_MESSAGES, VERL],
                  config={"data": {"on_bad_row": "raise"}})

    message = str(caught.value)
    assert message.startswith("bad dataset row: row 1, field 'messages': the graph's input takes "
                              "['messages'] and default_input made none of them")
    assert message.endswith("(id 'q7')") and "'prompt'" in message


def test_with_on_bad_row_skip_it_is_skipped_and_counted():
    check = GraphInputCheck(_graph(MessagesState), default_input)

    rows, problems = load_rows([GOOD, NO_MESSAGES, VERL, {"question": "5 + 5?"}],
                               input_check=check)

    assert rows == [GOOD, VERL]
    assert [(p.index, p.field, p.row_id) for p in problems] == [
        (1, "messages", "q7"), (3, "messages", None)]
    with pytest.raises(DatasetError, match=r"no usable rows \(1 skipped; first: row 0, field "
                                           r"'messages'"):
        sdk.evaluate(_graph(MessagesState), [NO_MESSAGES])


def test_a_state_json_schema_cannot_describe_is_read_from_its_class():
    # typing.TypedDict (as the demo's State): pydantic cannot make its schema on Python 3.11.
    from examples.tool_selection.agent import State, build_graph

    check = GraphInputCheck(build_graph(), default_input)

    rows, problems = load_rows([GOOD, NO_MESSAGES], input_check=check)

    assert State.__module__ == "examples.tool_selection.agent" and rows == [GOOD]
    assert [(p.index, p.field, p.row_id) for p in problems] == [(1, "messages", "q7")]


def test_a_custom_input_fn_needs_its_own_fields_not_messages():
    check = GraphInputCheck(_graph(MessagesState), question_input)

    rows, problems = load_rows([NO_MESSAGES, GOOD], input_check=check)

    assert rows == [NO_MESSAGES]
    (problem,) = problems
    assert (problem.index, problem.field, problem.row_id) == (1, "question", "q0")
    assert "question_input reads" in problem.message


def test_rows_that_are_the_graphs_own_input_and_agent_functions_pass():
    by_row = GraphInputCheck(_graph(QuestionState), default_input)  # the row itself is the input

    async def agent(endpoint, row):  # an agent function takes the row as it is
        return None

    assert load_rows([NO_MESSAGES], input_check=by_row) == ([NO_MESSAGES], [])
    assert load_rows([NO_MESSAGES], input_check=GraphInputCheck(agent, default_input))[1] == []
    routed = GraphInputCheck({"default": _graph(MessagesState), "qa": _graph(QuestionState)},
                             default_input)
    rows, problems = load_rows([{**NO_MESSAGES, "agent_name": "qa"}, NO_MESSAGES],
                               input_check=routed)
    assert len(rows) == 1 and [p.index for p in problems] == [1]


def test_an_input_fn_that_raises_otherwise_names_the_error():
    def broken(row: dict) -> dict:
        raise TypeError("no dice")

    with pytest.raises(DatasetError, match=r"field '\(input_fn\)': broken raised TypeError: no "
                                           r"dice \(id 'q0'\)"):
        load_rows([GOOD], input_check=GraphInputCheck(_graph(MessagesState), broken),
                  on_bad_row="raise")


def test_agentrl_train_reports_a_refused_dataset_with_exit_2(tmp_path, monkeypatch):
    (tmp_path / "fault_job.py").write_text(
        "from langgraph.graph import END, START, MessagesState, StateGraph\n"
        "builder = StateGraph(MessagesState)\n"
        "builder.add_node('solve', lambda s: {})\n"
        "builder.add_edge(START, 'solve')\n"
        "builder.add_edge('solve', END)\n"
        "graph = builder.compile()\n"
        f"def rows():\n    return [{GOOD!r}, {NO_MESSAGES!r}]\n"
    )
    (tmp_path / "config.yaml").write_text(
        "entrypoint:\n  graph: fault_job:graph\n  dataset: fault_job:rows\n"
        "data:\n  on_bad_row: raise\n"
    )
    monkeypatch.chdir(tmp_path)  # where `agentrl train` imports the entrypoints from
    monkeypatch.syspath_prepend(str(tmp_path))  # ...and taken off sys.path again afterwards

    result = CliRunner().invoke(app, ["train", "config.yaml"])

    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.startswith("error: bad dataset row: row 1, field 'messages'")
