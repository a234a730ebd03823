"""Write the generated reference pages under docs/reference/ (config, CLI, metrics, API).

    python scripts/gen_reference.py          # rewrite the pages
    python scripts/gen_reference.py --check  # exit 1 if a committed page is stale

Each page is built from the code it documents: the pydantic config models, the typer app, the
metric registry (`agentrl_sdk.pipeline.metric_names`) and ``agentrl_sdk.__all__``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))  # the _ref_* modules beside this file

import _ref_api  # noqa: E402
import _ref_cli  # noqa: E402
import _ref_config  # noqa: E402

REFERENCE = ROOT / "docs" / "reference"

METRICS_INTRO = """\
# Metrics

Every metric a training job logs, per step, to `TrainResult.history` and to its MLflow run,
and every metric an evaluation reports in `EvalResult.metrics` (logged to MLflow as
`eval/<name>` at the number of updates evaluated). Generated from
`agentrl_sdk.pipeline.metric_names` (`python scripts/gen_reference.py`).

Names with `<placeholders>` are families: `reward/<component>` has one metric per reward
component name, `status/<status>` one per rollout status, `staleness/<k>` one per staleness.
Metrics marked *per policy* are named as shown for the default policy; another trained policy's
carry its name after the first part: `train/<policy>/loss`, `critic/<policy>/value_loss`,
`engine/<policy>/reroutes`, `policy_version/<policy>`. A metric appears only when the feature
that produces it is on (the critic's with `advantage_estimator: gae`, `async/...` in both
pipelines, `traces/...` with tracking on).
"""


def render_metrics() -> str:
    from agentrl_sdk.pipeline.metric_names import METRICS

    lines = [METRICS_INTRO]
    group = None
    for metric in METRICS:
        if metric.group != group:
            group = metric.group
            lines += ["", f"## {group}", "", "| Name | Unit | Meaning |", "|---|---|---|"]
        per = " *Per policy.*" if metric.per_policy else ""
        text = _ref_config.cell(metric.description)
        lines.append(f"| `{metric.name}` | {metric.unit} | {text}{per} |")
    return "\n".join(lines).strip() + "\n"


def render_config() -> str:
    from agentrl_sdk.engines.options import BACKENDS
    from agentrl_sdk.gateway import GatewayConfig
    from agentrl_sdk.pipeline import TrainConfig
    from agentrl_sdk.serving import ServeConfig

    # engine.options is a union of option models, one per engine.backend.
    backends = {b.options: f"`backend: {name}`" for name, b in BACKENDS.items()}
    return _ref_config.render(TrainConfig, GatewayConfig, backends, ServeConfig)


def render_cli() -> str:
    from agentrl_sdk.cli import app

    return _ref_cli.render(app)


def render_api() -> str:
    import agentrl_sdk

    return _ref_api.render(agentrl_sdk)


PAGES: dict[str, Callable[[], str]] = {
    "config.md": render_config,
    "cli.md": render_cli,
    "metrics.md": render_metrics,
    "api.md": render_api,
}


def stale_pages() -> list[str]:
    """The pages whose committed text differs from what the generator writes."""
    return [name for name, render in PAGES.items()
            if not (REFERENCE / name).is_file()
            or (REFERENCE / name).read_text(encoding="utf-8") != render()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a page is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        for name in stale:
            print(f"docs/reference/{name} is stale: run python scripts/gen_reference.py")
        return 1 if stale else 0
    for name, render in PAGES.items():
        (REFERENCE / name).write_text(render(), encoding="utf-8")
        print(f"wrote docs/reference/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
