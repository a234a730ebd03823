"""Playing a textarena game from its seed and the moves made so far, offline.

The graph state holds only the game's id, seed and moves (plain data), never a live env:
every environment step makes the game again, resets it with its seed and replays the
moves. A textarena game draws from the process-wide ``random`` (``reset`` seeds it), so a
live game kept across the ``await`` of a model call would draw numbers other rollouts' games
seeded in between; a replay runs in one synchronous stretch and is the same game every time.
Nothing outlives the step, so there is nothing to release when a rollout fails or is
cancelled, and a state can be copied (tree rollouts, checkpointers).
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from agentrl_sdk.environments._imports import import_environment_library
from agentrl_sdk.errors import AgentRLError

_NLTK_KINDS = ("corpora", "taggers", "tokenizers", "chunkers", "models", "misc", "sentiment",
               "stemmers", "grammars", "help")
"""Where nltk keeps a resource named by its id (``words`` is ``corpora/words``)."""


class GameDataMissing(AgentRLError, RuntimeError):
    """The game reads data its wheel does not ship (an nltk corpus) and it is not installed."""


class GameNotReplayable(AgentRLError, RuntimeError):
    """Replaying a game's moves from its seed did not reproduce what its players were shown."""


def textarena_module() -> Any:
    """``textarena``, or an error naming the extra that installs it."""
    return import_environment_library(
        "textarena", "textarena games need the textarena package: "
        "pip install 'agentrl-sdk[environments]'")


def check_env_id(env_id: str) -> None:
    """Refuse an id textarena's registry does not hold, naming its closest ids."""
    registry = textarena_module().envs.registration.ENV_REGISTRY
    if env_id in registry:
        return
    close = difflib.get_close_matches(env_id, list(registry), n=5, cutoff=0.5)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    raise ValueError(f"unknown textarena game {env_id!r} ({len(registry)} ids are registered, "
                     f"e.g. GuessTheNumber-v0, TicTacToe-v0){hint}")


def _nltk_has(resource: str) -> bool:
    import nltk

    for kind in _NLTK_KINDS:
        for name in (f"{kind}/{resource}", f"{kind}/{resource}.zip"):
            try:
                nltk.data.find(name)
                return True
            except LookupError:
                continue
    return False


