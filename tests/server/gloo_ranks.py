"""Two real ranks for a test: ``target(rank, port, out)`` in two spawned processes that meet over gloo
on a free loopback port (each calls RankGroup with MASTER_ADDR 127.0.0.1 and MASTER_PORT ``port``)."""

from __future__ import annotations

import multiprocessing
import socket
from pathlib import Path
from typing import Callable


def run_two_ranks(target: Callable[[int, int, str], None], out: Path) -> None:
    """Run ``target`` as ranks 0 and 1 and wait for both; each must exit cleanly (within 120 s)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    spawn = multiprocessing.get_context("spawn")
    ranks = [spawn.Process(target=target, args=(rank, port, str(out))) for rank in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(120)
        assert process.exitcode == 0, f"rank exited with {process.exitcode}"
