"""Bad demonstration datasets on the server side (protocol 1.6 §18, docs/demonstrations.md): one whose
action space differs from the module's, a corrupt Minari file, pretraining a module with memory; each a
clear error naming what is wrong. And the learner's bookkeeping of a dataset's cloning term across
rolled-back trial updates; logged flags through the pool journal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tether.protocol.episodes import EpisodeChunk
from tether.protocol.multi_agent import ModuleSpec
from tether.protocol.spaces import Discrete, box
from tether.sdk.demonstrations import DemoWriter
from tether.server.config import ConfigError, ServerConfig
from tether.server.learner import PPOHyperparams, PPOLearner
from tether.server.learner.rollout_batch import build_batch
from tether.server.module_runtime import demonstration_episodes
from tether.server.pool_journal import JournalEntry, decode_entries, encode_entry
from tether.server.pretrain import pretrain
from tether.server.sample_pool import Pooled, split_chunk

CARTPOLE_OBS = {"type": "Box", "shape": [4], "low": -10.0, "high": 10.0}


def write_demos(path: Path, obs_space, act_space, action) -> Path:
    rng = np.random.default_rng(0)
    with DemoWriter(path, {"default_policy": (obs_space, act_space)}) as writer:
        for e in range(2):
            for t in range(6):
                writer.step(f"e{e}", "default_agent", "default_policy", rng.uniform(-1, 1, obs_space.shape), action,
                            logged=True)
                writer.add_reward(f"e{e}", "default_agent", 1.0)
            writer.end(f"e{e}", "default_agent", np.zeros(obs_space.shape), terminated=True)
    return path


def test_a_dataset_whose_action_space_differs_is_refused_by_name(tmp_path: Path) -> None:
    path = write_demos(tmp_path / "d.jsonl", box(-1, 1, (3,)), Discrete(3), 2)
    module = ModuleSpec("default_policy", box(-1, 1, (3,)), Discrete(2))
    with pytest.raises(ConfigError) as info:
        demonstration_episodes(str(path), "default_policy", module)
    assert "action_space" in str(info.value) and "default_policy" in str(info.value)
    same = ModuleSpec("default_policy", box(-1, 1, (3,)), Discrete(3))
    episodes = demonstration_episodes(str(path), "default_policy", same)
    assert sum(e.env_steps for e in episodes) == 12 and all(e.actions.tolist() == [2] * e.env_steps for e in episodes)


def test_a_corrupt_minari_file_is_refused_by_name(tmp_path: Path) -> None:
    from tether.protocol.demonstrations import read_demonstrations
    from tether.server.minari_datasets import write_minari

    demos = read_demonstrations(write_demos(tmp_path / "d.jsonl", box(-1, 1, (3,)), Discrete(3), 1))
    folder = write_minari(demos, "default_policy", tmp_path / "minari")
    module = ModuleSpec("default_policy", box(-1, 1, (3,)), Discrete(3))
    assert sum(e.env_steps for e in demonstration_episodes(str(folder), "default_policy", module)) == 12
    (hdf5,) = folder.glob("**/*.hdf5")
    data = hdf5.read_bytes()
    hdf5.write_bytes(data[: len(data) // 2])  # a copy cut short
    with pytest.raises(ConfigError, match="cannot read"):
        demonstration_episodes(str(folder), "default_policy", module)
    hdf5.write_bytes(b"not hdf5 " * 50)
    with pytest.raises(ConfigError, match="cannot read"):
        demonstration_episodes(str(folder), "default_policy", module)


def test_pretraining_a_module_with_memory_and_a_centralized_critic_is_a_clear_error(tmp_path: Path) -> None:
    path = write_demos(tmp_path / "d.jsonl", box(-10, 10, (4,)), Discrete(2), 1)
    module = {"observation_space": CARTPOLE_OBS, "action_space": {"type": "Discrete", "n": 2},
              "value_obs_agents": ["a", "b"], "model": {"recurrent": {"type": "gru", "size": 8}}}
    config = ServerConfig(tensorboard=False, logdir=str(tmp_path), quiet=True, modules={"default_policy": module},
                          policy_mapping=[{"pattern": "*", "module": "default_policy"}])
    with pytest.raises(ConfigError, match="centralized critic"):
        pretrain(config, path, tmp_path / "out.pt", epochs=1)
    assert not (tmp_path / "out.pt").exists()


def test_a_rolled_back_update_leaves_the_dataset_coefficients_decay_as_it_was() -> None:
    """The isolation trials (learner/isolation.py) roll updates back with save_state/load_state: the
    demonstration term's decay must not count them."""
    learner = PPOLearner(box(-1, 1, (3,)), Discrete(2), PPOHyperparams(num_epochs=1, minibatch_size=16, demo_coef=1.0,
                                                                        demo_decay_updates=10), seed=0)
    learner.set_demonstrations([EpisodeChunk(obs=np.zeros((9, 3), np.float32), actions=np.zeros(8, np.int64),
                                             rewards=np.zeros(8, np.float32), action_logp=None,
                                             action_dist_inputs=None, is_terminated=True, is_truncated=False)])
    rng = np.random.default_rng(0)
    chunk = EpisodeChunk(obs=rng.uniform(-1, 1, (17, 3)).astype(np.float32), actions=rng.integers(0, 2, 16),
                         rewards=np.ones(16, np.float32), action_logp=None, action_dist_inputs=None,
                         is_terminated=True, is_truncated=False)
    saved = learner.save_state()
    learner.update(build_batch([chunk]))
    assert learner.demo_updates == 1
    learner.load_state(saved)
    assert learner.demo_updates == 0 and learner.demo_coef_now() == 1.0


