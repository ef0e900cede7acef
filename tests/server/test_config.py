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
