"""Two real ranks for a test: ``target(rank, port, out)`` in two spawned processes that meet over gloo
on a free loopback port (each calls RankGroup with MASTER_ADDR 127.0.0.1 and MASTER_PORT ``port``)."""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
from pathlib import Path
from typing import Any, Callable

from ..integration.server_process import free_port


def run_two_ranks(target: Callable[[int, int, str], None], out: Path) -> None:
    """Run ``target`` as ranks 0 and 1 and wait for both; each must exit cleanly (within 120 s)."""
    port = free_port()  # (the rendezvous store's, bound by rank 0 later)
    spawn = multiprocessing.get_context("spawn")
    ranks = [spawn.Process(target=target, args=(rank, port, str(out))) for rank in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(120)
        assert process.exitcode == 0, f"rank exited with {process.exitcode}"


async def stop_together(trainer: Any, rank: int, out: str, report: dict) -> None:
    """Rank 0 asks the group to stop; each rank waits for the group's stop, writes ``report`` (read back
    by ``reports``) and closes its trainer without a checkpoint."""
    if rank == 0:
        trainer.request_stop("signal")
    await asyncio.wait_for(trainer.stop_requested.wait(), 60)
    (Path(out) / f"rank-{rank}.pkl").write_bytes(pickle.dumps(report))
    await trainer.close(checkpoint=False)


def reports(out: Path) -> tuple[dict, dict]:
    """Rank 0's and rank 1's reports (stop_together's)."""
    first, second = (pickle.loads((out / f"rank-{r}.pkl").read_bytes()) for r in (0, 1))
    return first, second
