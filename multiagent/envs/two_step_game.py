"""The two-step cooperative matrix game of the QMIX paper, as a PettingZoo ParallelEnv.

Step 1: both agents see state 1; agent_0's action picks the second state
(0 -> state 2A, 1 -> state 2B); agent_1's action does not matter.
Step 2: in 2A every joint action pays 7; in 2B the joint actions (a0, a1) pay
0 for (0, 0), 1 for (0, 1) and (1, 0), and 8 for (1, 1). The episode ends.
The team reward is given to each agent as half of it, so a group of the two
earns the team total: the optimum is 8 (state 2B, both pick 1).

Observations are one-hot states (1, 2A, 2B) plus the agent's index.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

PAYOFF_2B = np.array([[0.0, 1.0], [1.0, 8.0]])


class TwoStepGame(ParallelEnv):
    """Two agents, two steps, Discrete(2) actions; see the module docstring."""

    metadata = {"name": "two_step_game_v0", "render_modes": []}

    def __init__(self, render_mode: str | None = None) -> None:
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents: list[str] = []
        self.render_mode = render_mode
        self._state = 0
        self._t = 0

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 1.0, (4,), np.float32)

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    def _obs(self) -> dict[str, np.ndarray]:
        out = {}
        for i, agent in enumerate(self.agents):
            o = np.zeros(4, np.float32)
            o[self._state] = 1.0
            o[3] = float(i)
            out[agent] = o
        return out

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents = list(self.possible_agents)
        self._state, self._t = 0, 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        a0, a1 = int(actions["agent_0"]), int(actions["agent_1"])
        if self._t == 0:
            self._state = 1 if a0 == 0 else 2
            team, done = 0.0, False
        else:
            team = 7.0 if self._state == 1 else float(PAYOFF_2B[a0, a1])
            done = True
        self._t += 1
        obs = self._obs()
        rewards = {a: team / 2 for a in self.agents}
        terminations = {a: done for a in self.agents}
        truncations = {a: False for a in self.agents}
        infos = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terminations, truncations, infos


def parallel_env(**kwargs: Any) -> TwoStepGame:
    return TwoStepGame(**kwargs)
