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

    def meet(self, what):
        pass  # (a group of one is always ready)

    def agree(self, values, how="sum"):
        import numpy as np

        return np.asarray(list(values), np.float64)


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


def _starting_rank(rank: int, port: int, out: str) -> None:
    """One rank of a new run (or, with ``<out>/resume``, of the run resumed): its Trainer starts (a new
    run's checkpoint at once written), writes down the versions it serves, and closes."""
    import json
    import asyncio
    import os

    import torch

    from tether.server.config import ServerConfig
    from tether.server.distributed.rank_group import RankGroup, RankPlace
    from tether.server.module_setup import build_layout
    from tether.server.trainer import Trainer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    group = RankGroup(RankPlace(rank=rank, world_size=2, local_rank=rank), torch.device("cpu"), 30)
    logdir = Path(out) / f"rank-{rank}"
    resume = str(logdir / "checkpoint.pt") if (Path(out) / "resume").exists() else None
    config = ServerConfig(logdir=str(logdir), tensorboard=False, quiet=True, device="cpu", resume=resume,
                          seed=rank)  # (seeded apart: only rank 0's weights make the ranks alike)
    trainer = Trainer(config, build_layout(config), group=group)
    (Path(out) / f"served-{rank}.json").write_text(json.dumps(
        {m: rt.weights_seq_no for m, rt in trainer.modules.items()}))
    asyncio.run(trainer.close(checkpoint=False))
    group.close()


def test_every_ranks_first_checkpoint_holds_the_groups_run_and_weights(tmp_path: Path) -> None:
    """The checkpoint a new run writes at once is the one a group may go back to (a rank killed while the
    first periodic one is written): on every rank it must be of the group's run and hold its weights."""
    import torch

    from tether.server.checkpoint import load_checkpoint

    from .gloo_ranks import run_two_ranks

    run_two_ranks(_starting_rank, tmp_path)
    first, second = (load_checkpoint(tmp_path / f"rank-{r}" / "checkpoint.pt") for r in (0, 1))
    assert first["run_id"] == second["run_id"]

    def tensors(value, at=""):  # (every tensor of a nested state, by where it is)
        if isinstance(value, torch.Tensor):
            yield at, value
        elif isinstance(value, dict):
            for key, item in value.items():
                yield from tensors(item, f"{at}/{key}")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                yield from tensors(item, f"{at}/{i}")

    mine, theirs = dict(tensors(first["modules"])), dict(tensors(second["modules"]))
    assert mine.keys() == theirs.keys() and any("weight" in key for key in mine)
    assert all(torch.equal(mine[key], theirs[key]) for key in mine)


def test_a_resumed_group_serves_above_every_version_any_rank_served_after_the_checkpoint(tmp_path: Path) -> None:
    """Rank 1 served versions 1-3 after the group's checkpoint (its versions.json says so) and rank 0 wrote
    down none of them before the group died: restarted, every rank serves the restored weights as v4, so
    that no number a client holds names other weights."""
    import json

    from .gloo_ranks import run_two_ranks

    run_two_ranks(_starting_rank, tmp_path)
    (tmp_path / "rank-1" / "versions.json").write_text(json.dumps({"default_policy": 3}))
    (tmp_path / "resume").touch()
    run_two_ranks(_starting_rank, tmp_path)
    served = [json.loads((tmp_path / f"served-{r}.json").read_text()) for r in (0, 1)]
    assert served == [{"default_policy": 4}, {"default_policy": 4}], served
    assert json.loads((tmp_path / "rank-0" / "versions.json").read_text()) == {"default_policy": 4}
