"""Remember the cue: a game only a policy with memory can win, for recurrent policies.

At the first step the observation shows one of ``cues`` cues (one-hot); at every later step the cue
part is all zeros. The episode lasts ``length`` steps; only the action of the last one counts: +1 if
it names the cue shown at the start, -1 otherwise (every earlier action is ignored, reward 0). The
observation's last value is the time left, ``(length - 1 - t) / (length - 1)``, so a policy knows when
the last step comes without counting.

The ceiling of a memoryless policy is chance: the last observation is the same whatever the cue (zeros
and time 0), so any policy of the current observation alone names the right cue with probability
``1 / cues`` (expected return ``2 / cues - 1``), while a policy that remembers the first observation wins
every episode (+1). ``memoryless_ceiling`` gives that figure; ``random_return`` measures random play.

``MemoryCueParallel`` is the multi-agent variant (a PettingZoo ParallelEnv): each agent sees its own
cue, so each must remember its own.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from gymnasium import Env, spaces
from pettingzoo import ParallelEnv


class MemoryCue(Env):
    """See the module docstring."""

    metadata = {"render_modes": []}

    def __init__(self, cues: int = 2, length: int = 6) -> None:
        if cues < 2 or length < 2:
            raise ValueError("MemoryCue needs at least 2 cues and 2 steps")
        self.cues = cues
        self.length = length
        self.observation_space = spaces.Box(0.0, 1.0, (cues + 1,), np.float32)
        self.action_space = spaces.Discrete(cues)
        self._cue = 0
        self._t = 0

    def _observation(self) -> np.ndarray:
        obs = np.zeros(self.cues + 1, np.float32)
        if self._t == 0:
            obs[self._cue] = 1.0
        obs[-1] = (self.length - 1 - self._t) / (self.length - 1)
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._cue = int(self.np_random.integers(self.cues))
        self._t = 0
        return self._observation(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        last = self._t == self.length - 1
        reward = (1.0 if int(action) == self._cue else -1.0) if last else 0.0
        self._t = min(self._t + 1, self.length - 1)
        return self._observation(), reward, last, False, {}


def memoryless_ceiling(cues: int = 2) -> float:
    """The best expected return of a policy of the current observation alone: chance at the last step."""
    return 2.0 / cues - 1.0


def random_return(episodes: int = 1000, seed: int = 0, cues: int = 2, length: int = 6) -> float:
    """Mean return of a uniformly random policy."""
    env = MemoryCue(cues, length)
    env.action_space.seed(seed)
    total = 0.0
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        done = False
        while not done:
            _, reward, done, _, _ = env.step(env.action_space.sample())
            total += reward
    return total / episodes


class MemoryCueParallel(ParallelEnv):
    """The multi-agent variant (a PettingZoo ParallelEnv): each of ``agents`` agents plays its own
    MemoryCue, all in lock step; each must remember its own cue."""

    metadata = {"name": "memory_cue_v0", "render_modes": []}

    def __init__(self, agents: int = 2, cues: int = 2, length: int = 6, render_mode: str | None = None) -> None:
        self.possible_agents = [f"agent_{i}" for i in range(agents)]
        self.agents: list[str] = []
        self.render_mode = render_mode
        self._games = {agent: MemoryCue(cues, length) for agent in self.possible_agents}

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent: str) -> spaces.Box:
        return self._games[agent].observation_space

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent: str) -> spaces.Discrete:
        return self._games[agent].action_space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents = list(self.possible_agents)
        obs = {}
        for i, agent in enumerate(self.agents):
            obs[agent], _ = self._games[agent].reset(seed=None if seed is None else seed * len(self.agents) + i)
        return obs, {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        obs, rewards, terminations = {}, {}, {}
        for agent in self.agents:
            obs[agent], rewards[agent], terminations[agent], _, _ = self._games[agent].step(actions[agent])
        truncations = {agent: False for agent in self.agents}
        infos: dict[str, dict] = {agent: {} for agent in self.agents}
        if all(terminations.values()):
            self.agents = []
        return obs, rewards, terminations, truncations, infos