def test_logged_flags_round_trip_through_the_pool_journal() -> None:
    chunk = EpisodeChunk(obs=np.zeros((5, 2), np.float32), actions=np.array([0, 1, 0, 1]),
                         rewards=np.zeros(4, np.float32), action_logp=None, action_dist_inputs=None,
                         is_terminated=True, is_truncated=False, logged=np.array([True, False, True, True]))
    head, tail = split_chunk(chunk, 1)
    plain = EpisodeChunk(obs=np.zeros((2, 2), np.float32), actions=np.array([0]), rewards=np.zeros(1, np.float32),
                         action_logp=None, action_dist_inputs=None, is_terminated=True, is_truncated=False)
    entry = JournalEntry(None, [Pooled("m", c, 0, "s") for c in (chunk, head, tail, plain)], 5, 5)
    back = [p.chunk.logged for p in decode_entries(encode_entry(entry))[0][0].items]
    assert [None if b is None else b.tolist() for b in back] == [[True, False, True, True], [True],
                                                                 [False, True, True], None]
    assert back[0].dtype == bool


def test_a_reader_ignores_record_members_a_demonstration_does_not_carry() -> None:
    """§18: episode lines are checked with §10.6's checks 1-14d and 20; action_logp, action_dist_inputs,
    state_in and weights_seq_no_runs are not a demonstration's (a writer that adds them is not refused)."""
    import json

    from tether.protocol.demonstrations import parse_demonstrations

    head = {"format": "tether-demonstrations", "version": 1, "modules": {"m": {
        "observation_space": {"type": "Box", "shape": [2], "low": -1, "high": 1},
        "action_space": {"type": "Discrete", "n": 2}}}}
    line = {"module": "m", "agent_id": "a", "episode_id": "e", "obs": [[0, 0], [0, 0]], "actions": [1],
            "rewards": [1.0], "is_terminated": True, "is_truncated": False, "state_in": {"h": [0.0]},
            "action_logp": "not read", "weights_seq_no_runs": [[0, 5]], "logged_runs": [[0, 1]]}
    demos = parse_demonstrations(json.dumps(head) + "\n" + json.dumps(line) + "\n")
    assert demos.episodes[0].chunk.logged.tolist() == [True] and demos.episodes[0].chunk.state_in is None


