"""Two ranks (torchrun, gloo on loopback): a step either rank has answered is trained exactly once
across a rank killed with SIGKILL mid-run and the group's resume (docs/scale-out.md, protocol §13.5).

Each rank has its own client, which sends batches of one 100-step episode whose steps carry their id in
observation 0 and resends, unchanged, a batch whose answer it lost. The ranks run under
recording_server.py, which logs the ids each rank's share of each published update trained on. One rank
is killed; the other stops at its next collective; the group is started again with --resume, as
torchrun's restart does, and each rank resumes from the newest update every rank holds a checkpoint of
(a rank that holds a newer one goes back to its previous one and replays its journal since). The
updates that count are the killed run's up to that update's version, and those of the resumed run,
which ends on SIGTERM with a final checkpoint on each rank. Counted that way, with the steps left in the
ranks' final pools, every answered step is there exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tether.server.checkpoint import load_checkpoint
from tether.server.pool_journal import decode_entries

from .server_process import two_free_ports, wait_until
from .test_durable_pool import RECORDING, STEPS, Client, trained_lines
from .test_scale_out import Group

FLAGS = ("--train-batch-size", "300", "--num-epochs", "1", "--checkpoint-every", "2", "--no-verify-action-logp",
         "--max-staleness", "100", "--env-steps-per-sample", "100")


def held_updates(rank_dir: Path) -> dict[int, int]:
    """update -> weights version of each checkpoint a rank holds (current and previous)."""
    held = {}
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        if (rank_dir / name).exists():
            state = load_checkpoint(rank_dir / name)
            held[int(state["counters"]["updates"])] = int(state["modules"]["default_policy"]["weights_seq_no"])
    return held


def ranks_of(group: Group) -> list[int]:
    return [int(pid) for pid in subprocess.run(["pgrep", "-P", str(group.proc.pid)], capture_output=True,
                                               text=True).stdout.split()]


@pytest.mark.slow
def test_answered_steps_are_trained_once_across_a_killed_rank_and_the_groups_resume(tmp_path, monkeypatch) -> None:
    log = tmp_path / "trained.jsonl"
    monkeypatch.setenv("TETHER_TRAINED_LOG", str(log))
    port = two_free_ports()
    clients = [Client("durable-rank-0", 1), Client("durable-rank-1", 5001)]  # (ids 1,000... and 5,001,000...)

    def start(*flags: str) -> Group:
        return Group(tmp_path, *FLAGS, *flags, port=port, program=(str(RECORDING),))

    first = start()
    try:
        ports = first.wait_serving()
        for rank, client in enumerate(clients):
            client.port = ports[rank]
            client.start()
        # Both ranks checkpointed update 2 at least, and the clients sent on after it.
        checkpoint = first.logdir / "rank-1" / "checkpoint.pt"
        assert wait_until(lambda: checkpoint.exists() and load_checkpoint(checkpoint)["counters"]["updates"] >= 2, 120), \
            first.lines[-20:]
        answered = sum(len(c.answered) for c in clients)
        assert wait_until(lambda: sum(len(c.answered) for c in clients) >= answered + 4, 60), first.lines[-20:]
        pids = ranks_of(first)
        assert len(pids) == 2, pids
        os.kill(pids[-1], signal.SIGKILL)
        assert first.proc.wait(120) != 0  # (the survivor stops at its next collective, torchrun with it)
    finally:
        first.stop()
    killed = {first.proc.pid} | set(pids)
    logged_pids = {line["pid"] for line in trained_lines(log)}
    assert logged_pids <= set(pids) and logged_pids, (logged_pids, pids)
    held = [held_updates(first.logdir / f"rank-{r}") for r in (0, 1)]
    common = max(set(held[0]) & set(held[1]))
    kept_version = held[0][common]
    assert held[1][common] == kept_version, held
    counted = [i for line in trained_lines(log) if line["version"] <= kept_version for i in line["ids"]]

    second = start("--resume", str(tmp_path / "run" / "checkpoint.pt"))
    try:
        second.wait_serving()
        answered = sum(len(c.answered) for c in clients)
        assert wait_until(lambda: sum(len(c.answered) for c in clients) >= answered + 8, 120), second.lines[-20:]
        resumed = ranks_of(second)
        for pid in resumed:  # (every rank asked to stop: the group stops together, each writing its checkpoint)
            os.kill(pid, signal.SIGTERM)
        assert second.proc.wait(120) == 0, "\n".join(second.lines[-40:])
    finally:
        for client in clients:
            client.halt.set()
        for client in clients:
            client.join(30)
        second.stop()
    counted += [i for line in trained_lines(log) if line["pid"] in resumed for i in line["ids"]]
    pooled = []
    for rank in (0, 1):
        entries, _ = decode_entries(load_checkpoint(second.logdir / f"rank-{rank}" / "checkpoint.pt")["pool"])
        pooled += [int(i) for entry in entries for item in entry.items for i in item.chunk.obs[:-1, 0]]

    assert not any(c.errors for c in clients), [c.errors for c in clients]
    answered_ids = {seq * 1000 + j for c in clients for seq in c.answered for j in range(STEPS)}
    assert all(c.answered for c in clients), "both ranks' clients were answered"
    times = Counter(counted + pooled)
    lost_or_twice = sorted(i // 1000 for i in answered_ids if times[i] != 1)
    assert lost_or_twice == [], (common, kept_version, held, sorted(set(lost_or_twice)))
    assert max(times.values()) == 1  # (nothing twice, answered or not)
    summaries = [second.rank_summary(r) for r in (0, 1)]
    assert all(s["samples_dropped_stale"] == 0 for s in summaries), summaries
    assert killed.isdisjoint(resumed)