@contextmanager
def no_downloads(env_id: str) -> Iterator[None]:
    """Run a game's code with ``nltk.download`` answering from the installed data only.

    textarena's word games call ``nltk.download`` when their module is imported; here that
    call finds the resource already installed or raises `GameDataMissing`, and a corpus read
    that nltk cannot satisfy (``LookupError``) becomes the same error.
    """
    try:
        import nltk
        import nltk.downloader
    except ImportError:  # without nltk, no game can ask it for anything
        yield
        return

    def refuse(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
        names = [info_or_id] if isinstance(info_or_id, str) else list(info_or_id or [])
        missing = [str(n) for n in names if not _nltk_has(str(n))]
        if missing or not names:
            raise GameDataMissing(_missing_message(env_id, missing or ["(all nltk data)"]))
        return True

    saved = nltk.download, nltk.downloader.download
    nltk.download = nltk.downloader.download = refuse
    try:
        yield
    except LookupError as exc:
        raise GameDataMissing(_missing_message(env_id, [str(exc).strip().splitlines()[0]
                                                        if str(exc).strip() else "nltk data"])
                              ) from exc
    finally:
        nltk.download, nltk.downloader.download = saved


def _missing_message(env_id: str, names: Sequence[str]) -> str:
    return (f"textarena game {env_id!r} needs nltk data that is not installed: "
            f"{', '.join(names)}. Nothing is downloaded during training; install it beforehand "
            f"(python -m nltk.downloader {' '.join(n for n in names if ' ' not in n)}) or "
            "choose a game that ships its data")


def _unwrapped(env: Any) -> Any:
    """The game under textarena's wrappers (their observation formats are not used)."""
    while hasattr(env, "env") and env.__class__.__module__.startswith("textarena.wrappers"):
        env = env.env
    return env


def render(player: int, messages: Sequence[Any], roles: dict[int, str]) -> str:
    """The messages a player was sent since its last move, as one text.

    Its own moves are left out (they are its assistant messages already); other players'
    moves are tagged with their role, the game's messages are plain.
    """
    lines = [str(text).strip() if sender < 0 else f"[{roles.get(sender, sender)}] {text}"
             for sender, text, *_ in messages if sender != player]
    return "\n".join(line for line in lines if line)


@dataclass
class Play:
    """A game replayed up to now: who moves next and what they were just shown, or its end."""

    player: int = 0
    """The player to move (when not done)."""
    shown: list[tuple[int, str]] = field(default_factory=list)
    """Every observation so far, in order: (player, rendered text)."""
    done: bool = False
    rewards: dict[int, float] | None = None
    """textarena's own rewards by player id (``close()``), None unless the game ended."""
    info: dict[str, Any] = field(default_factory=dict)
    """textarena's game info (``close()``): reasons, invalid_move flags, turn counts."""
    illegal: list[dict[str, Any]] = field(default_factory=list)
    """Each invalid move the game declared: move index, player, reason, whether it ended it."""
    error: str | None = None
    """The game raised on a move: its end, with no rewards."""


def replay(env_id: str, num_players: int, seed: int, moves: Sequence[str],
           env_kwargs: dict[str, Any]) -> Play:
    """Make ``env_id``, reset it with ``seed`` and play ``moves``; the process's ``random``
    state is left as it was."""
    ta = textarena_module()
    saved = random.getstate()
    try:
        with no_downloads(env_id):
            env = ta.make(env_id, **env_kwargs)
            game = _unwrapped(env)
            env.reset(num_players=num_players, seed=seed)
            return _play(env, game, moves)
    finally:
        random.setstate(saved)


def _play(env: Any, game: Any, moves: Sequence[str]) -> Play:
    play = Play()
    state = game.state
    declare = state.set_invalid_move
    move_index = [-1]

    def counted(*args: Any, **kwargs: Any) -> Any:
        player = state.current_player_id
        reason = kwargs.get("reason", args[0] if args else None)
        result = declare(*args, **kwargs)
        play.illegal.append({"move": move_index[0], "player": player, "reason": str(reason),
                             "ended_game": bool(state.done)})
        return result

    state.set_invalid_move = counted  # the game's own rule runs; each call is one invalid move
    player, messages = game.get_observation()
    play.player, play.shown = player, [(player, render(player, messages, state.role_mapping))]
    for index, move in enumerate(moves):
        move_index[0] = index
        try:
            done, _ = env.step(move)
        except Exception as exc:  # noqa: BLE001 - a game's own bug on odd input ends it, counted
            play.done, play.error = True, f"{type(exc).__name__}: {exc}"
            return play
        if done:
            play.done = True
            closed = env.close()
            rewards, info = closed if isinstance(closed, tuple) else (closed, {})
            play.rewards = {int(k): float(v) for k, v in (rewards or {}).items()}
            play.info = dict(info or {})
            return play
        player, messages = game.get_observation()
        play.player = player
        play.shown.append((player, render(player, messages, state.role_mapping)))
    return play


def players_of(env_id: str, env_kwargs: dict[str, Any], seed: int) -> int:
    """The smallest number of players the game resets with (``GameDataMissing`` when it
    needs data it lacks)."""
    ta = textarena_module()
    saved = random.getstate()
    refusals = []
    try:
        with no_downloads(env_id):
            for count in range(1, 7):
                env = ta.make(env_id, **env_kwargs)
                try:
                    env.reset(num_players=count, seed=seed)
                    return count
                except (AssertionError, ValueError) as exc:  # the game's "n players" checks
                    refusals.append(str(exc))
    finally:
        random.setstate(saved)
    raise ValueError(f"textarena game {env_id!r} reset with no number of players from 1 to 6: "
                     f"{refusals[-1] if refusals else ''}")