def test_a_dataset_in_other_but_compatible_spaces_is_used_when_every_step_lies_in_the_modules() -> None:
    """Third-party datasets often have float64 boxes or other bounds: laid out alike, they are used when
    each recorded value lies in the module's spaces, and refused naming the first step that does not."""
    import json

    from tether.protocol.demonstrations import DemonstrationError, parse_demonstrations
    from tether.protocol.spaces import space_from_json

    def dataset(obs_space: dict, act_space: dict, obs: list, actions: list) -> str:
        head = {"format": "tether-demonstrations", "version": 1,
                "modules": {"m": {"observation_space": obs_space, "action_space": act_space}}}
        line = {"module": "m", "agent_id": "a", "episode_id": "e7", "obs": obs, "actions": actions,
                "rewards": [0.0] * len(actions), "is_terminated": True, "is_truncated": False}
        return json.dumps(head) + "\n" + json.dumps(line) + "\n"

    wide = {"type": "Box", "shape": [2], "low": -10.0, "high": 10.0, "dtype": "float64"}
    module = ModuleSpec("m", box(-1, 1, (2,)), Discrete(2))
    inside = parse_demonstrations(dataset(wide, {"type": "Discrete", "n": 5}, [[0.5, -0.5], [0.2, 0.1], [0, 0]], [1, 0]))
    inside.check_spaces("m", module)  # (float64, wider bounds, a larger Discrete: every step is the module's)
    # Observations beyond the bounds are the module's all the same (a client's are not held to bounds either).
    parse_demonstrations(dataset(wide, {"type": "Discrete", "n": 2}, [[0.5, -0.5], [0.2, 3.0], [0, 0]], [1, 0])
                         ).check_spaces("m", module)
    action = parse_demonstrations(dataset(wide, {"type": "Discrete", "n": 5}, [[0.5, -0.5], [0.2, 0.1], [0, 0]], [1, 4]))
    with pytest.raises(DemonstrationError, match=r"action_space .* episode 'e7' \(agent 'a'\), step 1: action 4 is outside"):
        action.check_spaces("m", module)
    continuous = ModuleSpec("m", box(-1, 1, (2,)), box(-2, 2, (1,)))
    torques = {"type": "Box", "shape": [1], "low": -3.0, "high": 3.0, "dtype": "float64"}
    # (a Box action is the raw sample, inside the bounds or not, as in a client's record)
    parse_demonstrations(dataset(wide, torques, [[0, 0]] * 3, [[2.5], [-2.0]])).check_spaces("m", continuous)
    with pytest.raises(DemonstrationError, match=r"shape \[2\] is not \[1\]"):
        parse_demonstrations(dataset(wide, dict(torques, shape=[2]), [[0, 0]] * 3, [[2.5, 0], [-2.0, 0]])
                             ).check_spaces("m", continuous)
    other_shape = parse_demonstrations(dataset({"type": "Box", "shape": [1], "low": -1, "high": 1},
                                               {"type": "Discrete", "n": 2}, [[0.5], [0.2], [0]], [1, 0]))
    with pytest.raises(DemonstrationError, match=r"shape \[1\] is not \[2\]"):
        other_shape.check_spaces("m", module)
    # Composite: leaf by leaf; a byte leaf only for a byte leaf (the model encodes bytes apart).
    camera = {"type": "Box", "shape": [2], "low": 0, "high": 255, "dtype": "uint8"}
    floats = {"type": "Box", "shape": [2], "low": 0, "high": 255}
    rows = {"camera": [[1, 2], [3, 4]], "speed": [[0.5], [0.25]]}
    speed = {"type": "Box", "shape": [1], "low": -2, "high": 2}
    composite = lambda cam: {"type": "Dict", "spaces": {"camera": cam, "speed": speed}}  # noqa: E731
    narrow = ModuleSpec("m", space_from_json({"type": "Dict", "spaces": {
        "camera": camera, "speed": {"type": "Box", "shape": [1], "low": -1, "high": 1}}}), Discrete(2))
    mine = parse_demonstrations(dataset(composite(camera), {"type": "Discrete", "n": 2}, rows, [0]))
    mine.check_spaces("m", narrow)  # (speed's bounds differ)
    renamed = parse_demonstrations(dataset({"type": "Dict", "spaces": {"camera": camera, "velocity": speed}},
                                           {"type": "Discrete", "n": 2}, {"camera": rows["camera"],
                                                                          "velocity": rows["speed"]}, [0]))
    with pytest.raises(DemonstrationError, match=r"their leaves differ"):
        renamed.check_spaces("m", narrow)
    bytes_for_floats = parse_demonstrations(dataset(composite(floats), {"type": "Discrete", "n": 2}, rows, [0]))
    with pytest.raises(DemonstrationError, match=r"leaf 'camera': dtype float32 is not uint8"):
        bytes_for_floats.check_spaces("m", narrow)


