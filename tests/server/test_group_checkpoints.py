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
