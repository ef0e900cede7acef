"""A two-player PettingZoo classic game (tictactoe_v3, connect_four_v3) as a one-player env: the
other seat plays uniformly random legal moves, inside the env, as an engine's scripted opponent.

The learner's observation is the game's own Dict (``observation`` and ``action_mask``), so a module
whose observation space is that Dict masks its moves (§11.6 of docs/protocol.md). The env counts the
learner's illegal moves (a masked policy makes none) and the games' outcomes.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np


class VersusRandom:
    """gymnasium's reset/step over an AEC game in which ``seat`` learns and the other seat is random."""

    def __init__(self, game: str = "tictactoe_v3", seat: str = "player_1", seed: int | None = None) -> None:
        self.env = importlib.import_module(f"pettingzoo.classic.{game}").env()
        self.seat = seat
        self.rng = np.random.default_rng(seed)
        self._seed = seed
        #: Counters over every game played: the learner's illegal moves, wins, losses and draws.
        self.illegal_moves = 0
        self.wins = self.losses = self.draws = 0

    @property
    def observation_space(self) -> Any:
        return self.env.observation_space(self.seat)

    @property
    def action_space(self) -> Any:
        return self.env.action_space(self.seat)

    @property
    def games(self) -> int:
        return self.wins + self.losses + self.draws

    def _opponent_moves(self) -> None:
        """Random legal moves until it is the learner's turn or the game is over."""
        while self.env.agent_selection != self.seat and not self._over():
            observation = self.env.observe(self.env.agent_selection)
            legal = np.flatnonzero(observation["action_mask"])
            self.env.step(int(self.rng.choice(legal)))

    def _over(self) -> bool:
        return any(self.env.terminations.values()) or any(self.env.truncations.values())

    def reset(self, seed: int | None = None) -> tuple[dict[str, np.ndarray], dict]:
        self.env.reset(seed=seed if seed is not None else self._seed)
        self._seed = None
        self._opponent_moves()
        return self.env.observe(self.seat), {}

    def step(self, action: int) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        if not self.env.observe(self.seat)["action_mask"][int(action)]:
            self.illegal_moves += 1
        self.env.step(int(action))
        self._opponent_moves()
        over = self._over()
        reward = float(self.env._cumulative_rewards.get(self.seat, 0.0)) if over else 0.0
        if over:
            self.wins += reward > 0
            self.losses += reward < 0
            self.draws += reward == 0
        return self.env.observe(self.seat), reward, over, False, {}


def random_win_rate(game: str = "tictactoe_v3", games: int = 1000, seed: int = 0) -> float:
    """The learner's seat's win rate when it plays random legal moves too (the baseline)."""
    env = VersusRandom(game, seed=seed)
    rng = np.random.default_rng(seed + 1)
    for _ in range(games):
        obs, _ = env.reset()
        while True:
            obs, _, done, _, _ = env.step(int(rng.choice(np.flatnonzero(obs["action_mask"]))))
            if done:
                break
    return env.wins / env.games