def test_demonstrations_are_checked_against_the_modules_action_mask() -> None:
    """A file that declares no mask (or a module whose action indices moved) is still checked against the
    module's mask: a forbidden action would be cloned at a logit of -1e9."""
    import json

    from tether.protocol.demonstrations import DemonstrationError, parse_demonstrations

    space = {"type": "Dict", "spaces": {"action_mask": {"type": "Box", "shape": [3], "low": 0, "high": 1},
                                        "x": {"type": "Box", "shape": [1], "low": -1, "high": 1}}}

    def dataset(actions: list[int], masks: list[list[int]], declare: bool) -> str:
        module = {"observation_space": space, "action_space": {"type": "Discrete", "n": 3}}
        if declare:
            module["action_mask"] = "action_mask"
        head = {"format": "tether-demonstrations", "version": 1, "modules": {"m": module}}
        line = {"module": "m", "agent_id": "a", "episode_id": "e1", "actions": actions,
                "obs": {"action_mask": masks, "x": [[0.0]] * len(masks)}, "rewards": [0.0] * len(actions),
                "is_terminated": True, "is_truncated": False}
        return json.dumps(head) + "\n" + json.dumps(line) + "\n"

    masked = ModuleSpec.from_json("m", {"observation_space": space, "action_space": {"type": "Discrete", "n": 3},
                                        "action_mask": "action_mask"})
    allowed = [[1, 1, 0], [0, 1, 1], [1, 1, 1]]
    parse_demonstrations(dataset([0, 2], allowed, declare=True)).check_spaces("m", masked)
    undeclared = parse_demonstrations(dataset([2, 2], allowed, declare=False))  # (read without a mask)
    with pytest.raises(DemonstrationError, match=r"episode 'e1' \(agent 'a'\) breaks the module's action mask: "
                                                 r"ACTION_MASKED: actions\[0\] = 2"):
        undeclared.check_spaces("m", masked)
    with pytest.raises(DemonstrationError, match="ACTION_MASK_EMPTY"):
        parse_demonstrations(dataset([0, 1], [[1, 1, 0], [0, 0, 0], [1, 1, 1]], declare=False)).check_spaces("m", masked)


def test_a_dict_and_tuple_observation_space_round_trips_through_a_minari_dataset(tmp_path: Path) -> None:
    """Nested Dict and Tuple leaves (a byte camera, floats, a Discrete) are written as Minari's nested
    observations and read back to the same flat rows, logged flags included."""
    import json

    from tether.protocol.demonstrations import DemonstrationError, parse_demonstrations
    from tether.server.minari_datasets import read_minari, write_minari

    space = {"type": "Dict", "spaces": {
        "camera": {"type": "Box", "shape": [2, 2], "low": 0, "high": 255, "dtype": "uint8"},
        "state": {"type": "Tuple", "spaces": [{"type": "Box", "shape": [1], "low": -1, "high": 1},
                                              {"type": "Discrete", "n": 3},
                                              {"type": "MultiDiscrete", "nvec": [2, 3]}]}}}
    head = {"format": "tether-demonstrations", "version": 1,
            "modules": {"m": {"observation_space": space, "action_space": {"type": "Discrete", "n": 2}}}}
    rng = np.random.default_rng(3)
    lines = [json.dumps(head)]
    for e in range(2):
        steps = 4 + e
        lines.append(json.dumps({
            "module": "m", "agent_id": "a", "episode_id": f"e{e}",
            "obs": {"camera": rng.integers(0, 256, (steps + 1, 2, 2)).tolist(),
                    "state.0": rng.uniform(-1, 1, (steps + 1, 1)).round(3).tolist(),
                    "state.1": rng.integers(0, 3, steps + 1).tolist(),
                    "state.2": np.stack([rng.integers(0, 2, steps + 1), rng.integers(0, 3, steps + 1)], 1).tolist()},
            "actions": rng.integers(0, 2, steps).tolist(), "rewards": [1.0] * steps, "is_terminated": e == 0,
            "is_truncated": e != 0, "logged_runs": [[1, 2]]}))
    demos = parse_demonstrations("\n".join(lines) + "\n")
    back = read_minari(write_minari(demos, "m", tmp_path / "minari"), "m")
    assert back.modules["m"].observation_space.to_json() == demos.modules["m"].observation_space.to_json()
    assert len(back.episodes) == 2
    for mine, theirs in zip(demos.episodes, back.episodes):
        np.testing.assert_array_equal(mine.chunk.obs, theirs.chunk.obs)
        np.testing.assert_array_equal(mine.chunk.actions, theirs.chunk.actions)
        np.testing.assert_array_equal(mine.chunk.rewards, theirs.chunk.rewards)
        assert mine.chunk.is_terminated == theirs.chunk.is_terminated
        assert theirs.chunk.logged.tolist() == mine.chunk.logged.tolist() == [False, True, True] + [False] * (
            mine.chunk.env_steps - 3)
    # A Discrete leaf's value that is not an integer (the wire does not hold observations to their space)
    # cannot be written as Minari's integers: refused by name, not truncated.
    line = json.loads(lines[1])
    line["obs"]["state.1"][2] = 1.5
    halves = parse_demonstrations("\n".join([lines[0], json.dumps(line)]) + "\n")
    with pytest.raises(DemonstrationError, match="leaf 'state.1' holds a value that is not an integer"):
        write_minari(halves, "m", tmp_path / "halves")
