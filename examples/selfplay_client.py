"""Two-player board games by self-play: PettingZoo's tictactoe_v3 or connect_four_v3, both seats played
through one multi-agent client, the server deciding per game which seat learns and which snapshot of
the policy plays the other (docs/self_play.md). The engine loop is the plain one of
multiagent.pettingzoo_adapter.run_aec_env: nothing in it knows about self-play. When the server's
environment parameters hold ``opening_moves`` (tictactoe_selfplay.toml draws 0 to 6 per game), a game
starts after that many random moves (``RandomOpenings``).

    tether serve --config examples/configs/tictactoe_selfplay.toml
    python examples/selfplay_client.py --game tictactoe_v3

Without a server, ``--evaluate POLICY`` plays a trained policy.onnx (greedy, legal moves only: the
model masks them) against an opponent in both seats, half the games each, and prints one JSON line
with its wins, losses and draws::

    python examples/selfplay_client.py --game tictactoe_v3 --evaluate runs/tether/policy-player.onnx \\
        --opponent random --games 1000

``--opponent`` is ``random`` (uniform over legal moves) or ``lookahead`` (wins at once when it can,
blocks the other side's immediate win, else random). ``--evaluate random``
measures a random player the same way (the baseline).
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
from pettingzoo.utils.wrappers import BaseWrapper

from tether.multiagent.pettingzoo_adapter import run_aec_env
from tether.protocol.spaces import flatten_observation, from_gymnasium
from tether.sdk import MultiAgentClient, OnnxPolicy, TetherConnectionError

GAMES = ("tictactoe_v3", "connect_four_v3")


def make_env(game: str) -> Any:
    return importlib.import_module(f"pettingzoo.classic.{game}").env()


#: The most opening moves: a few empty cells always remain for the players.
_MOST_OPENING_MOVES = {"tictactoe_v3": 6, "connect_four_v3": 12}


class RandomOpenings(BaseWrapper):
    """A game that starts from a random position: when the episode's environment parameters (protocol
    §19, docs/curriculum.md) hold ``opening_moves``, reset plays that many random legal moves (the
    game's, not a player's: nobody acts for them and nothing is recorded) before the players take over,
    never one that completes a line: the game is still on when they do. Self-play alone meets only the
    positions its own policies reach; random openings are the usual way to show it the others
    (exploring starts), so that a random opponent's odd moves find no gap."""

    def __init__(self, env: Any, game: str, seed: int) -> None:
        super().__init__(env)
        self._most = _MOST_OPENING_MOVES[game]
        self._game = game
        self._rng = np.random.default_rng(seed)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        super().reset(seed=seed, options=options)
        if seed is not None:  # (a seeded reset plays the same opening again)
            self._rng = np.random.default_rng(seed)
        wanted = ((options or {}).get("env_params") or {}).get("opening_moves", 0)
        for _ in range(min(max(int(wanted), 0), self._most)):  # (a sampler's real value: its whole part)
            legal = np.flatnonzero(self.env.observe(self.env.agent_selection)["action_mask"])
            quiet = sorted(set(int(m) for m in legal) - set(_line_moves(self.env, self._game, own=True)))
            if not quiet:
                break
            self.env.step(int(self._rng.choice(quiet)))


def train(args: argparse.Namespace) -> None:
    """Play games until the server says training is done (or goes away)."""
    env = RandomOpenings(make_env(args.game), args.game, args.seed)
    client = MultiAgentClient(args.host, args.port, client_name=f"{args.game}-selfplay-{args.seed}", seed=args.seed,
                              reconnect_timeout_s=5)
    try:
        while client.training_done is None:
            run_aec_env(client, env, max_episodes=100, seed=None)
        client.flush()
    except (TetherConnectionError, KeyboardInterrupt):
        pass  # training finished and the server went away
    finally:
        client.close()


#: Tic-tac-toe's lines, as cells 0-8 of the flattened board (an action is its cell).
_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


def _line_moves(env: Any, game: str, own: bool) -> list[int]:
    """The legal moves that would complete a line now: for the side to move (``own``), else for the other."""
    legal = np.flatnonzero(env.observe(env.agent_selection)["action_mask"])
    if game == "tictactoe_v3":
        marks = env.observe(env.agent_selection)["observation"][:, :, 0 if own else 1].reshape(9)
        return [int(cell) for cell in legal
                if any(cell in line and sum(marks[c] for c in line if c != cell) == 2 for line in _LINES)]
    board = np.asarray(env.unwrapped.board).reshape(6, 7)
    me = env.unwrapped.agents.index(env.agent_selection) + 1
    player = me if own else 3 - me
    return [int(column) for column in legal
            if _makes_four(board, max(r for r in range(6) if board[r, column] == 0), int(column), player)]


def _lookahead_move(env: Any, game: str, rng: np.random.Generator) -> int:
    """A move that wins now, else one that blocks the other side's win now, else a random legal one."""
    for own in (True, False):
        moves = _line_moves(env, game, own)
        if moves:
            return moves[0]
    return int(rng.choice(np.flatnonzero(env.observe(env.agent_selection)["action_mask"])))


def _makes_four(board: np.ndarray, row: int, column: int, player: int) -> bool:
    """Whether ``player``'s piece at (row, column) would complete a line of four through that cell."""
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        count = 1
        for sign in (1, -1):
            r, c = row + sign * dr, column + sign * dc
            while 0 <= r < 6 and 0 <= c < 7 and board[r, c] == player:
                count += 1
                r, c = r + sign * dr, c + sign * dc
        if count >= 4:
            return True
    return False


