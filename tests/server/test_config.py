"""One set of options, three ways in: the dataclass, a TOML file, CLI flags."""

from __future__ import annotations

import dataclasses

import pytest

from tether.server.cli import build_parser
from tether.server.config import ServerConfig, config_from_args


def parse(argv: list[str]) -> ServerConfig:
    return config_from_args(build_parser().parse_args(["serve", *argv]))


def test_every_field_has_a_flag_with_help() -> None:
    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]
    for f in dataclasses.fields(ServerConfig):
        assert "--" + f.name.replace("_", "-") in help_text
        assert f.metadata["help"]


def test_toml_and_flags_give_the_same_config(tmp_path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text(
        'port = 6000\ntrain_batch_size = 4000\nforce_on_policy = false\nhidden_sizes = [32, 32]\n'
        'action_space = { type = "Discrete", n = 3 }\nlr = 0.0003\n'
    )
    from_file = ServerConfig.from_toml(toml)
    from_flags = parse(["--port", "6000", "--train-batch-size", "4000", "--no-force-on-policy",
                        "--hidden-sizes", "32,32", "--action-space", '{"type": "Discrete", "n": 3}', "--lr", "0.0003"])
    direct = ServerConfig(port=6000, train_batch_size=4000, force_on_policy=False, hidden_sizes=[32, 32],
                          action_space={"type": "Discrete", "n": 3}, lr=0.0003)
    assert from_file == from_flags == direct


def test_flags_override_the_file(tmp_path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text("port = 6000\nmax_staleness = 3\n")
    config = parse(["--config", str(toml), "--port", "7000"])
    assert config.port == 7000 and config.max_staleness == 3


def test_unknown_and_invalid_options_are_clear_errors(tmp_path) -> None:
    toml = tmp_path / "bad.toml"
    toml.write_text("prot = 1\n")
    with pytest.raises(ValueError, match="unknown server option.*prot"):
        ServerConfig.from_toml(toml)
    with pytest.raises(ValueError, match="max_staleness"):
        ServerConfig(max_staleness=-1)
    for timeouts in ({"group_timeout_s": 0.0}, {"group_start_timeout_s": float("nan")}):
        with pytest.raises(ValueError, match="group_start_timeout_s must be > 0"):
            ServerConfig(**timeouts)


BOX = lambda n: {"type": "Box", "shape": [n], "low": -1, "high": 1}  # noqa: E731


def critic_layout(value_obs_agents, other_width: int = 3):
    from tether.server.module_setup import build_layout

    config = ServerConfig(modules={
        "critic": {"observation_space": BOX(3), "action_space": {"type": "Discrete", "n": 2},
                   "value_obs_agents": value_obs_agents},
        "other": {"observation_space": BOX(other_width), "action_space": {"type": "Discrete", "n": 2}},
    }, policy_mapping=[{"pattern": "a_*", "module": "critic"}, {"pattern": "b_*", "module": "other"}])
    return build_layout(config)


def test_value_obs_agents_must_be_agent_ids_of_the_critics_width() -> None:
    assert critic_layout(["a_0", "a_1", "b_0"]).specs["critic"].value_obs_dim == 9
    with pytest.raises(ValueError, match="must be a list of agent ids"):
        critic_layout("a_0")  # would be read as the agents "a", "_", "0"
    with pytest.raises(ValueError, match="must be a list of agent ids"):
        critic_layout(["a_0", 7])
    with pytest.raises(ValueError, match="lists an agent twice"):
        critic_layout(["a_0", "a_0"])
    with pytest.raises(ValueError, match="'b_0', which maps to module 'other' with 5 observation values"):
        critic_layout(["a_0", "b_0"], other_width=5)
    with pytest.raises(ValueError, match="lists 'a0_typo'.*, which no policy_mapping rule maps"):
        critic_layout(["a_0", "a0_typo"])


def test_value_obs_agents_cannot_name_a_group_or_its_members() -> None:
    """§9.7: a member's observation is only part of its group's, and a group is not an observed agent."""
    from tether.server.module_setup import build_layout

    def layout(listed: list[str]):
        return build_layout(ServerConfig(modules={
            "critic": {"observation_space": BOX(3), "action_space": {"type": "Discrete", "n": 2},
                       "value_obs_agents": listed},
            "pairmod": {"observation_space": BOX(6), "action_space": {"type": "MultiDiscrete", "nvec": [2, 2]}},
        }, policy_mapping=[{"pattern": "a_*", "module": "critic"}, {"agent_id": "pair", "module": "pairmod"}],
            groups={"pair": {"members": ["m_0", "m_1"], "reward": "sum"}}))

    assert layout(["a_0", "a_1"]).specs["critic"].value_obs_dim == 6
    with pytest.raises(ValueError, match="'m_1', a member of group 'pair'"):
        layout(["a_0", "m_1"])
    with pytest.raises(ValueError, match="lists group 'pair'"):
        layout(["a_0", "pair"])


def test_a_group_module_can_have_a_centralized_critic_of_its_width() -> None:
    """§9.7: a group's module may list value_obs_agents; each listed agent's observation is as wide as
    the group's joined one (its members' side by side), so V = len(listed) x the group's obs_dim."""
    from tether.server.module_setup import build_layout

    def layout(listed_width: int):
        return build_layout(ServerConfig(modules={
            "pairmod": {"observation_space": BOX(6), "action_space": {"type": "MultiDiscrete", "nvec": [2, 2]},
                        "value_obs_agents": ["a_0", "a_1"]},
            "solo": {"observation_space": BOX(listed_width), "action_space": {"type": "Discrete", "n": 2}},
        }, policy_mapping=[{"pattern": "a_*", "module": "solo"}, {"agent_id": "pair", "module": "pairmod"}],
            groups={"pair": {"members": ["m_0", "m_1"], "reward": "sum"}}))

    assert layout(6).specs["pairmod"].value_obs_dim == 12
    with pytest.raises(ValueError, match="'a_0', which maps to module 'solo' with 3 observation values, but the "
                                         "critic takes 6 per agent"):
        layout(3)


def test_ppo_defaults_live_in_one_place() -> None:
    from tether.server.config import PPO_OPTION_NAMES
    from tether.server.learner import PPOHyperparams

    defaults, config = PPOHyperparams(), ServerConfig()
    for name in PPO_OPTION_NAMES:
        value = getattr(config, name)
        assert getattr(defaults, name) == (tuple(value) if isinstance(value, list) else value), name


def test_a_batch_of_images_larger_than_a_frame_is_refused_at_start() -> None:
    """84x84x4 images, 2,500 steps per batch: about 70 MB, beyond the 64 MiB frame limit, so no
    client could ever deliver a batch. Refused by the numbers, with what to change."""
    from tether.server.module_setup import build_layout

    image = {"type": "Box", "shape": [84, 84, 4], "dtype": "uint8", "low": 0, "high": 255}

    def layout(steps: int, space: dict = image):
        return build_layout(ServerConfig(observation_space=space, action_space={"type": "Discrete", "n": 6},
                                         env_steps_per_sample=steps))

    with pytest.raises(ValueError, match=r"env_steps_per_sample 2500 .* at least 70,588,224 bytes .* "
                                         r"more than max_frame_bytes 67,108,864: lower env_steps_per_sample"):
        layout(2500)
    layout(2000)  # 56 MB: fits
    composite = {"type": "Dict", "spaces": {"cam": image, "v": {"type": "Box", "shape": [8]}}}
    with pytest.raises(ValueError, match="28,256 per step"):
        layout(2500, composite)


def test_a_leaf_named_like_the_models_output_is_refused_by_name() -> None:
    from tether.server.module_setup import build_layout

    space = {"type": "Dict", "spaces": {"action_dist_inputs": {"type": "Box", "shape": [2]},
                                        "b": {"type": "Box", "shape": [1]}}}
    with pytest.raises(ValueError, match="leaf 'action_dist_inputs' has the name of the model's output"):
        build_layout(ServerConfig(observation_space=space, action_space={"type": "Discrete", "n": 2}))
    build_layout(ServerConfig(observation_space=space, action_space={"type": "Discrete", "n": 2},
                              onnx_output_name="logits"))  # (another output name: no clash)
