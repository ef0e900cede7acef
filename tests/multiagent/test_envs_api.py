"""Example envs written for Tether are real PettingZoo envs: PettingZoo's own checks pass."""

from __future__ import annotations

import numpy as np
from pettingzoo.test import parallel_api_test

from tether.multiagent.envs.two_step_game import TwoStepGame


def test_two_step_game_passes_parallel_api_test() -> None:
    parallel_api_test(TwoStepGame(), num_cycles=10)


def test_two_step_game_payoffs() -> None:
    def play(first: int, second: tuple[int, int]) -> float:
        env = TwoStepGame()
        env.reset()
        _, r1, _, _, _ = env.step({"agent_0": first, "agent_1": 0})
        _, r2, term, _, _ = env.step({"agent_0": second[0], "agent_1": second[1]})
        assert all(term.values())
        return sum(r1.values()) + sum(r2.values())

    assert [play(0, (a, b)) for a in (0, 1) for b in (0, 1)] == [7.0] * 4
    assert [play(1, (a, b)) for a in (0, 1) for b in (0, 1)] == [0.0, 1.0, 1.0, 8.0]
    env = TwoStepGame()
    obs, _ = env.reset()
    assert np.array_equal(obs["agent_1"], [1, 0, 0, 1])


def test_rooms_maze_passes_parallel_api_test_in_both_modes() -> None:
    from tether.multiagent.envs.rooms_maze import RoomsMaze

    for mode in ("hierarchical", "flat"):
        parallel_api_test(RoomsMaze(mode=mode), num_cycles=400)


def test_rooms_maze_hierarchy_spawns_and_retires_low_level_agents() -> None:
    from tether.multiagent.envs.rooms_maze import RoomsMaze

    env = RoomsMaze()
    obs, _ = env.reset()
    assert env.acting_agents() == ["high_level"]
    obs, rewards, terms, truncs, _ = env.step({"high_level": 1})  # go right: spawns low_level_0
    assert env.agents == ["high_level", "low_level_0"] and env.acting_agents() == ["low_level_0"]
    # Walk right along the middle row: through the door into the room on the right.
    for _ in range(4):
        obs, rewards, terms, truncs, _ = env.step({"high_level": 0, "low_level_0": 1})
    assert terms["low_level_0"] and rewards["low_level_0"] > 0.9
    assert env.agents == ["high_level"] and env.acting_agents() == ["high_level"]
    env.step({"high_level": 0})  # up: the maze's outer wall, nothing spawns
    assert env.agents == ["high_level"]
