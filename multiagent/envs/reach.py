"""Reach: a game whose difficulty is an environment parameter (protocol §19, docs/curriculum.md).

A point starts at 0 on a line; a target lies ``distance`` cells to its left or right (at random).
Actions: 0 left, 1 stay, 2 right. Reaching the target ends the episode with reward +1; after
``distance + 2`` steps without reaching it the episode is truncated with reward 0. The observation
is the target's offset and the steps left, both divided by ``SCALE``, so one policy reads every
distance.

The distance comes from the episode's environment parameters: ``reset(options={"env_params":
{"distance": d}})`` (rounded to a whole number of cells, at least 1). A uniformly random policy
reaches a near target often and a far one almost never (``random_reach_rate``), so a policy that
reaches far targets has learned; the game is small enough that a run at the far distance from the
start learns it too (docs/curriculum.md gives both figures): it shows a curriculum's mechanics.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import Env, spaces

#: Offsets and step counts are divided by this: observations stay within [-1, 1] up to this distance.
SCALE = 16.0


class Reach(Env):
    """See the module docstring."""

    metadata = {"render_modes": []}

    def __init__(self, distance: int = 2) -> None:
        self.distance = distance
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(3)
        self._offset = 0
        self._left = 0

    def _obs(self) -> np.ndarray:
        return np.array([self._offset / SCALE, self._left / SCALE], np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        params = (options or {}).get("env_params") or {}
        if "distance" in params:
            self.distance = max(1, min(int(SCALE) - 2, int(round(params["distance"]))))
        side = 1 if self.np_random.random() < 0.5 else -1
        self._offset = side * self.distance
        self._left = self.distance + 2
        return self._obs(), {"distance": self.distance}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._offset -= int(action) - 1  # moving right brings a target on the right nearer
        self._left -= 1
        reached = self._offset == 0
        return self._obs(), 1.0 if reached else 0.0, reached, (not reached and self._left == 0), {}


def random_reach_rate(distance: int, episodes: int = 2000, seed: int = 0) -> float:
    """The share of episodes a uniformly random policy reaches a target ``distance`` away."""
    env = Reach(distance)
    env.action_space.seed(seed)
    reached = 0
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        done = False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            done = terminated or truncated
        reached += reward > 0
    return reached / episodes
