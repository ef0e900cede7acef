"""The pool's journal: records round-trip, a record cut short or corrupted ends the
replay (it was never answered), generations are read from the checkpoint's on, and
a resume from a checkpoint restores its pool and replays the journal after it."""

from __future__ import annotations

import asyncio

import numpy as np

from tether.protocol import EpisodeChunk
from tether.protocol.multi_agent import AgentChunk, MultiAgentRecord
from tether.server.ingest.batch_dedup import BatchId
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


def test_an_items_client_session_round_trips_and_an_older_journal_takes_its_records() -> None:
    """Pooled data keeps its batch's client_session through the journal (and a checkpoint's pool, whose
    record names no batch); a journal written before items kept it gives each item its record's batch's."""
    import dataclasses
    import json
    import struct
    import zlib

    from tether.server import pool_journal

    entries = [JournalEntry(BatchId("s", 1), [dataclasses.replace(item(0), client_session="s")], 3, 3),
               JournalEntry(None, [dataclasses.replace(item(10), client_session="t"), item(20)], 6, 6)]
    back, _ = decode_entries(b"".join(encode_entry(e) for e in entries))
    assert [p.client_session for e in back for p in e.items] == ["s", "t", None]
    # An older record: its items have no "session".
    record = encode_entry(entries[0])
    magic, _, header_len, blob_len = pool_journal._RECORD.unpack_from(record)
    header = json.loads(record[pool_journal._RECORD.size:pool_journal._RECORD.size + header_len])
    for entry in header["items"]:
        del entry["session"]
    old_header = json.dumps(header).encode()
    blob = record[pool_journal._RECORD.size + header_len:]
    old = struct.pack("<4sIIQ", magic, zlib.crc32(blob, zlib.crc32(old_header)), len(old_header), blob_len)
    (entry,), _ = decode_entries(old + old_header + blob)
    assert entry.items[0].client_session == "s"


def test_a_recurrent_chunks_state_and_prefix_round_trip() -> None:
    """**[1.5]** A chunk of a module with memory keeps its recorded state, and a part the pool cut keeps
    the observations its state is advanced over (sample_pool.split_chunk): both are journaled."""
    from tether.server.sample_pool import split_chunk

    whole = item(0, steps=5).chunk
    whole.state_in = np.arange(6, dtype=np.float32).reshape(2, 3)
    head, tail = split_chunk(whole, 2)
    entry = JournalEntry(None, [Pooled("default_policy", head, 4), Pooled("default_policy", tail, 4)], 5, 5)
    back = decode_entries(encode_entry(entry))[0][0].items
    for after in back:
        np.testing.assert_array_equal(after.chunk.state_in, whole.state_in)
    assert back[0].chunk.state_prefix is None
    np.testing.assert_array_equal(back[1].chunk.state_prefix, whole.obs[:2])


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
    ids = [int(i) for p in resumed.pool.items() for i in p.chunk.obs[:-1, 0]]
    assert ids == [0, 1, 2, 10, 11, 12] and all(p.replayed for p in resumed.pool.items())
    assert resumed.dedup.is_duplicate(BatchId("s", 2)) and resumed.metrics.env_steps_received == 6
    resumed.journal.close()


def _records(first: int, steps: int = 40, episodes: int = 1) -> list[MultiAgentRecord]:
    out = []
    for e in range(episodes):
        obs = np.zeros((steps + 1, 4), np.float32)
        obs[:, 0] = first + e * steps + np.arange(steps + 1)
        chunk = EpisodeChunk(obs, np.arange(steps) % 2, np.ones(steps, np.float32), np.full(steps, -0.69, np.float32),
                             None, True, False, f"e{first}-{e}")
        agent = AgentChunk("default_agent", "default_policy", 0, chunk)
        out.append(MultiAgentRecord(chunk.episode_id, True, False, [agent]))
    return out


def _config(logdir, **kw) -> ServerConfig:
    return ServerConfig(tensorboard=False, logdir=str(logdir), quiet=True, train_batch_size=64, num_epochs=1,
                        minibatch_size=32, verify_action_logp=False, **kw)


def _pool_ids(checkpoint) -> list[int]:
    from tether.server.checkpoint import load_checkpoint

    entries, _ = decode_entries(load_checkpoint(checkpoint)["pool"])
    return [int(i) for e in entries for p in e.items for i in p.chunk.obs[:-1, 0]]


