"""Train the GSM8K tool agent (verl-format data, lifecycle checking tool) on this CPU.

    python -m examples.gsm8k_tool_agent.train [--steps 30] [--config examples/gsm8k_tool_agent/config.yaml]

The same job runs as ``agentrl train examples/gsm8k_tool_agent/config.yaml``; on a GPU node,
``config_gpu.yaml`` is the real-model setup.
"""

from __future__ import annotations

from pathlib import Path

from examples._train import main, run, summarize

HERE = Path(__file__).parent
__all__ = ["HERE", "run", "summarize"]

if __name__ == "__main__":
    main(HERE / "config.yaml", __doc__.splitlines()[0])
