"""What each rank makes of the group's command line (server/distributed/rank_config.py), and the
options that cannot run on several ranks yet, refused by name."""

from __future__ import annotations

import dataclasses

import pytest

from tether.server.config import ConfigError, ServerConfig
from tether.server.distributed.rank_config import config_for_rank
from tether.server.distributed.rank_group import RankPlace


def test_each_rank_gets_its_port_folder_checkpoint_and_summary() -> None:
    config = ServerConfig(port=5555, logdir="runs/big", resume="runs/big/checkpoint.pt", summary_file="out/s.json",
                          console_port=8080, device="cpu")
    mine = config_for_rank(config, RankPlace(rank=3, world_size=4, local_rank=1))
    assert (mine.port, mine.logdir, mine.resume) == (5556, "runs/big/rank-3", "runs/big/rank-3/checkpoint.pt")
    assert mine.summary_file == "out/s.rank-3.json" and mine.console_port is None
    first = config_for_rank(config, RankPlace(rank=0, world_size=4, local_rank=0))
    assert first.console_port == 8080 and first.summary_file == "out/s.json"
    # torchrun's restart of a command line without --resume resumes all the same.
    again = config_for_rank(dataclasses.replace(config, resume=None), RankPlace(rank=1, world_size=2, local_rank=1,
                                                                              attempt=1))
    assert again.resume == "runs/big/rank-1/checkpoint.pt"


@pytest.mark.parametrize("option, value, named", [
    ("self_play", {"modules": ["a"]}, "self_play"),
])
def test_options_one_rank_only_are_refused_by_name(option: str, value: object, named: str) -> None:
    config = dataclasses.replace(ServerConfig(device="cpu"), **{option: value})
    with pytest.raises(ConfigError, match=named):
        config_for_rank(config, RankPlace(rank=0, world_size=2, local_rank=0))


def test_memory_normalized_observations_and_demonstrations_run_on_several_ranks() -> None:
    config = ServerConfig(device="cpu", normalize_observations=True, demos="expert.jsonl",
                          model={"recurrent": {"type": "lstm", "size": 16}})
    assert config_for_rank(config, RankPlace(rank=1, world_size=2, local_rank=1)).normalize_observations