def test_a_resume_whose_pool_exceeds_its_room_trains_instead_of_blocking_every_client(tmp_path) -> None:
    """The journal after a checkpoint holds every batch since (checkpoint_every updates of them):
    replayed, it can fill the pool past its room before any update ran; the next submit must start
    one, not wait for room forever."""
    config = _config(tmp_path, max_staleness=3)  # so that all 160 steps are stored while paused

    async def first_run() -> None:
        trainer = Trainer(config, build_layout(config))
        trainer.pause()  # as if trained and lost with the process: all of it stays in the journal
        trainer.save_checkpoint()
        for i in range(4):  # 160 steps: more than the pool's room of 128
            await trainer.submit("c", _records(i * 1000), {"default_policy": 0}, False, env_steps=40,
                                 batch=BatchId("s", i + 1))
        trainer.journal.close()  # killed

    asyncio.run(first_run())

    async def resumed_run() -> None:
        trainer = Trainer(_config(tmp_path, resume=str(tmp_path / "checkpoint.pt"), max_staleness=3),
                          build_layout(config))
        assert trainer.pool_steps == 160
        await asyncio.wait_for(trainer.submit("c", _records(9000), {"default_policy": 0}, False, env_steps=40,
                                              batch=BatchId("s", 9)), 60)
        await trainer.close(checkpoint=False)
        assert trainer.metrics.updates >= 1

    asyncio.run(resumed_run())


def test_close_starts_no_update_after_the_running_one(tmp_path) -> None:
    """SIGTERM while an update runs and the pool holds another batch: the final checkpoint holds
    that batch in its pool and the version of the weights it holds (no update starts behind it)."""
    config = _config(tmp_path, pool_journal=False)  # (submit returns while the update still runs)

    async def run() -> None:
        trainer = Trainer(config, build_layout(config))
        # 128 steps in one message: the first 64 start an update at once, 64 stay pooled.
        await trainer.submit("c", _records(0, steps=64, episodes=2), {"default_policy": 0}, False, env_steps=128,
                             batch=BatchId("s", 1))
        assert trainer.learner_loop.running is not None
        await trainer.close()
        assert trainer.metrics.updates == 1

    asyncio.run(run())
    from tether.server.checkpoint import load_checkpoint

    assert load_checkpoint(tmp_path / "checkpoint.pt")["modules"]["default_policy"]["weights_seq_no"] == 1
    assert _pool_ids(tmp_path / "checkpoint.pt") == list(range(64, 128))


def test_a_console_checkpoint_waiting_when_close_begins_starts_no_update(tmp_path) -> None:
    """The console asks for a checkpoint while an update runs, then the server is told to stop:
    the checkpoint, once written, must not let the next update start behind close (which would
    train the pooled batch into weights the final checkpoint labels with the older version)."""
    config = _config(tmp_path, pool_journal=False)

    async def run() -> None:
        trainer = Trainer(config, build_layout(config))
        await trainer.submit("c", _records(0, steps=64, episodes=2), {"default_policy": 0}, False, env_steps=128,
                             batch=BatchId("s", 1))
        assert trainer.learner_loop.running is not None
        console_checkpoint = asyncio.ensure_future(trainer.checkpoint_now())
        await asyncio.sleep(0)
        await trainer.close()
        await console_checkpoint  # (written, not failed on a shut-down executor)
        assert trainer.metrics.updates == 1

    asyncio.run(run())
    from tether.server.checkpoint import load_checkpoint

    assert load_checkpoint(tmp_path / "checkpoint.pt")["modules"]["default_policy"]["weights_seq_no"] == 1
    assert _pool_ids(tmp_path / "checkpoint.pt") == list(range(64, 128))


def test_a_resume_into_another_folder_is_resumable_from_there(tmp_path) -> None:
    """--resume a/checkpoint.pt --logdir b, a batch answered, kill -9 before b's first periodic
    checkpoint: resuming from b's checkpoint has the weights, a's pool and journal, and the batch."""
    a, b = tmp_path / "a", tmp_path / "b"
    config = _config(a)

    async def run_a() -> None:
        trainer = Trainer(config, build_layout(config))
        trainer.pause()
        await trainer.submit("c", _records(0), {"default_policy": 0}, False, env_steps=40, batch=BatchId("s", 1))
        trainer.save_checkpoint()  # batch 1 in its pool
        await trainer.submit("c", _records(1000), {"default_policy": 0}, False, env_steps=40, batch=BatchId("s", 2))
        trainer.journal.close()  # killed: batch 2 in a's journal only

    async def run_b() -> None:
        trainer = Trainer(_config(b, resume=str(a / "checkpoint.pt")), build_layout(config))
        trainer.pause()
        await trainer.submit("c", _records(2000), {"default_policy": 0}, False, env_steps=40, batch=BatchId("s", 3))
        trainer.journal.close()  # killed before any checkpoint of its own

    asyncio.run(run_a())
    asyncio.run(run_b())
    resumed = Trainer(_config(b, resume=str(b / "checkpoint.pt")), build_layout(config))
    ids = sorted(int(i) for p in resumed.pool.items() for i in p.chunk.obs[:-1, 0])
    assert ids == [*range(0, 40), *range(1000, 1040), *range(2000, 2040)]
    assert resumed.dedup.is_duplicate(BatchId("s", 3))
    resumed.journal.close()


