"""What each rank makes of the group's command line (server/distributed/rank_config.py); every
option runs on several ranks (self-play's too)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tether.server.config import ServerConfig
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


def test_a_restarted_fork_goes_on_from_its_own_checkpoint_once_it_wrote_one(tmp_path: Path) -> None:
    """A run forked from another folder's checkpoint goes on, once restarted, from its own folder's
    checkpoints and journal, not from the one it was forked from; but when its first attempt died before
    its first checkpoint there, from the one it was forked from again. Checkpoints another run left in
    the folder (an older run, an earlier fork) are removed as the first attempt starts, before anything
    could fail: a restart never takes them for this run's."""
    from tether.server.distributed.rank_config import prepare_rank_folder

    big, fork = tmp_path / "big", tmp_path / "fork"
    forked = ServerConfig(logdir=str(fork), resume=str(big / "checkpoint.pt"), device="cpu")
    first, restart = (RankPlace(rank=1, world_size=2, local_rank=1, attempt=a) for a in (0, 2))

    def write(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"counters": {"updates": 3}, "run_id": "r"}, path)

    write(big / "rank-1" / "checkpoint.pt")
    write(fork / "rank-1" / "checkpoint.pt")  # (an older run's, and its previous one)
    write(fork / "rank-1" / "checkpoint.prev.pt")
    mine = config_for_rank(forked, first)
    assert mine.resume == str(big / "rank-1" / "checkpoint.pt")
    prepare_rank_folder(mine, first)
    assert {p.name for p in (fork / "rank-1").iterdir()} == {"checkpoint.pt.replaced",
                                                             "checkpoint.prev.pt.replaced"}  # (moved aside)
    assert (big / "rank-1" / "checkpoint.pt").exists()  # (the one forked from is never touched)
    assert config_for_rank(forked, restart).resume == str(big / "rank-1" / "checkpoint.pt")  # (none of its own)
    write(fork / "rank-1" / "checkpoint.pt")  # (its first, written once the group started)
    again = config_for_rank(forked, restart)
    assert again.resume == str(fork / "rank-1" / "checkpoint.pt")
    prepare_rank_folder(again, restart)  # (a restart, or a run resuming its own folder, removes nothing)
    prepare_rank_folder(mine := config_for_rank(dataclasses.replace(forked, resume=str(fork / "checkpoint.pt")),
                                                first), first)
    assert mine.resume == str(fork / "rank-1" / "checkpoint.pt") and (fork / "rank-1" / "checkpoint.pt").exists()
    # Resuming this folder's previous checkpoint, by any spelling of the path, moves nothing.
    write(fork / "rank-1" / "checkpoint.prev.pt")
    for spelling in (fork / "checkpoint.prev.pt", fork / ".." / "fork" / "checkpoint.prev.pt"):
        prepare_rank_folder(config_for_rank(dataclasses.replace(forked, resume=str(spelling)), first), first)
        assert (fork / "rank-1" / "checkpoint.prev.pt").exists() and (fork / "rank-1" / "checkpoint.pt").exists()
    # A fork from a checkpoint that does not exist (a mistyped path) is refused, with nothing moved.
    with pytest.raises(ValueError, match="no such checkpoint"):
        prepare_rank_folder(config_for_rank(dataclasses.replace(forked, resume=str(tmp_path / "bgi" / "checkpoint.pt")),
                                            first), first)
    assert (fork / "rank-1" / "checkpoint.pt").exists()
    # A new run (no --resume) in a folder an older run used starts clean there, and its restart resumes itself.
    fresh = ServerConfig(logdir=str(big), device="cpu")
    prepare_rank_folder(config_for_rank(fresh, first), first)
    assert not (big / "rank-1" / "checkpoint.pt").exists() and (big / "rank-1" / "checkpoint.pt.replaced").exists()


def test_self_play_runs_on_several_ranks_with_the_groups_table() -> None:
    table = {"teams": ["p1", "p2"], "modules": ["a"]}
    config = dataclasses.replace(ServerConfig(device="cpu"), self_play=table)
    for rank in (0, 1):
        assert config_for_rank(config, RankPlace(rank=rank, world_size=2, local_rank=rank)).self_play == table


def test_memory_normalized_observations_and_demonstrations_run_on_several_ranks() -> None:
    config = ServerConfig(device="cpu", normalize_observations=True, demos="expert.jsonl",
                          model={"recurrent": {"type": "lstm", "size": 16}})
    assert config_for_rank(config, RankPlace(rank=1, world_size=2, local_rank=1)).normalize_observations
