"""textarena's text games as LangGraph graphs: the players' nodes move, a game node steps.

    game = sdk.environments.textarena("GuessTheNumber-v0")
    sdk.train(game.graph, game.rows, game.reward, config, eval_dataset=game.eval_rows)

Each player is a node whose chat model reads that player's conversation (the game's messages
as user turns, its own moves as assistant turns) and replies with a move; the ``game`` node
applies it with the game's ``step`` and sends the next player what the game told it, until the
game ends. The observations are never generated, so they are mask 0 in the ledger: every
trained token is one the engine sampled. textarena's own rewards (``close()``) are each
player's outcome, credited to that player's node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from agentrl_sdk.chat.context import current_recorder
from agentrl_sdk.chat.events import jsonable
from agentrl_sdk.chat.messages import message_text
from agentrl_sdk.environments._textarena_play import (
    GameDataMissing,
    GameNotReplayable,
    Play,
    check_env_id,
    players_of,
    replay,
)
from agentrl_sdk.graph import chat_model, frozen, trainable
from agentrl_sdk.types import RewardComponent

__all__ = ["GameDataMissing", "GameNotReplayable", "GameState", "TextArenaGame", "textarena"]

DEFAULT_SYSTEM_PROMPT = (
    "You are playing a text game. Read the game's messages and reply with your next move, "
    "written exactly as the game asks."
)


class GameState(TypedDict, total=False):
    """The graph's state: plain data only (the game is replayed from ``seed`` and ``moves``)."""

    id: str
    env_id: str
    seed: int
    seat: int | None
    """In self-play: the player whose moves train in this row (the others are frozen)."""
    moves: list[str]
    """Every move sent to the game, legal or not, in order."""
    conversations: dict[str, list[BaseMessage]]
    """Each player's conversation, by player node name."""
    shown: list[str]
    """Every observation sent so far, in order (a replay must reproduce them)."""
    to_move: int
    done: bool
    truncated: bool
    rewards: dict[str, float] | None
    """textarena's reward for each player node; None when the game did not end."""
    game_info: dict[str, Any]
    illegal_moves: list[dict[str, Any]]
    """Each invalid move the game declared: move index, player, reason, whether it ended it."""
    game_error: str | None


