"""Make the tracing guide's screenshots with the project's own code.

    python docs/trace_screenshots.py [--out docs/assets]

Rollouts of the tool-selection agent (the demo's warm-started tiny model, embedded engine) are
scored, credited and traced to an MLflow server started on loopback (`MlflowServer`). The trace
of a rewarded rollout is opened in headless Chromium with its first LLM span selected
(``trace_ui.png``), and the same trace's `agentrl inspect --html` page is shot too
(``trace_html.png``). Both are written to ``docs/assets/``, where docs/guides/tracing.md embeds
them. Needs the system ``chromium`` and Playwright (the ``test`` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformers import AutoTokenizer  # noqa: E402

from agentrl_sdk.engines import create_engine  # noqa: E402
from agentrl_sdk.pipeline import TrainConfig  # noqa: E402
from agentrl_sdk.pipeline.batch import advantages, batch_samples, credit_rollouts  # noqa: E402
from agentrl_sdk.rollout import arollout_batch, row_id_of  # noqa: E402
from agentrl_sdk.rollout.rewards import score  # noqa: E402
from agentrl_sdk.tracing import (  # noqa: E402
    MlflowServer,
    TrainingRun,
    load_trace_view,
    rollout_credit,
    trace_html,
)
from agentrl_sdk.tracing.browser import headless_page, open_trace  # noqa: E402
from examples.tool_selection.agent import (  # noqa: E402
    build_graph,
    graph_input,
    make_rows,
    right_tool_reward,
)
from examples.tool_selection.model import model_path  # noqa: E402
from examples.tool_selection.train import HERE  # noqa: E402


async def _rollouts(tokenizer, path: str, rows):
    config = TrainConfig.from_yaml(HERE / "config.yaml")
    engine = create_engine("torch", path, max_batch_size=64)
    try:
        trajectories = await arollout_batch(build_graph(), rows, engine, tokenizer=tokenizer,
                                            config=config.rollout, input_fn=graph_input,
                                            record_events=True)
    finally:
        engine.close()
    await score(trajectories, {row_id_of(r): r for r in rows}, right_tool_reward)
    samples, extra, _ = batch_samples([credit_rollouts(trajectories)], per_call=False)
    samples, _ = advantages(samples, extra, config.algorithm.estimator)
    return trajectories, rollout_credit(samples, config.algorithm.agg)


def main(out: Path) -> None:
    path = str(model_path())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    rows = make_rows(2, seed=11)
    trajectories, credit = asyncio.run(_rollouts(tokenizer, path, rows))
    # A rewarded rollout that called a tool, with a non-zero advantage: the interesting kind.
    def interest(t) -> tuple[float, int]:
        found = credit.get((t.row_id, t.sample_index))
        return (found.advantage if found else float("-inf"), len(t.calls))

    best = max(trajectories, key=interest)
    folder = Path(tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    with MlflowServer(f"sqlite:///{folder / 'mlflow.db'}", log_path=folder / "server.log") as srv:
        run = TrainingRun(srv.url, "tool-selection-demo", run_name="docs")
        ids = run.log_traces(0, trajectories, credit=credit, tokenizer=tokenizer)
        run.end()
        trace_id = ids[trajectories.index(best)]
        page_file = folder / "trace.html"
        page_file.write_text(trace_html(load_trace_view(srv.url, trace_id)), encoding="utf-8")
        with headless_page(width=1440, height=900) as page:
            open_trace(page, srv.url, run.experiment_id, trace_id,
                       root_name=f"rollout {best.row_id}#{best.sample_index}",
                       span_name="llm · solver · turn 0")
            page.screenshot(path=str(out / "trace_ui.png"),
                            clip={"x": 0, "y": 0, "width": 1010, "height": 900})
            page.set_viewport_size({"width": 1100, "height": 900})
            page.goto(page_file.as_uri())
            page.screenshot(path=str(out / "trace_html.png"), full_page=True)
    print(f"wrote {out / 'trace_ui.png'} and {out / 'trace_html.png'} (trace {trace_id}, "
          f"reward {best.reward}, advantage {credit[(best.row_id, best.sample_index)].advantage:+.3f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "assets")
    main(parser.parse_args().out)
