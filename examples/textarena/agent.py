"""textarena's GuessTheNumber-v0, unchanged, as the graph SmolLM2-135M-Instruct learns to play.

The game picks a number from 1 to 20 and answers each guess with "higher" or "lower"; ten
guesses. textarena's reward is 1 for finding it, else how close the last guess came
(``1 - distance / 19``); a reply without a ``[number]`` is an invalid move (one retry, then the
game ends with that closeness).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import agentrl_sdk as sdk
from agentrl_sdk.environments.textarena import TextArenaGame

ENV_ID = "GuessTheNumber-v0"
SYSTEM = "You are playing Guess The Number. Reply with your guess only, like [10]."


@cache
def game() -> TextArenaGame:
    """The game: 512 training seeds, 32 held-out ones from another range."""
    from agentrl_sdk.environments.textarena import textarena

    return textarena(ENV_ID, seeds=range(512), eval_seeds=range(100_000, 100_032),
                     max_turns=12, system_prompt=SYSTEM)


def build_graph() -> Any:
    """The game node and the player's node (``@sdk.trainable("player")``)."""
    return game().graph


def training_rows() -> list[dict[str, Any]]:
    return game().rows


def held_out_rows() -> list[dict[str, Any]]:
    return game().eval_rows


def reward(final_state: dict[str, Any], row: dict[str, Any], trajectory: Any) -> list[
        sdk.RewardComponent]:
    """textarena's own reward for the game (the ``outcome`` component)."""
    return game().reward(final_state, row, trajectory)
