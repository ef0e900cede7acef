"""A maze of rooms for hierarchical control, as a PettingZoo ParallelEnv.

The maze is ``rooms x rooms`` square rooms of ``room_size`` cells, separated by
walls with one door in the middle of each shared wall. The walker starts in
the top-left room and must enter the bottom-right room.

``mode="hierarchical"`` (the seed's hierarchical-environment pattern):

- ``high_level`` lives for the whole episode but acts only at decision steps:
  it picks a neighbouring room (up, right, down, left). Each decision spawns a
  new low-level agent ``low_level_<k>`` that lives until it enters that room
  (terminated, reward +1) or runs out of ``low_level_steps`` (truncated); its
  observation carries that goal. Then ``high_level`` decides again. A choice
  into the maze's outer wall spends the decision and spawns nothing.
- Rewards come from the env per level: ``high_level`` gets +1 when the walker
  enters the goal room (and -0.05 for choosing the outer wall); each low-level agent gets -0.01 per step and +1 when it
  reaches its room.

``mode="flat"``: one agent ``walker`` acts every step and gets +1 on entering
the goal room. Same dynamics and step budget. For ``walker`` and
``high_level`` the mean episode return is the success rate.

Observations: ``walker`` sees the offset to the goal room's centre and its
place inside its current room; a low-level agent sees the same for the first
cell of its room past the door (its goal); ``high_level`` sees its room and
the goal room.

Every live agent receives an observation each step (PettingZoo's contract);
``acting_agents()`` names the ones whose action is used now, and actions of
the others are ignored.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

MOVES = np.array([[-1, 0], [0, 1], [1, 0], [0, -1]])  # up, right, down, left
STEP_COST = 0.01
WALL_PENALTY = 0.05


class RoomsMaze(ParallelEnv):
    """See the module docstring."""

    metadata = {"name": "rooms_maze_v0", "render_modes": []}

    def __init__(self, mode: str = "hierarchical", rooms: int = 4, room_size: int = 5, max_steps: int = 200,
                 low_level_steps: int = 20) -> None:
        if mode not in ("hierarchical", "flat"):
            raise ValueError("mode must be 'hierarchical' or 'flat'")
        self.mode = mode
        self.rooms, self.room_size = rooms, room_size
        self.max_steps, self.low_level_steps = max_steps, low_level_steps
        # Every decision takes at least one env step: max_steps ids always suffice.
        self.max_decisions = max_steps
        self.size = rooms * (room_size + 1) + 1
        self.free = self._layout()
        self.possible_agents = (["walker"] if mode == "flat"
                                else ["high_level"] + [f"low_level_{k}" for k in range(self.max_decisions)])
        self.agents: list[str] = []
        self._goal_room = (rooms - 1, rooms - 1)

    def _layout(self) -> np.ndarray:
        n, s = self.size, self.room_size
        free = np.zeros((n, n), bool)
        for i in range(self.rooms):
            for j in range(self.rooms):
                r0, c0 = 1 + i * (s + 1), 1 + j * (s + 1)
                free[r0:r0 + s, c0:c0 + s] = True
                if i + 1 < self.rooms:
                    free[r0 + s, c0 + s // 2] = True  # door to the room below
                if j + 1 < self.rooms:
                    free[r0 + s // 2, c0 + s] = True  # door to the room on the right
        return free

    def room_of(self, cell: np.ndarray) -> tuple[int, int] | None:
        """The room whose interior holds ``cell``; None on a door."""
        s = self.room_size
        r, c = int(cell[0]) - 1, int(cell[1]) - 1
        if r % (s + 1) == s or c % (s + 1) == s:
            return None
        return r // (s + 1), c // (s + 1)

    def _room_center(self, room: tuple[int, int]) -> np.ndarray:
        s = self.room_size
        return np.array([1 + room[0] * (s + 1) + s // 2, 1 + room[1] * (s + 1) + s // 2])

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-float(self.rooms), float(self.rooms), (4,), np.float32)

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(4)

    # -- observations ----------------------------------------------------------

    def _toward(self, cell: np.ndarray) -> np.ndarray:
        """Offset from the walker to ``cell``, and the walker's place inside its room."""
        s = self.room_size
        inside = (self.pos - 1) % (s + 1) / s
        # Offsets in units of rooms: one cell of misalignment is 1/(s+1), easy to tell from 0.
        return np.array([(cell[0] - self.pos[0]) / (s + 1), (cell[1] - self.pos[1]) / (s + 1), inside[0], inside[1]],
                        np.float32)

    def _entry_cell(self, here: tuple[int, int], target: tuple[int, int]) -> np.ndarray:
        """The first cell inside ``target`` past the door from the neighbouring room ``here``."""
        s = self.room_size
        center = self._room_center(target)
        dr, dc = target[0] - here[0], target[1] - here[1]
        if dr:  # door in a horizontal wall: enter at the middle column of the target room's near edge
            row = 1 + target[0] * (s + 1) + (0 if dr > 0 else s - 1)
            return np.array([row, center[1]])
        col = 1 + target[1] * (s + 1) + (0 if dc > 0 else s - 1)
        return np.array([center[0], col])

    def _high_obs(self) -> np.ndarray:
        room = self.room_of(self.pos) or self._last_room
        r = self.rooms - 1 or 1
        return np.array([room[0] / r, room[1] / r, self._goal_room[0] / r, self._goal_room[1] / r], np.float32)

    def _observations(self) -> dict[str, np.ndarray]:
        out = {}
        for agent in self.agents:
            if agent == "walker":
                out[agent] = self._toward(self._room_center(self._goal_room))
            elif agent == "high_level":
                out[agent] = self._high_obs()
            else:
                out[agent] = self._toward(self._entry)
        return out

    def acting_agents(self) -> list[str]:
        """The live agents whose actions this step uses."""
        if self.mode == "flat":
            return list(self.agents)
        return ["high_level"] if self._low is None else [self._low]

    # -- dynamics --------------------------------------------------------------

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.pos = self._room_center((0, 0))
        self._last_room = (0, 0)
        self._t = 0
        self._decisions = 0
        self._low: str | None = None
        self._low_t = 0
        self._target = (0, 0)
        self._entry = self.pos
        self.agents = ["walker"] if self.mode == "flat" else ["high_level"]
        return self._observations(), {a: {} for a in self.agents}

    def _move(self, action: int) -> None:
        nxt = self.pos + MOVES[int(action)]
        if self.free[nxt[0], nxt[1]]:
            self.pos = nxt
            room = self.room_of(self.pos)
            if room is not None:
                self._last_room = room

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self._t += 1
        # The walker and the top level are paid only for reaching the goal room (their
        # return is the success rate); low-level agents pay a step cost for short paths.
        rewards = {a: -STEP_COST if a.startswith("low_level_") else 0.0 for a in self.agents}
        terminations = {a: False for a in self.agents}
        truncations = {a: False for a in self.agents}
        if self.mode == "flat":
            self._move(actions["walker"])
        elif self._low is None:
            # A decision step: pick the next room and spawn its low-level agent; nothing moves.
            direction = MOVES[int(actions["high_level"])]
            here = self.room_of(self.pos) or self._last_room
            target = (here[0] + int(direction[0]), here[1] + int(direction[1]))
            self._decisions += 1
            if 0 <= target[0] < self.rooms and 0 <= target[1] < self.rooms:
                self._target = target
                self._entry = self._entry_cell(here, target)
                self._low = f"low_level_{self._decisions - 1}"
                self._low_t = 0
                self.agents.append(self._low)
                rewards[self._low] = 0.0
                terminations[self._low] = truncations[self._low] = False
            else:  # the maze's outer wall: the decision is spent, nothing spawns
                rewards["high_level"] -= WALL_PENALTY
        else:
            low = self._low
            self._move(actions[low])
            self._low_t += 1
            if self.room_of(self.pos) == self._target:
                rewards[low] += 1.0
                terminations[low] = True
            elif self._low_t >= self.low_level_steps:
                truncations[low] = True
            if terminations[low] or truncations[low]:
                self._low = None
        reached = self.room_of(self.pos) == self._goal_room
        top = "walker" if self.mode == "flat" else "high_level"
        if reached:
            rewards[top] += 1.0
            for a in self.agents:
                terminations[a] = True
        elif self._t >= self.max_steps:
            for a in self.agents:
                if not terminations[a]:
                    truncations[a] = True
        observations = self._observations()
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        if self.mode == "hierarchical" and self._low is not None and self._low not in self.agents:
            self._low = None
        return observations, rewards, terminations, truncations, infos


def parallel_env(**kwargs: Any) -> RoomsMaze:
    return RoomsMaze(**kwargs)