def test_a_journal_folder_emptied_before_a_resume_does_not_hide_what_comes_after(tmp_path) -> None:
    """The journal numbering starts again at the checkpoint's generation at least: records written
    after a resume whose journal folder was empty are replayed by the next resume."""
    import shutil

    config = _config(tmp_path)

    async def first_run() -> None:
        trainer = Trainer(config, build_layout(config))
        trainer.save_checkpoint()
        trainer.save_checkpoint()  # the journal is at generation 2 now
        trainer.journal.close()

    async def second_run() -> None:
        trainer = Trainer(_config(tmp_path, resume=str(tmp_path / "checkpoint.pt")), build_layout(config))
        trainer.pause()
        await trainer.submit("c", _records(0), {"default_policy": 0}, False, env_steps=40, batch=BatchId("s", 1))
        trainer.journal.close()  # killed

    asyncio.run(first_run())
    shutil.rmtree(tmp_path / "journal")
    asyncio.run(second_run())
    resumed = Trainer(_config(tmp_path, resume=str(tmp_path / "checkpoint.pt")), build_layout(config))
    assert sorted(int(i) for p in resumed.pool.items() for i in p.chunk.obs[:-1, 0]) == list(range(40))
    resumed.journal.close()


def test_a_failed_write_neither_skips_a_rotation_nor_hangs_close(tmp_path) -> None:
    """A record that cannot be written is counted; the rotation queued after it still happens
    (later records go to the new generation) and close returns."""
    bad = JournalEntry(BatchId("s", 1), [item(0)], 3, 3)
    bad.items[0].chunk.episode_id = object()  # not encodable

    async def write() -> None:
        journal = PoolJournal(tmp_path, 0)
        journal.append_now([bad])
        journal.rotate()
        await journal.append(JournalEntry(BatchId("s", 2), [item(10)], 3, 3))
        assert journal.failures == 1
        journal.close()

    asyncio.run(asyncio.wait_for(write(), 30))
    assert [e.batch.batch_seq for e in read_journal(tmp_path, 1)] == [2]


def test_the_consoles_checkpoint_waits_for_the_running_update(tmp_path) -> None:
    """The console's checkpoint control, sent while an update runs: the checkpoint holds the
    weights of one version with that version's number, and the pool as it is between updates."""
    from tether.server.checkpoint import load_checkpoint
    from tether.server.console.controls import apply_control
    from tether.server.console.state import ConsoleState

    config = _config(tmp_path, pool_journal=False)

    async def run() -> None:
        trainer = Trainer(config, build_layout(config))
        await trainer.submit("c", _records(0, steps=64, episodes=2), {"default_policy": 0}, False, env_steps=128,
                             batch=BatchId("s", 1))
        assert trainer.learner_loop.running is not None
        done = await apply_control(ConsoleState(trainer), "tok", {"token": "tok", "action": "checkpoint"})
        saved = load_checkpoint(done["path"])
        assert saved["modules"]["default_policy"]["weights_seq_no"] == trainer.weights_seq_no == 1
        assert not trainer.paused
        await trainer.close(checkpoint=False)

    asyncio.run(run())
    assert _pool_ids(tmp_path / "checkpoint.pt") == list(range(64, 128))


def test_a_failed_write_leaves_no_torn_record_before_later_ones(tmp_path) -> None:
    """A write that fails half way (disk full) is cut off, so the records written after it are replayed."""
    class HalfThenFull:
        def __init__(self, raw) -> None:
            self.raw, self.fail_next = raw, False

        def write(self, data) -> int:
            if self.fail_next:
                self.fail_next = False
                self.raw.write(bytes(data[: len(data) // 2]))
                raise OSError(28, "No space left on device")
            return self.raw.write(data)

        def __getattr__(self, name):
            return getattr(self.raw, name)

    async def write() -> PoolJournal:
        journal = PoolJournal(tmp_path, 0)
        await journal.append(JournalEntry(BatchId("s", 1), [item(0)], 3, 3))
        journal._file = HalfThenFull(journal._file)
        journal._file.fail_next = True
        await journal.append(JournalEntry(BatchId("s", 2), [item(10)], 3, 3))
        await journal.append(JournalEntry(BatchId("s", 3), [item(20)], 3, 3))
        journal.close()
        return journal

    journal = asyncio.run(write())
    assert journal.failures == 1
    assert [e.batch.batch_seq for e in read_journal(tmp_path, 0)] == [1, 3]


def test_a_new_run_in_an_old_runs_folder_replaces_its_checkpoint_at_once(tmp_path) -> None:
    """Else a --resume before the new run's first periodic checkpoint would put the new run's
    journal on the old run's weights."""
    from tether.server.checkpoint import load_checkpoint

    config = ServerConfig(tensorboard=False, logdir=str(tmp_path), quiet=True)
    old = Trainer(config, build_layout(config))
    old.modules["default_policy"].weights_seq_no = 7
    old.save_checkpoint()
    old.journal.close()
    new = Trainer(config, build_layout(config))
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert state["modules"]["default_policy"]["weights_seq_no"] == 0
    assert state["journal_generation"] == new.journal.generation
    new.journal.close()
