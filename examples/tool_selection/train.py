"""Train the tool-selection agent with GRPO on this CPU and watch the reward rise.

    python -m examples.tool_selection.train [--steps 40] [--config examples/tool_selection/config.yaml]

The same job runs as ``agentrl train examples/tool_selection/config.yaml``.
"""

from __future__ import annotations

from pathlib import Path

from examples._train import main, run, summarize

HERE = Path(__file__).parent
__all__ = ["HERE", "run", "summarize"]

if __name__ == "__main__":
    main(HERE / "config.yaml", __doc__.splitlines()[0])
