"""In headless Chromium: a finished run's traces in the MLflow UI (served on loopback), and the
`agentrl inspect --html` page. CI installs Chromium (`.ci/run`); elsewhere these skip without it
unless AGENTRL_REQUIRE_BROWSER=1."""

from __future__ import annotations

import asyncio
import os

import pytest
from typer.testing import CliRunner

import agentrl_sdk as sdk
from agentrl_sdk.cli import app
from agentrl_sdk.tracing import MlflowServer, RolloutCredit, TrainingRun
from agentrl_sdk.tracing.browser import chromium_executable, headless_page, open_trace
from examples.calculator.agent import build_graph
from tests.tracing.test_traces import ROWS, InterleavingEngine

pytestmark = pytest.mark.slow


def _browser_or_skip() -> None:
    missing = chromium_executable() is None
    try:
        import playwright  # noqa: F401
    except ImportError:
        missing = True
    if missing:
        if os.environ.get("AGENTRL_REQUIRE_BROWSER") == "1":
            pytest.fail("Chromium or Playwright is missing (apt-get install chromium; "
                        "pip install -e '.[test]')")
        pytest.skip("no Chromium/Playwright here (CI installs them)")


@pytest.fixture(scope="module")
def finished_run(qwen_tokenizer, tmp_path_factory):
    """An MLflow server on loopback holding a finished run with 4 rollout traces."""
    _browser_or_skip()
    folder = tmp_path_factory.mktemp("server")
    trajectories = asyncio.run(sdk.arollout_batch(
        build_graph(), ROWS[:2], InterleavingEngine(qwen_tokenizer), tokenizer=qwen_tokenizer,
        n=2, record_events=True,
    ))
    for t in trajectories:
        t.reward = float(t.sample_index)
    with MlflowServer(f"sqlite:///{folder / 'mlflow.db'}", log_path=folder / "server.log") as srv:
        run = TrainingRun(srv.url, "browser-test", run_name="finished")
        credit = {(t.row_id, t.sample_index): RolloutCredit(t.reward - 0.5, 0.25)
                  for t in trajectories}
        ids = run.log_traces(0, trajectories, credit=credit, tokenizer=qwen_tokenizer)
        run.log_metrics(0, {"reward/mean": 0.5})
        run.end()
        yield srv, run, ids, trajectories


def test_mlflow_ui_shows_the_trace_and_its_token_attributes(finished_run):
    srv, run, ids, trajectories = finished_run
    traj = trajectories[1]
    with headless_page() as page:
        text = open_trace(page, srv.url, run.experiment_id, ids[1],
                          root_name=f"rollout {traj.row_id}#1", span_name="llm · solver · turn 0")
    call = traj.calls[0]
    for needle in ("tools", "calculator", "unknown (malformed call)", "engine.generate[default]",
                   "agentrl.prompt_ids", "agentrl.response_ids", "agentrl.response_mask",
                   "agentrl.response_logprobs", f"{traj.row_id}:1-0"):
        assert needle in text, needle
    # The response token ids, in order, as the UI lists them.
    lines = text.splitlines()
    start = lines.index("agentrl.response_ids") + 1
    shown = [int(line.strip("- ").strip()) for line in lines[start:start + len(call.response_ids)]]
    assert shown == call.response_ids


def test_inspect_html_page_in_the_browser(finished_run, tmp_path):
    srv, _, ids, trajectories = finished_run
    out = tmp_path / "trace.html"
    result = CliRunner().invoke(app, ["inspect", ids[1], "--uri", srv.url, "--html", str(out)])
    assert result.exit_code == 0, result.output
    traj = trajectories[1]
    with headless_page() as page:
        page.goto(out.as_uri())
        assert page.title() == f"agentrl trace {ids[1]}"
        body = page.inner_text("body")
        generated = page.locator("pre span.gen-pos").all_inner_texts()  # advantage +0.5
        observations = page.locator("pre span.obs").all_inner_texts()
        spans = page.locator("ul.spans li").count()
    assert f"Rollout row {traj.row_id} · sample 1 · step 0" in body
    assert "advantage\t0.5" in body and "loss_share\t0.25" in body
    assert "The answer is 1001." in "".join(generated) and len(generated) == 4
    assert any("<tool_response>" in o for o in observations) and len(observations) == 3
    assert "malformed call" in body and "error:" in body
    assert spans == 1 + 7 + 4 + 4 + 3  # root, nodes, llm calls, engine calls, tools
