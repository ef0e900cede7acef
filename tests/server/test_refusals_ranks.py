"""DATA_REFUSED across ranks: a client_session one rank refuses (its data made updates non-finite) is
refused by every rank, whichever it reconnects to, and what another rank's pool holds of it is dropped.
Two real ranks (gloo on loopback, two processes, whole Trainers with their lockstep loops)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import torch

from tether.protocol.errors import ErrorCode, MessageError

from . import gloo_ranks
from .test_lockstep_failures import TIMEOUT_S, config

BAD = ("client_session", "bad-one")


def refusing_rank(rank: int, port: int, out: str, spread: bool = False) -> None:
    """``spread``: no rank alone refuses the bad client; rank 0 struck it twice and rank 1 once, and the
    group's three strikes refuse it on both at the agreement that tells them."""
    from tether.protocol.episodes import EpisodeChunk
    from tether.server.distributed.rank_group import RankGroup, RankPlace
    from tether.server.module_setup import build_layout
    from tether.server.sample_pool import Pooled
    from tether.server.trainer import Trainer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    group = RankGroup(RankPlace(rank=rank, world_size=2, local_rank=rank), torch.device("cpu"), TIMEOUT_S)
    trainer = Trainer(config(Path(out) / f"r{rank}"), build_layout(config(Path(out) / f"r{rank}")), group=group)
    guard, report = trainer.guard, {}

    def refused(owner, source: str) -> bool:
        try:
            guard.check(owner, source)
        except MessageError as exc:
            assert exc.code == ErrorCode.DATA_REFUSED
            return True
        return False

    async def run() -> None:
        rng = np.random.default_rng(rank)
        # The bad client's session sent some data here, and so did a good one (less than a batch in the group).
        for source, session in (("#1 10.0.0.1:5", BAD), ("#2 10.0.0.2:5", ("client_session", "good"))):
            guard.note(session, source)
            chunk = EpisodeChunk(rng.normal(size=(9, 2)).astype(np.float32), rng.integers(0, 2, 8),
                                 rng.normal(size=8).astype(np.float32), np.full(8, -0.69, np.float32), None, True, False)
            trainer.pool.add(Pooled("m", chunk, 0, source=source))
        if spread:  # (updates 1 and 2 made non-finite by its data on rank 0, update 3 on rank 1)
            for update in (1, 2, 3):
                guard.tick()
                if (rank == 0) == (update < 3):
                    assert guard.strike(["#1 10.0.0.1:5"]) == []
        elif rank == 0:  # (three of rank 0's updates were made non-finite by its data)
            for _ in range(3):
                guard.tick()
                guard.strike(["#1 10.0.0.1:5"])
        report["refused_before"] = refused(BAD, "#7 10.0.0.1:6")
        trainer.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not refused(BAD, "#7 10.0.0.1:6") and loop.time() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # (both ranks past the agreement that told them)
        report.update(refused_after=refused(BAD, "#7 10.0.0.1:6"), good=refused(("client_session", "good"), "#8 x"),
                      pool=sorted(p.source for p in trainer.pool.items()), refused_count=trainer.metrics.clients_refused,
                      isolated=trainer.metrics.agent_steps_isolated, untold=guard.untold)
        await gloo_ranks.stop_together(trainer, rank, out, report)

    asyncio.run(run())
    group.close()


def test_a_client_refused_by_one_rank_is_refused_by_every_rank(tmp_path: Path) -> None:
    gloo_ranks.run_two_ranks(refusing_rank, tmp_path)
    first, second = gloo_ranks.reports(tmp_path)
    assert first["refused_before"] and not second["refused_before"], (first, second)
    for report in (first, second):
        # Refused on a new connection too (a reconnect), by its session; the good client is not.
        assert report["refused_after"] and not report["good"] and report["untold"] == 0, report
    # Rank 1 dropped what its pool held of the refused client, and counts it as left out.
    assert second["pool"] == ["#2 10.0.0.2:5"] and second["isolated"] == 8, second
    assert second["refused_count"] >= 1, second


def spreading_rank(rank: int, port: int, out: str) -> None:
    refusing_rank(rank, port, out, spread=True)


def test_a_client_struck_on_two_ranks_is_refused_when_the_groups_strikes_reach_the_limit(tmp_path: Path) -> None:
    gloo_ranks.run_two_ranks(spreading_rank, tmp_path)
    first, second = gloo_ranks.reports(tmp_path)
    assert not first["refused_before"] and not second["refused_before"], (first, second)
    for report in (first, second):
        assert report["refused_after"] and not report["good"] and report["untold"] == 0, report
        # Each rank dropped what its pool held of the refused client, and counts it as left out.
        assert report["pool"] == ["#2 10.0.0.2:5"] and report["isolated"] == 8, report
