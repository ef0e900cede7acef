"""The pool's journal: records round-trip, a record cut short or corrupted ends the
replay (it was never answered), generations are read from the checkpoint's on, and
a resume from a checkpoint restores its pool and replays the journal after it."""

from __future__ import annotations

import asyncio

import numpy as np

from tether.sdk.protocol import EpisodeChunk
from tether.sdk.protocol.multi_agent import AgentChunk, MultiAgentRecord
from tether.server.batch_dedup import BatchId
from tether.server.config import ServerConfig
from tether.server.module_setup import build_layout
from tether.server.pool_journal import JournalEntry, PoolJournal, decode_entries, encode_entry, read_journal
from tether.server.sample_pool import Pooled
from tether.server.trainer import Trainer


def item(first_id: int, steps: int = 3, logp: bool = True) -> Pooled:
    obs = np.zeros((steps + 1, 4), np.float32)
    obs[:, 0] = first_id + np.arange(steps + 1)
    chunk = EpisodeChunk(obs, np.arange(steps) % 2, np.ones(steps, np.float32),
                         np.full(steps, -0.7, np.float32) if logp else None, None, True, False, "e\ud800")
    return Pooled("default_policy", chunk, 4, "#1 peer")


def test_records_round_trip_and_a_torn_or_corrupt_record_ends_the_replay() -> None:
    entries = [JournalEntry(BatchId("s", 1), [item(0), item(10, logp=False)], 6, 6), JournalEntry(None, [], 0, 0)]
    data = b"".join(encode_entry(e) for e in entries)
    back, used = decode_entries(data)
    assert used == len(data) and len(back) == 2 and back[0].batch == BatchId("s", 1)
    a, b = back[0].items
    assert np.array_equal(a.chunk.obs, entries[0].items[0].chunk.obs) and a.chunk.obs.flags.writeable
    assert a.chunk.episode_id == "e\ud800" and a.weights_seq_no == 4 and b.chunk.action_logp is None
    assert a.chunk.actions.dtype == entries[0].items[0].chunk.actions.dtype
    first = len(encode_entry(entries[0]))
    assert len(decode_entries(data[:-1])[0]) == 1  # the last record cut short
    corrupt = bytearray(data)
    corrupt[first - 5] ^= 0xFF  # a byte of the first record's arrays
    assert decode_entries(bytes(corrupt)) == ([], 0)


def test_generations_older_than_a_checkpoints_are_not_replayed(tmp_path) -> None:
    async def write() -> None:
        journal = PoolJournal(tmp_path, 0)
        await journal.append(JournalEntry(BatchId("s", 1), [item(0)], 3, 3))
        assert journal.rotate() == 1
        await journal.append(JournalEntry(BatchId("s", 2), [item(10)], 3, 3))
        journal.close()

    asyncio.run(write())
    assert [e.batch.batch_seq for e in read_journal(tmp_path, 0)] == [1, 2]
    assert [e.batch.batch_seq for e in read_journal(tmp_path, 1)] == [2]


def test_resume_restores_the_checkpoints_pool_and_replays_the_journal_after_it(tmp_path) -> None:
    config = ServerConfig(tensorboard=False, logdir=str(tmp_path), quiet=True, train_batch_size=1000)

    async def first_run() -> None:
        trainer = Trainer(config, build_layout(config))
        def records(first: int) -> list[MultiAgentRecord]:
            chunk = item(first).chunk
            return [MultiAgentRecord(chunk.episode_id, True, False, [AgentChunk("default_agent", "default_policy", 0, chunk)])]

        await trainer.submit("c", records(0), {"default_policy": 0}, False, env_steps=3, batch=BatchId("s", 1))
        trainer.save_checkpoint()  # holds batch 1 in its pool
        await trainer.submit("c", records(10), {"default_policy": 0}, False, env_steps=3, batch=BatchId("s", 2))
        trainer.journal.close()  # then the process dies: no final checkpoint

    asyncio.run(first_run())
    resumed = Trainer(ServerConfig(tensorboard=False, logdir=str(tmp_path), quiet=True, train_batch_size=1000,
                                   resume=str(tmp_path / "checkpoint.pt")), build_layout(config))
    ids = [int(i) for p in resumed._pool.items() for i in p.chunk.obs[:-1, 0]]
    assert ids == [0, 1, 2, 10, 11, 12] and all(p.replayed for p in resumed._pool.items())
    assert resumed.dedup.is_duplicate(BatchId("s", 2)) and resumed.metrics.env_steps_received == 6
    resumed.journal.close()
