"""Learning from production: an agent served for hundreds of requests, a share rated by a rule,
then trained from its traces three ways; held-out gain, minutes and tokens of each.

    python benchmarks/production.py [--quick]

Runs `examples/production_loop/loop.py`: the tool-selection agent (warm-started tiny model,
embedded TorchEngine, in-process trainer) is served over HTTP with one MLflow trace per
request; the rule ``correct`` (the first tool call is the one the question asks for) rates
half of the traces; off-policy RL on the traced tokens, fine-tuning on the best traces and
on-policy replay of the traced prompts each start from the served model. The figures: each
mode's greedy held-out reward against the served model's (the baseline, same run), its
minutes and the tokens it used (off-policy: traced tokens trained, per epoch; fine-tuning:
tokens with loss; replay: tokens generated). ``--quick`` serves 128 requests instead of 512.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._results import write_result  # noqa: E402
from examples.production_loop.loop import run  # noqa: E402


def main(quick: bool) -> None:
    requests = 128 if quick else 512
    load = os.getloadavg()[0]
    report = run(Path(tempfile.mkdtemp(prefix="production-")), requests, 0.5,
                 replay_steps=4 if quick else 12)
    base = report["served_held_out_reward"]
    figures = {}
    for outcome in report["outcomes"]:
        key = outcome.mode.split(" ")[0].replace("-", "_").lower()
        figures[f"held_out_reward_{key}"] = {
            "value": round(outcome.held_out_reward, 4), "baseline": round(base, 4),
            "gain": round(outcome.held_out_reward - base, 4),
            "unit": "greedy reward/mean on 32 held-out questions",
            "baseline_name": "the served model, same run", "mode": outcome.mode,
            "minutes": round(outcome.minutes, 2), "tokens": outcome.trained_tokens,
            **{k: v for k, v in outcome.details.items()},
        }
    figures["served_requests"] = {
        "value": report["requests"], "unit": "requests", "rated": report["rated"],
        "selection": report["selection"], "serve_minutes": round(report["serve_minutes"], 2),
        "traces_written": report["serve_counts"].get("traces_written"),
        "load_average_1m_at_start": round(load, 2),
    }
    for name, figure in figures.items():
        print(name, figure)
    print(f"wrote {write_result('production', figures)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="128 requests")
    main(parser.parse_args().quick)