def evaluate(game: str, policy_path: str, opponent: str, games: int, seed: int) -> dict[str, Any]:
    """``policy_path`` (greedy) or "random" against ``opponent`` in both seats, half the games each."""
    env = make_env(game)
    rng = np.random.default_rng(seed)
    space = from_gymnasium(env.observation_space(env.possible_agents[0]))
    policy = None if policy_path == "random" else OnnxPolicy(
        Path(policy_path).read_bytes(), from_gymnasium(env.action_space(env.possible_agents[0])),
        observation_space=space, seed=seed)

    def random_move(_: Any) -> int:
        return int(rng.choice(np.flatnonzero(env.observe(env.agent_selection)["action_mask"])))

    def policy_move(observation: Any) -> int:
        return int(policy.act_deterministic(flatten_observation(space, observation)))  # type: ignore[union-attr]

    mine: Callable[[Any], int] = random_move if policy is None else policy_move
    theirs: Callable[[Any], int] = random_move if opponent == "random" else (
        lambda _: _lookahead_move(env, game, rng))
    wins = losses = draws = illegal = 0
    for index in range(games):
        env.reset(seed=seed + index)
        seat = env.possible_agents[index % 2]
        result = 0.0
        for agent in env.agent_iter():
            observation, reward, terminated, truncated, _ = env.last()
            if terminated or truncated:
                if agent == seat:
                    result = reward  # (the game's outcome for the seat: +1, -1 or 0)
                env.step(None)
                continue
            move = mine(observation) if agent == seat else theirs(observation)
            if agent == seat and not observation["action_mask"][move]:
                illegal += 1
            env.step(move)
        wins += result > 0
        losses += result < 0
        draws += result == 0
    return {"games": games, "wins": int(wins), "losses": int(losses), "draws": int(draws),
            "illegal_moves": illegal, "win_rate": wins / games, "opponent": opponent}


def exact_against_random(game: str, policy_path: str) -> dict[str, Any]:
    """The greedy policy's (or "random": a random player's) exact chances against a uniformly random legal
    player, per seat: every game the random side can play is enumerated (tic-tac-toe only: connect four's tree is far too large), so a
    loss chance of 0 means no game at all is lost, not merely none among those sampled."""
    if game != "tictactoe_v3":
        raise SystemExit(f"--exact enumerates tic-tac-toe only, not {game}")
    env = make_env(game)
    space = from_gymnasium(env.observation_space(env.possible_agents[0]))
    policy = None if policy_path == "random" else OnnxPolicy(
        Path(policy_path).read_bytes(), from_gymnasium(env.action_space(env.possible_agents[0])),
        observation_space=space)
    known: dict[tuple[str, str, bytes], tuple[float, float]] = {}  # (a board is met by many move orders)

    def chances(moves: list[int], seat: str) -> tuple[float, float]:
        env.reset(seed=0)
        for move in moves:  # (replayed: PettingZoo's envs cannot be copied cheaply)
            env.step(move)
        observation, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            outcome = env.rewards[seat]
            return float(outcome > 0), float(outcome < 0)
        key = (seat, env.agent_selection, np.asarray(observation["observation"]).tobytes())
        if key not in known:
            if env.agent_selection == seat and policy is not None:
                known[key] = chances(moves + [int(policy.act_deterministic(flatten_observation(space, observation)))],
                                     seat)
            else:
                legal = [int(a) for a in np.flatnonzero(observation["action_mask"])]
                outcomes = [chances(moves + [a], seat) for a in legal]
                known[key] = (sum(w for w, _ in outcomes) / len(legal), sum(l for _, l in outcomes) / len(legal))
        return known[key]

    seats = {}
    for seat in env.possible_agents:
        win, loss = chances([], seat)
        seats[seat] = {"win": win, "loss": loss, "draw": 1.0 - win - loss}
    return {"opponent": "random", "seats": seats, "loss": sum(s["loss"] for s in seats.values()) / len(seats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", choices=GAMES, default="tictactoe_v3")
    parser.add_argument("--host", default="127.0.0.1", help="server address")
    parser.add_argument("--port", type=int, default=5555, help="server port")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (and the evaluation's game seed)")
    parser.add_argument("--evaluate", metavar="POLICY", help="no server: play a policy.onnx (or 'random') and print "
                                                             "its results as JSON")
    parser.add_argument("--opponent", choices=("random", "lookahead"), default="random")
    parser.add_argument("--games", type=int, default=1000, help="games for --evaluate")
    parser.add_argument("--exact", action="store_true", help="with --evaluate on tic-tac-toe: the exact chances "
                                                             "against a random player, every game enumerated")
    parser.add_argument("--print-space", action="store_true", help="print the game's observation space as JSON")
    args = parser.parse_args()
    if args.print_space:
        env = make_env(args.game)
        print(json.dumps(from_gymnasium(env.observation_space(env.possible_agents[0])).to_json()))
        return
    if args.evaluate and args.exact:
        print(json.dumps(exact_against_random(args.game, args.evaluate)))
        return
    if args.evaluate:
        print(json.dumps(evaluate(args.game, args.evaluate, args.opponent, args.games, args.seed)))
        return
    train(args)


if __name__ == "__main__":
    main()
