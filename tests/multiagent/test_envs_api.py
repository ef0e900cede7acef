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


def test_memory_cue_is_won_only_by_remembering_the_first_observation() -> None:
    """The last observation is the same whatever the cue, so no policy of the current observation
    beats chance (the memoryless ceiling); a policy that remembers the first observation always
    wins; random play scores near the ceiling. Both variants pass their API checks."""
    from gymnasium.utils.env_checker import check_env

    from tether.multiagent.envs.memory_cue import MemoryCue, MemoryCueParallel, memoryless_ceiling, random_return

    check_env(MemoryCue(3, 5), skip_render_check=True)
    parallel_api_test(MemoryCueParallel(agents=2), num_cycles=20)
    env = MemoryCue(cues=3, length=5)
    last_observations, remembered_return = set(), 0.0
    for episode in range(60):
        obs, _ = env.reset(seed=episode)
        cue, done, t = int(np.argmax(obs[:-1])), False, 0
        while not done:
            last = obs
            obs, reward, done, truncated, _ = env.step(cue)
            t += 1
            assert not truncated
        assert t == 5 and reward == 1.0
        remembered_return += reward
        last_observations.add(tuple(last))
    assert len(last_observations) == 1, "the last observation must not tell the cue"
    assert remembered_return == 60
    assert memoryless_ceiling(3) == 2 / 3 - 1
    assert abs(random_return(3000, seed=1, cues=3, length=5) - memoryless_ceiling(3)) < 0.06
    # Each agent of the parallel variant is rewarded for its own cue only.
    penv = MemoryCueParallel(agents=2, cues=2, length=3)
    obs, _ = penv.reset(seed=4)
    cues = {agent: int(np.argmax(o[:-1])) for agent, o in obs.items()}
    for _ in range(3):
        obs, rewards, terms, _, _ = penv.step({"agent_0": cues["agent_0"], "agent_1": 1 - cues["agent_1"]})
    assert rewards == {"agent_0": 1.0, "agent_1": -1.0} and all(terms.values()) and penv.agents == []
