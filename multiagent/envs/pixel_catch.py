"""Catch, seen only through pixels: a gymnasium env whose observation is an image.

A ball falls from a random column of the top row, one row per step; a paddle moves along the bottom
row (actions: 0 left, 1 stay, 2 right). When the ball reaches the bottom the episode ends with reward
+1 if the paddle is under it, -1 if not. The observation is a ``size x size x 1`` uint8 image (ball
255, paddle 128, the rest 0): a byte box (protocol 1.4), HWC as an engine's camera produces it. Nothing
but the image tells the policy where the ball and paddle are, so a policy that learns to catch reads it.

With ``composite=True`` the observation is a Dict (protocol 1.4, §8.6) of a ``camera`` that shows
only the ball and a ``paddle`` vector (the paddle's column, one-hot): a camera plus a
vector, as an engine's agent often sees its world. Neither leaf alone tells where to move.

A uniformly random policy catches about an eighth of the balls on the default 8x8 board (0.12,
measured by ``random_catch_rate``); a policy that follows the ball catches every one (the paddle moves one column
per step and the ball needs ``size - 1`` steps, enough to cross the board).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import Env, spaces

BALL = 255
PADDLE = 128


class PixelCatch(Env):
    """See the module docstring."""

    metadata = {"render_modes": []}

    def __init__(self, size: int = 8, composite: bool = False) -> None:
        self.size = size
        self.composite = composite
        camera = spaces.Box(0, 255, (size, size, 1), np.uint8)
        self.observation_space = (spaces.Dict({"camera": camera, "paddle": spaces.Box(0, 1, (size,), np.float32)})
                                  if composite else camera)
        self.action_space = spaces.Discrete(3)
        self._ball = np.zeros(2, int)
        self._paddle = 0

    def _image(self) -> Any:
        image = np.zeros((self.size, self.size, 1), np.uint8)
        if not self.composite:
            image[self.size - 1, self._paddle, 0] = PADDLE
        image[self._ball[0], self._ball[1], 0] = BALL
        if self.composite:
            return {"camera": image, "paddle": np.eye(self.size, dtype=np.float32)[self._paddle]}
        return image

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._ball = np.array([0, self.np_random.integers(self.size)])
        self._paddle = int(self.np_random.integers(self.size))
        return self._image(), {}

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict]:
        self._paddle = int(np.clip(self._paddle + int(action) - 1, 0, self.size - 1))
        self._ball[0] += 1
        done = self._ball[0] == self.size - 1
        reward = (1.0 if self._paddle == self._ball[1] else -1.0) if done else 0.0
        return self._image(), reward, bool(done), False, {}


def random_catch_rate(episodes: int = 1000, seed: int = 0, size: int = 8) -> float:
    """The share of balls a uniformly random policy catches."""
    env = PixelCatch(size)
    env.action_space.seed(seed)
    caught = 0
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        done, reward = False, 0.0
        while not done:
            _, reward, done, _, _ = env.step(env.action_space.sample())
        caught += reward > 0
    return caught / episodes
