"""With several ranks, a resume starts every rank from a checkpoint of the same update (group_checkpoints.py):
a rank killed while the ranks wrote a checkpoint keeps the one before, and the others go back to theirs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether.server.checkpoint import save_checkpoint
from tether.server.distributed.group_checkpoints import (checkpoints_held, common_update, keep_as_previous, make_current,
                                                         previous_path)


def test_the_ranks_resume_from_the_newest_update_every_rank_holds() -> None:
    assert common_update([[4, 6], [4, 6]]) == 6
    assert common_update([[4, 6], [2, 4]]) == 4, "a rank killed while writing update 6's"
    assert common_update([[0], []]) is None, "a rank with none: every rank replays its journal alone"
    with pytest.raises(ValueError, match="no common update"):
        common_update([[8, 10], [2, 4]])
    # A rank new to the group (no checkpoint, no journal) does not hold the others back.
    assert common_update([[4, 6], [4, 6], []], [True, True, False]) == 6
    # A rank with a journal and no checkpoint while another trimmed its journal: no way to resume together.
    with pytest.raises(ValueError, match="trimmed its journal"):
        common_update([[4, 6], []], [True, True])


def test_a_rank_finds_its_checkpoints_by_update_and_goes_back_to_the_previous(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(previous_path(path), {"counters": {"updates": 4}})
    save_checkpoint(path, {"counters": {"updates": 6}})
    (tmp_path / "checkpoint.prev.pt.tmp").write_bytes(b"torn")
    assert checkpoints_held(path) == {6: str(path), 4: str(previous_path(path))}
    make_current(str(previous_path(path)), path)
    assert checkpoints_held(path) == {4: str(path)} and not previous_path(path).exists()
    path.write_bytes(b"not a checkpoint")
    assert checkpoints_held(path) == {}


def test_keeping_the_current_checkpoint_as_the_previous_leaves_it_in_place(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"counters": {"updates": 2}})
    keep_as_previous(path)
    assert checkpoints_held(path) == {2: str(path)} and previous_path(path).exists()
    save_checkpoint(path, {"counters": {"updates": 4}})
    assert checkpoints_held(path) == {4: str(path), 2: str(previous_path(path))}


def test_a_previous_checkpoint_of_another_run_is_not_one_to_resume_from(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(previous_path(path), {"counters": {"updates": 5000}, "run_id": "old"})
    save_checkpoint(path, {"counters": {"updates": 0}, "run_id": "new"})
    assert checkpoints_held(path) == {0: str(path)}


class OneRank:
    """The group calls a Trainer makes at start, for a group of one (what a real group's would return)."""

    rank, world_size, is_first = 0, 1, True

    def broadcast_object(self, value):
        return value

    def gather_objects(self, value):
        return [value]


def trainer(logdir: Path, resume: Path | None = None):
    from tether.server.app import build_layout
    from tether.server.config import ServerConfig
    from tether.server.trainer import Trainer

    config = ServerConfig(tensorboard=False, logdir=str(logdir), quiet=True, resume=str(resume) if resume else None)
    return Trainer(config, build_layout(config), OneRank())


def updates_held(path: Path) -> dict[int, str]:
    return {u: Path(p).name for u, p in checkpoints_held(path).items()}


def test_a_new_run_in_a_used_folder_keeps_no_checkpoint_of_the_old_run(tmp_path: Path) -> None:
    old = trainer(tmp_path / "run")
    old.metrics.updates = 5000
    old.save_checkpoint()
    new = trainer(tmp_path / "run")  # (a new run writes its checkpoint at once)
    path = tmp_path / "run" / "checkpoint.pt"
    assert updates_held(path) == {0: "checkpoint.pt"} and not previous_path(path).exists()
    new.metrics.updates = 2
    new.save_checkpoint()
    assert updates_held(path) == {2: "checkpoint.pt", 0: "checkpoint.prev.pt"}


def test_a_resume_from_another_folder_leaves_that_folder_as_it_was(tmp_path: Path) -> None:
    source = trainer(tmp_path / "a")
    for updates in (4, 10):
        source.metrics.updates = updates
        source.save_checkpoint()
    before = updates_held(tmp_path / "a" / "checkpoint.pt")
    moved = trainer(tmp_path / "b", resume=tmp_path / "a" / "checkpoint.pt")
    assert moved.metrics.updates == 10 and updates_held(tmp_path / "a" / "checkpoint.pt") == before
    assert updates_held(tmp_path / "b" / "checkpoint.pt") == {10: "checkpoint.pt"}
