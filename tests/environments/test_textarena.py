"""textarena games as graphs: token-exact trajectories with the game's messages at mask 0,
textarena's own rewards, each player of a two-player game credited with its own outcome,
illegal moves counted and traced under the game's rule, and games refused before they start
(unknown ids, missing corpora)."""

from __future__ import annotations

import asyncio
import random
from itertools import groupby

import pytest

import agentrl_sdk as sdk
from agentrl_sdk.environments._textarena_play import _nltk_has
from agentrl_sdk.environments.textarena import GameDataMissing, textarena
from agentrl_sdk.rollout.credit import credit_policies
from agentrl_sdk.rollout.rewards import score

ta = pytest.importorskip("textarena")

ROLLOUT = sdk.RolloutConfig(recursion_limit=60)


def _target(seed: int) -> int:
    """The number GuessTheNumber-v0 hides for ``seed`` (read from the game itself)."""
    env = ta.make("GuessTheNumber-v0")
    env.reset(num_players=1, seed=seed)
    return env.env.env.game_number


def _textarena_rewards(env_id: str, moves: list[str], seed: int, players: int):
    """textarena alone: the same moves on a fresh game; its close() rewards and game info."""
    saved = random.getstate()
    env = ta.make(env_id)
    env.reset(num_players=players, seed=seed)
    for move in moves:
        env.get_observation()
        done, _ = env.step(move)
        if done:
            break
    random.setstate(saved)
    return env.close()


def _play(game, row, engines, tokenizer, record_events=False):
    (traj,) = asyncio.run(sdk.arollout(game.graph, row, engines, tokenizer=tokenizer,
                                       config=ROLLOUT, record_events=record_events))
    assert traj.status == "ok", traj.error
    asyncio.run(score([traj], {row["id"]: row}, game.reward))
    return traj


def _runs(segment):
    pairs = zip(segment.response_ids, segment.response_mask, strict=True)
    return [(m, [t for t, _ in run]) for m, run in groupby(pairs, key=lambda p: p[1])]


def test_a_game_is_token_exact_with_the_games_messages_at_mask_0(qwen_tokenizer, scripted):
    game = textarena("GuessTheNumber-v0", seeds=[3], eval_seeds=[4])
    target = _target(3)
    low = 1 if target != 1 else 2
    moves = [f"I guess [{low}]", f"[{target}]"]
    engine = scripted(qwen_tokenizer, list(moves))
    traj = _play(game, game.rows[0], engine, qwen_tokenizer)

    assert traj.final_state["moves"] == moves and len(traj.calls) == 2
    (seg,) = traj.segments  # one conversation: the second call extends the first
    assert seg.node == "player" and seg.trained
    # Every mask-1 token is one the engine generated, call after call, and nothing else is.
    assert seg.generated_ids == [t for call in traj.calls for t in call.response_ids]
    for call in traj.calls:
        assert (seg.prompt_ids + seg.response_ids)[: len(call.prompt_ids)] == call.prompt_ids
    # The game's hint between the two moves is an observation: mask 0, never trained.
    observed = [qwen_tokenizer.decode(ids) for mask, ids in _runs(seg) if mask == 0]
    hint = "lower" if low > target else "higher"
    assert len(observed) == 1 and f"The target number is {hint}." in observed[0]
    assert "You are playing Guess The Number" in qwen_tokenizer.decode(seg.prompt_ids)
    assert traj.reward == 1.0 and traj.final_state["rewards"] == {"player": 1.0}


@pytest.mark.parametrize("seed", [0, 7])
def test_the_reward_is_textarenas_own_for_the_same_moves(qwen_tokenizer, scripted, seed):
    """A lost game (wrong guesses until the game's turn limit) scores textarena's closeness,
    not a win/loss of ours."""
    target = _target(seed)
    wrong = [f"[{n}]" for n in range(20, 0, -1) if n != target]
    game = textarena("GuessTheNumber-v0", seeds=[seed], eval_seeds=[99])
    traj = _play(game, game.rows[0], scripted(qwen_tokenizer, list(wrong)), qwen_tokenizer)
    moves = traj.final_state["moves"]
    assert moves == wrong[: len(moves)] and len(moves) < len(wrong)  # the game ended it
    rewards, info = _textarena_rewards("GuessTheNumber-v0", moves, seed, 1)
    assert traj.final_state["done"] and not traj.final_state["truncated"]
    assert traj.reward == pytest.approx(rewards[0]) and 0 < traj.reward < 1
    assert traj.final_state["game_info"]["player"]["reason"] == info[0]["reason"]
    assert [c.name for c in traj.components] == ["outcome"]


X_WINS = ["[0]", "[3]", "[1]", "[4]", "[2]"]  # player 0 completes the top row on move 5


def test_two_policies_each_earn_their_own_players_outcome(qwen_tokenizer, scripted):
    game = textarena("TicTacToe-v0", policies=["x", "o"], seeds=[1], eval_seeds=[2])
    assert game.players == ("player_0", "player_1") and not game.self_play
    engines = {"x": scripted(qwen_tokenizer, X_WINS[0::2]),
               "o": scripted(qwen_tokenizer, X_WINS[1::2])}
    traj = _play(game, game.rows[0], engines, qwen_tokenizer)
    rewards, _ = _textarena_rewards("TicTacToe-v0", X_WINS, 1, 2)
    assert rewards == {0: 1, 1: -1}
    assert traj.final_state["rewards"] == {"player_0": 1.0, "player_1": -1.0}
    assert {s.node: s.policy for s in traj.segments} == {"player_0": "x", "player_1": "o"}
    assert traj.rewards == {"player_0": 1.0, "player_1": -1.0}  # reward/<player> metrics
    credit = {c.policy: c.reward for c in credit_policies([traj])}
    assert credit == {"x": 1.0, "o": -1.0}
    # Each player sees the other's move as an observation of its own conversation.
    assert "[Player 0] [0]" in traj.final_state["conversations"]["player_1"][1].content


