"""Train LangGraph's prebuilt ReAct agent, unchanged, on this CPU.

    python -m examples.react_prebuilt.train [--steps 40] [--config examples/react_prebuilt/config.yaml]
"""

from __future__ import annotations

from pathlib import Path

from examples._train import main, run, summarize

HERE = Path(__file__).parent
__all__ = ["HERE", "run", "summarize"]

if __name__ == "__main__":
    main(HERE / "config.yaml", __doc__.splitlines()[0])
