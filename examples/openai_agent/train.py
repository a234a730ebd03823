"""Train the OpenAI-SDK calculator agent on this CPU: ``python -m examples.openai_agent.train``.

The same pipeline as a LangGraph agent (rollouts, GRPO, FSDP2 update, weight sync); only the
rollouts differ: each runs `agent` against its own gateway URL. The tiny warm-started policy
makes the right calls but rarely the right arithmetic (as under the LangGraph version of the
task), so a short run shows the mechanics rather than a rising reward.
"""

from __future__ import annotations

import argparse

import agentrl_sdk as sdk
from examples.calculator.agent import make_rows
from examples.calculator.model import model_path
from examples.openai_agent.agent import agent, reward


def config(steps: int) -> sdk.TrainConfig:
    """A short run: 4 questions x 4 samples per step on the warm-started calculator policy."""
    return sdk.TrainConfig.model_validate({
        "model": {"path": str(model_path())},
        "rollout": {"n": 4, "sampling": {"temperature": 1.0, "max_tokens": 48, "seed": 0},
                    "chat": {"max_context_tokens": 1024}},
        "data": {"batch_size": 4},
        "trainer": {"world_size": 1, "lr": 1e-3},
        "max_steps": steps,
        "tracking": {"enabled": False},
    })


def main() -> None:
    """Train and print the reward per step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    steps = parser.parse_args().steps
    result = sdk.train(agent, make_rows(64, seed=5), reward, config(steps))
    print("reward per step:", [round(m["reward/mean"], 3) for m in result.history])


if __name__ == "__main__":
    main()
