"""SmolLM2-135M-Instruct learns textarena's GuessTheNumber-v0 with GRPO on this CPU.

    python -m examples.textarena.train [--steps 12] [--config examples/textarena/config.yaml]

Held-out games (seeds never trained on) are played greedily before training and after. The
same job runs as ``agentrl train examples/textarena/config.yaml``.
"""

from __future__ import annotations

from pathlib import Path

from examples._train import main, run, summarize

HERE = Path(__file__).parent
__all__ = ["HERE", "run", "summarize"]

if __name__ == "__main__":
    main(HERE / "config.yaml", __doc__.splitlines()[0])