def test_self_play_trains_one_seat_per_row_on_that_seats_outcome(qwen_tokenizer, scripted):
    game = textarena("TicTacToe-v0", seeds=[1], eval_seeds=[2])
    assert game.self_play and [r["seat"] for r in game.rows] == [0, 1]
    for row, earned in zip(game.rows, [1.0, -1.0], strict=True):
        traj = _play(game, row, scripted(qwen_tokenizer, list(X_WINS)), qwen_tokenizer)
        trained = {s.node for s in traj.segments if s.trained}
        frozen = {s.node for s in traj.segments if not s.trained}
        assert trained == {game.players[row["seat"]]} and frozen == set(game.players) - trained
        (credit,) = credit_policies([traj])
        assert credit.policy == "default" and credit.reward == earned


def test_an_illegal_move_follows_the_games_rule_and_is_counted_and_traced(qwen_tokenizer,
                                                                          scripted):
    game = textarena("GuessTheNumber-v0", seeds=[5], eval_seeds=[6])
    moves = ["no idea", "still no idea"]  # GuessTheNumber allows one retry, then ends the game
    traj = _play(game, game.rows[0], scripted(qwen_tokenizer, list(moves)), qwen_tokenizer,
                 record_events=True)
    illegal = traj.final_state["illegal_moves"]
    assert [(m["move"], m["player"], m["ended_game"]) for m in illegal] == [
        (0, 0, False), (1, 0, True)]
    assert all("Invalid move format" in m["reason"] for m in illegal)
    assert traj.metrics["textarena/illegal_moves"] == 2.0
    rewards, info = _textarena_rewards("GuessTheNumber-v0", moves, 5, 1)
    assert traj.reward == rewards[0] and info[0]["invalid_move"]
    assert traj.final_state["game_info"]["player"]["invalid_move"] is True
    # The game's retry message reached the player as an observation...
    assert "attempted an invalid move" in traj.final_state["conversations"]["player"][3].content
    # ...and the trace's game-node spans carry the invalid moves.
    outputs = [e.outputs for e in traj.events if e.kind == "node" and e.name == "game"]
    assert any(o and o.get("illegal_moves") for o in outputs)


def test_a_game_past_max_turns_ends_truncated_and_scores_zero(qwen_tokenizer, scripted):
    game = textarena("GuessTheNumber-v0", seeds=[2], eval_seeds=[3], max_turns=2)
    target = _target(2)
    moves = [f"[{n}]" for n in range(1, 21) if n != target][:2]
    traj = _play(game, game.rows[0], scripted(qwen_tokenizer, list(moves)), qwen_tokenizer)
    assert traj.final_state["truncated"] and traj.final_state["rewards"] is None
    assert traj.reward == 0.0 and traj.metrics["textarena/truncated"] == 1.0
    assert game.recursion_limit == 2 * 2 + 4


def test_a_game_without_its_corpus_is_refused_and_nothing_is_downloaded(monkeypatch):
    nltk = pytest.importorskip("nltk")
    if _nltk_has("words"):
        pytest.skip("the nltk words corpus is installed here")
    calls = []
    monkeypatch.setattr(nltk.downloader.Downloader, "download",
                        lambda self, *a, **k: calls.append(a))
    with pytest.raises(GameDataMissing, match=r"'Hangman-v0' needs nltk data .*words.*"
                                              r"Nothing is downloaded"):
        textarena("Hangman-v0")
    assert calls == []
    assert nltk.download is not None and nltk.download.__name__ != "refuse"  # restored


def test_an_unknown_game_is_refused_with_close_matches():
    with pytest.raises(ValueError, match=r"unknown textarena game 'TicTacTo-v0'.*close matches:"
                                         r" TicTacToe-v0"):
        textarena("TicTacTo-v0")


def test_held_out_seeds_are_never_training_seeds_and_rows_name_their_game():
    with pytest.raises(ValueError, match="held-out seeds must not be trained on"):
        textarena("GuessTheNumber-v0", seeds=range(10), eval_seeds=range(5, 15))
    game = textarena("GuessTheNumber-v0", seeds=range(3), eval_seeds=range(10, 12))
    assert [r["id"] for r in game.eval_rows] == ["GuessTheNumber-v0/seed=10",
                                                 "GuessTheNumber-v0/seed=11"]
    assert {r["seed"] for r in game.rows}.isdisjoint(r["seed"] for r in game.eval_rows)
    with pytest.raises(ValueError, match="2 players but 3 policies"):
        textarena("TicTacToe-v0", policies=["a", "b", "c"])


def test_replays_leave_the_process_random_state_alone():
    random.seed(1234)
    expected = random.random()
    random.seed(1234)
    textarena("GuessTheNumber-v0", seeds=[9], eval_seeds=[10])
    assert random.random() == expected


def test_a_player_count_the_game_refuses_is_a_clear_error():
    with pytest.raises(ValueError, match="TicTacToe-v0 does not play with 3 players"):
        textarena("TicTacToe-v0", players=3)
    assert textarena("GuessTheNumber-v0", players=["guesser"]).players == ("guesser",)
