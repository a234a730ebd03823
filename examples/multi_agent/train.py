"""Train the supervisor and the math worker together (the words worker stays frozen).

    python -m examples.multi_agent.train [--steps 30] [--config examples/multi_agent/config.yaml]
"""

from __future__ import annotations

from pathlib import Path

from examples._train import main, run, summarize

HERE = Path(__file__).parent
__all__ = ["HERE", "run", "summarize"]

if __name__ == "__main__":
    main(HERE / "config.yaml", __doc__.splitlines()[0])