@dataclass
class TextArenaGame:
    """One textarena game as a graph, its training and held-out rows, and its reward."""

    env_id: str
    players: tuple[str, ...]
    """The player nodes' names, by textarena player id."""
    policies: tuple[str, ...]
    """The policy serving each player."""
    graph: Any
    """The compiled LangGraph graph: ``game`` node and one node per player."""
    rows: list[dict[str, Any]]
    """Training rows: one per seed (times the seats, in self-play)."""
    eval_rows: list[dict[str, Any]]
    """Held-out rows, from seeds disjoint from the training ones."""
    max_turns: int
    """Most moves in one rollout (illegal ones included) before it ends as truncated."""
    self_play: bool = False
    """Several seats share a policy: each row trains one of them (``seat``), the rest play
    frozen, so the policy learns each seat's own outcome (in a zero-sum game, training both
    seats of one rollout on their summed outcome would teach nothing)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def recursion_limit(self) -> int:
        """The ``rollout.recursion_limit`` a full game needs (two graph steps per move)."""
        return 2 * self.max_turns + 4

    def trained_seats(self, row: Mapping[str, Any]) -> list[int]:
        """The players whose moves train in ``row``."""
        seat = row.get("seat")
        return list(range(len(self.players))) if seat is None else [int(seat)]

    def reward(self, final_state: Mapping[str, Any], row: Mapping[str, Any],
               trajectory: Any = None) -> list[RewardComponent]:
        """Each trained player's textarena reward, crediting that player's node.

        A single-player game's component is named ``outcome``; in a game of several it is
        named after the player node, so ``reward/<player>`` reports each player's mean. A game
        that did not end (``max_turns`` reached, or the game raised) scores 0.
        """
        rewards = final_state.get("rewards") or {}
        return [RewardComponent(
            name="outcome" if len(self.players) == 1 else self.players[seat],
            value=float(rewards.get(self.players[seat], 0.0)), node=self.players[seat],
        ) for seat in self.trained_seats(row)]


def textarena(
    env_id: str,
    *,
    players: int | Sequence[str] | None = None,
    policies: str | Sequence[str] = "default",
    seeds: Sequence[int] = range(256),
    eval_seeds: Sequence[int] = range(100_000, 100_064),
    max_turns: int = 50,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    env_kwargs: Mapping[str, Any] | None = None,
) -> TextArenaGame:
    """A textarena game (``ta.make(env_id)``) as a graph, rows and reward.

    Args:
        env_id: A textarena registry id (``GuessTheNumber-v0``, ``TicTacToe-v0``, ...).
        players: The number of players (default: the fewest the game accepts) or the player
            nodes' names; default names ``player`` alone, else ``player_0``, ``player_1``...
        policies: The policy serving every player, or one per player. Players of distinct
            policies all train in every rollout; players sharing one policy play it in
            self-play, one seat trained per row (see `TextArenaGame.self_play`).
        seeds: The training games' seeds (textarena's ``reset(seed=...)``).
        eval_seeds: The held-out games' seeds; none may be a training seed.
        max_turns: Most moves per rollout before it ends as truncated (scored 0).
        system_prompt: The system message opening each player's conversation; None for none.
        env_kwargs: Keyword arguments for ``ta.make`` (the game's own options).

    Raises:
        ValueError: unknown ``env_id`` (with its close matches), overlapping seeds, or
            ``players``/``policies`` that do not fit the game.
        GameDataMissing: the game needs data (an nltk corpus) that is not installed; nothing
            is downloaded.
    """
    check_env_id(env_id)
    kwargs = dict(env_kwargs or {})
    seeds, eval_seeds = [int(s) for s in seeds], [int(s) for s in eval_seeds]
    if not seeds:
        raise ValueError("textarena(...) needs at least one training seed")
    if overlap := sorted(set(seeds) & set(eval_seeds)):
        raise ValueError(f"held-out seeds must not be trained on; both lists hold {overlap[:5]}")
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns}")
    names = _player_names(env_id, players, kwargs, seeds[0])
    try:  # made and reset once now: a game lacking its data is refused before training
        replay(env_id, len(names), seeds[0], [], kwargs)
    except (AssertionError, ValueError) as exc:  # textarena's own player-count checks
        raise ValueError(f"{env_id} does not play with {len(names)} players: {exc}") from exc
    served = (policies,) * len(names) if isinstance(policies, str) else tuple(policies)
    if len(served) != len(names):
        raise ValueError(f"{env_id} has {len(names)} players but {len(served)} policies were "
                         f"given: {list(served)}")
    self_play = len(set(served)) < len(served)
    seats = range(len(names)) if self_play else [None]
    game = TextArenaGame(
        env_id=env_id, players=names, policies=served, graph=None, max_turns=max_turns,
        rows=_rows(env_id, seeds, seats), eval_rows=_rows(env_id, eval_seeds, seats),
        self_play=self_play, env_kwargs=kwargs,
    )
    game.graph = _build_graph(game, system_prompt)
    return game


def _player_names(env_id: str, players: int | Sequence[str] | None,
                  kwargs: dict[str, Any], seed: int) -> tuple[str, ...]:
    if isinstance(players, str):
        raise ValueError("players is a number or a list of node names, not one string")
    if isinstance(players, Sequence):
        names = tuple(str(p) for p in players)
        if len(set(names)) != len(names) or "game" in names:
            raise ValueError(f"player names must be distinct and not 'game': {list(names)}")
        return names
    count = players_of(env_id, kwargs, seed) if players is None else players
    if count < 1:
        raise ValueError(f"a game needs at least one player, got {count}")
    return ("player",) if count == 1 else tuple(f"player_{i}" for i in range(count))


def _rows(env_id: str, seeds: Sequence[int], seats: Sequence[int | None]) -> list[dict[str, Any]]:
    rows = []
    for seed in seeds:
        for seat in seats:
            row: dict[str, Any] = {"id": f"{env_id}/seed={seed}", "env_id": env_id, "seed": seed}
            if seat is not None:
                row["id"] += f"/seat={seat}"
                row["seat"] = seat
            rows.append(row)
    return rows


def _count(name: str, amount: int = 1) -> None:
    """Add to the running rollout's metrics (``rollout/<name>`` per step); no-op outside."""
    recorder = current_recorder.get()
    if recorder is not None and amount:
        recorder.metrics[name] += amount


def _build_graph(game: TextArenaGame, system_prompt: str | None) -> Any:
    opening = [SystemMessage(system_prompt)] if system_prompt else []

    def step(state: GameState) -> dict[str, Any]:
        """Start the game, or play the move just made; send the next player its messages."""
        moves = list(state.get("moves") or [])
        conversations = {k: list(v) for k, v in (state.get("conversations") or {}).items()}
        if conversations:  # a player just replied: its move is the last assistant message
            mover = game.players[state["to_move"]]
            moves.append(message_text(conversations[mover][-1]))
        play = replay(game.env_id, len(game.players), int(state["seed"]), moves, game.env_kwargs)
        shown = [text for _, text in play.shown]
        if shown[: len(state.get("shown") or [])] != list(state.get("shown") or []):
            raise GameNotReplayable(
                f"{game.env_id} with seed {state['seed']} showed different messages when its "
                "moves were replayed: the game is not deterministic under its seed")
        new_illegal = [m for m in play.illegal if m["move"] == len(moves) - 1]
        _count("textarena/illegal_moves", len(new_illegal) if conversations else 0)
        out: dict[str, Any] = {
            "moves": moves, "shown": shown, "done": play.done, "conversations": conversations,
            "illegal_moves": [*(state.get("illegal_moves") or []),
                              *(new_illegal if conversations else [])],
        }
        if play.done:
            return out | _ending(game, play)
        if len(moves) >= game.max_turns:
            _count("textarena/truncated")
            return out | {"done": True, "truncated": True, "rewards": None}
        player = game.players[play.player]
        history = conversations.get(player) or list(opening)
        conversations[player] = [*history, HumanMessage(play.shown[-1][1])]
        return out | {"to_move": play.player, "truncated": False}

    graph = StateGraph(GameState)
    graph.add_node("game", step)
    for seat, (name, policy) in enumerate(zip(game.players, game.policies, strict=True)):
        graph.add_node(name, _player_node(seat, name, policy))
        graph.add_edge(name, "game")
    graph.add_edge(START, "game")
    graph.add_conditional_edges(
        "game", lambda s: END if s.get("done") else game.players[s["to_move"]],
        [END, *game.players])
    return graph.compile()


def _ending(game: TextArenaGame, play: Play) -> dict[str, Any]:
    if play.error is not None:
        _count("textarena/game_errors")
        return {"rewards": None, "game_error": play.error, "game_info": {}}
    rewards = {game.players[pid]: value for pid, value in (play.rewards or {}).items()
               if 0 <= pid < len(game.players)}
    info = {game.players[pid] if isinstance(pid, int) and 0 <= pid < len(game.players)
            else str(pid): value for pid, value in play.info.items()}
    _count("textarena/games_ended")
    # As JSON-like data, texts whole: traces and checkpointers take it.
    return {"rewards": rewards, "game_info": jsonable(info, None), "game_error": None}


def _player_node(seat: int, name: str, policy: str) -> Any:
    async def move(state: GameState, config: RunnableConfig) -> dict[str, Any]:
        conversations = dict(state["conversations"])
        reply = await chat_model(config).ainvoke(conversations[name], config)
        conversations[name] = [*conversations[name], reply]
        return {"conversations": conversations}

    move.__name__ = name
    as_trained, as_frozen = trainable(name, policy=policy)(move), frozen(name, policy=policy)(move)

    async def node(state: GameState, config: RunnableConfig) -> dict[str, Any]:
        seat_trained = state.get("seat")
        run = as_trained if seat_trained is None or int(seat_trained) == seat else as_frozen
        return await run(state, config)

    node.__name__ = name
    return node
