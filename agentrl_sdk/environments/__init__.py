"""Environments the ecosystem already trains on, as graphs, datasets and rewards of this SDK.

- `reasoning_gym`: reasoning-gym's procedural tasks; the task's own verifier is the reward.
- `textarena`: textarena's text games; the game is a LangGraph loop, its outcome the reward.

Both need the ``environments`` extra (``pip install '.[environments]'``); the libraries are
imported when an environment is built, not when this package is.
"""

from agentrl_sdk.environments.reasoning_gym import (
    ReasoningGym,
    ReasoningGymReward,
    VerifierError,
    reasoning_gym,
    task_names,
)
from agentrl_sdk.environments.textarena import (
    GameDataMissing,
    GameNotReplayable,
    TextArenaGame,
    textarena,
)

__all__ = [
    "GameDataMissing",
    "GameNotReplayable",
    "ReasoningGym",
    "ReasoningGymReward",
    "TextArenaGame",
    "VerifierError",
    "reasoning_gym",
    "task_names",
    "textarena",
]
