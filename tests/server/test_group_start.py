"""A rank that takes long to start (replaying a long journal, loading a large checkpoint) is waited for
up to --group-start-timeout-s, not the collectives' own --group-timeout-s; past it, every rank stops with
a message naming the start-up step. Two real ranks (gloo on loopback, two processes, whole Trainers)."""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path

import pytest
import torch

from . import gloo_ranks

BOX = {"type": "Box", "shape": [2], "low": -1, "high": 1}
TWO = {"type": "Discrete", "n": 2}


def slow_rank(rank: int, port: int, out: str) -> None:
    from tether.server.config import ServerConfig
    from tether.server.distributed.rank_group import RankGroup, RankGroupError, RankPlace
    from tether.server.module_setup import build_layout
    from tether.server.trainer import Trainer

    settings = json.loads((Path(out) / "settings.json").read_text())
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cfg = ServerConfig(modules={"m": {"observation_space": BOX, "action_space": TWO}},
                       policy_mapping=[{"pattern": "*", "module": "m"}], logdir=str(Path(out) / f"r{rank}"),
                       tensorboard=False, seed=rank, device="cpu", group_timeout_s=1.0,
                       group_start_timeout_s=settings["start_timeout_s"])
    group = RankGroup(RankPlace(rank=rank, world_size=2, local_rank=rank), torch.device("cpu"), cfg.group_timeout_s,
                      cfg.group_start_timeout_s)
    if rank == settings["slow_rank"]:  # (this rank's journal takes seconds to replay)
        resume = Trainer._resume_and_open_journal

        def slowly(self) -> None:
            time.sleep(settings["slow_s"])
            resume(self)

        Trainer._resume_and_open_journal = slowly
    report: dict = {}
    try:
        trainer = Trainer(cfg, build_layout(cfg), group=group)
        report["weights"] = {k: v.clone() for k, v in trainer.modules["m"].learner.model.state_dict().items()}
    except RankGroupError as exc:
        report["error"] = str(exc)
    (Path(out) / f"rank-{rank}.pkl").write_bytes(pickle.dumps(report))
    group.close()


@pytest.mark.parametrize("slow", [0, 1])
def test_a_rank_slow_to_start_is_waited_for_and_then_given_the_groups_weights(tmp_path: Path, slow: int) -> None:
    """Either rank: in a barrier rank 0 waits by the barrier's timeout and the others by their group's."""
    (tmp_path / "settings.json").write_text(json.dumps({"start_timeout_s": 30, "slow_s": 3, "slow_rank": slow}))
    gloo_ranks.run_two_ranks(slow_rank, tmp_path)
    first, second = (pickle.loads((tmp_path / f"rank-{r}.pkl").read_bytes()) for r in (0, 1))
    assert "error" not in first and "error" not in second, (first.get("error"), second.get("error"))
    assert all(torch.equal(first["weights"][k], second["weights"][k]) for k in first["weights"])


def test_a_rank_not_ready_within_the_start_timeout_stops_the_group_naming_it(tmp_path: Path) -> None:
    (tmp_path / "settings.json").write_text(json.dumps({"start_timeout_s": 1, "slow_s": 4, "slow_rank": 1}))
    gloo_ranks.run_two_ranks(slow_rank, tmp_path)
    first = pickle.loads((tmp_path / "rank-0.pkl").read_bytes())
    assert "not ready for the group's weights within 1 s (--group-start-timeout-s)" in first.get("error", ""), first
