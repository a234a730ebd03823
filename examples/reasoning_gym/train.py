"""SmolLM2-135M-Instruct learns a reasoning-gym task on this CPU: GRPO with the task's verifier.

    python -m examples.reasoning_gym.train [--steps 24] [--config examples/reasoning_gym/config.yaml]

The same job runs as ``agentrl train examples/reasoning_gym/config.yaml``; held-out greedy
pass@1 is measured before training, every 8 updates and at the end.
"""

from __future__ import annotations

from pathlib import Path

from examples._train import main, run, summarize

HERE = Path(__file__).parent
__all__ = ["HERE", "run", "summarize"]

if __name__ == "__main__":
    main(HERE / "config.yaml", __doc__.splitlines()[0])
