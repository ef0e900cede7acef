"""Composite observations with byte leaves wait in the pool, the journal and checkpoints packed (float
leaves as float32, byte leaves as uint8) and reach the learner as the flat float32 rows they were
decoded as: exactly, for rows, recurrent prefixes and batches that mix packed and float chunks."""

from __future__ import annotations

import asyncio

import numpy as np

from tether.protocol.episodes import EpisodeChunk
from tether.protocol.multi_agent import AgentChunk, MultiAgentRecord
from tether.protocol.spaces import Dict, Discrete, Tuple, box
from tether.server.config import ServerConfig
from tether.server.ingest.batch_dedup import BatchId
from tether.server.learner import build_batch
from tether.server.learner.packed_observations import ObservationPacking
from tether.server.module_setup import build_layout
from tether.server.pool_journal import decode_entries, encode_entry
from tether.server.sample_pool import split_chunk
from tether.server.trainer import Trainer

CAMERA = box(0, 255, (6, 5, 3), dtype="uint8")
# Float and byte leaves interleaved, and an odd byte count (the packed row is padded).
SCENE = Dict((("action_mask", box(0, 1, (3,))), ("camera", CAMERA), ("speed", box(-1, 1, (2,))),
              ("tag", box(0, 255, (1,), dtype="uint8"))))


def rows(count: int, seed: int = 0) -> np.ndarray:
    """Flat float32 rows of SCENE as ingest decodes them: integers 0-255 in the byte leaves."""
    rng = np.random.default_rng(seed)
    out = rng.normal(size=(count, SCENE.flat_dim)).astype(np.float32)
    for leaf in SCENE.leaves:
        if leaf.is_bytes:
            out[:, leaf.offset:leaf.offset + leaf.size] = rng.integers(0, 256, (count, leaf.size))
    out[:, 0:3] = 1.0
    return out


def test_packed_rows_unpack_to_the_same_rows_in_a_quarter_of_the_memory() -> None:
    packing = ObservationPacking.of(SCENE)
    assert packing is not None
    flat = rows(7)
    packed = packing.pack(flat)
    assert packed.dtype == np.uint8 and packed.shape == (7, packing.row_bytes) and packing.row_bytes % 4 == 0
    assert packed.nbytes <= 0.3 * flat.nbytes
    np.testing.assert_array_equal(packing.unpack(packed), flat)
    np.testing.assert_array_equal(packing.unpack(flat), flat)  # (float rows pass as they are)


def test_only_composite_spaces_with_byte_leaves_are_packed() -> None:
    assert ObservationPacking.of(CAMERA) is None  # (a plain byte box is pooled as its bytes already)
    assert ObservationPacking.of(box(-1, 1, (4,))) is None
    assert ObservationPacking.of(Dict((("a", box(-1, 1, (2,))), ("b", box(0, 1, (3,)))))) is None
    assert ObservationPacking.of(Tuple((Discrete(3), CAMERA))) is not None


def _chunk(steps: int, seed: int, prefix: int = 0) -> EpisodeChunk:
    rng = np.random.default_rng(seed)
    return EpisodeChunk(rows(steps + 1, seed), rng.integers(0, 3, steps).astype(np.float64),
                        rng.normal(size=steps).astype(np.float32), np.full(steps, -1.1, np.float32), None,
                        True, False, f"e{seed}", state_in=np.zeros((2, 4), np.float32),
                        state_prefix=rows(prefix, seed + 100) if prefix else None)


def test_a_batch_of_packed_and_float_chunks_is_the_batch_of_the_float_chunks() -> None:
    packing = ObservationPacking.of(SCENE)
    assert packing is not None
    chunks = [_chunk(5, 1), _chunk(3, 2, prefix=4), _chunk(4, 3)]
    # A packed chunk split in the pool: its tail's recurrent prefix is packed rows too.
    head, tail = split_chunk(packing.pack_chunk(chunks[0]), 2)
    assert tail.state_prefix is not None and tail.state_prefix.dtype == np.uint8
    float_head, float_tail = split_chunk(chunks[0], 2)
    want = build_batch([float_head, float_tail, chunks[1], chunks[2]])
    for mixed in ([head, tail, packing.pack_chunk(chunks[1]), packing.pack_chunk(chunks[2])],
                  [head, tail, chunks[1], packing.pack_chunk(chunks[2])]):
        got = build_batch(mixed, packing)
        np.testing.assert_array_equal(got.all_obs, want.all_obs)
        np.testing.assert_array_equal(got.obs, want.obs)
        assert got.all_obs.dtype == np.float32
        for a, b in zip(got.state_prefix, want.state_prefix):
            assert (a is None) == (b is None)
            if a is not None:
                np.testing.assert_array_equal(a, b)


def _config(tmp_path, **kw) -> ServerConfig:
    return ServerConfig(observation_space=SCENE.to_json(), action_space=Discrete(3).to_json(), tensorboard=False,
                        logdir=str(tmp_path), quiet=True, train_batch_size=32, num_epochs=1, minibatch_size=16,
                        verify_action_logp=False, model={"encoder": "cnn", "conv": [[4, 3, 1]], "dense": 8}, **kw)


def _record(seed: int) -> MultiAgentRecord:
    chunk = _chunk(16, seed)
    chunk = EpisodeChunk(chunk.obs, chunk.actions, chunk.rewards, chunk.action_logp, None, True, False, f"e{seed}")
    return MultiAgentRecord(chunk.episode_id, True, False, [AgentChunk("default_agent", "default_policy", 0, chunk)])


def _batches_seen(trainer: Trainer) -> list[np.ndarray]:
    """The flat rows of every batch the trainer's learner updates on, from now on."""
    learner = trainer.modules["default_policy"].learner
    seen: list[np.ndarray] = []
    update = learner.update

    def recording_update(batch, *args, **kwargs):
        seen.append(batch.all_obs.copy())
        return update(batch, *args, **kwargs)

    learner.update = recording_update
    return seen


def test_the_trainer_pools_and_journals_packed_rows_and_trains_on_them(tmp_path) -> None:
    """A real trainer: a composite module's pooled chunks are packed, the journal holds them packed, and
    the update trains on rows equal to those the record carried."""
    trainer = Trainer(_config(tmp_path), build_layout(_config(tmp_path)))
    seen = _batches_seen(trainer)
    stored: list = []  # (each journal entry as a resume would read it back)
    assert trainer.journal is not None
    journal_append = trainer.journal.append

    def keep(entry):
        stored.append(decode_entries(encode_entry(entry))[0][0])
        return journal_append(entry)

    trainer.journal.append = keep

    async def run() -> None:
        for seed in (1, 2):
            records = [_record(seed)]
            if seed == 2:  # (a large message's records are packed beside the event loop first: submit keeps them)
                trainer.pack_records(records)
                assert records[0].agents[0].chunk.obs.dtype == np.uint8
            await trainer.submit("c", records, {"default_policy": 0}, False, env_steps=16)
        await asyncio.wait_for(trainer.learner_loop.published(), 60)
        await trainer.close(checkpoint=False)

    asyncio.run(run())
    assert trainer.metrics.updates == 1
    assert stored and all(p.chunk.obs.dtype == np.uint8 for e in stored for p in e.items)
    np.testing.assert_array_equal(seen[0], np.concatenate([_chunk(16, seed).obs for seed in (1, 2)]))


def test_a_resumed_trainer_replays_packed_rows_and_trains_on_the_rows_sent(tmp_path) -> None:
    config = _config(tmp_path)

    async def first_run() -> None:
        trainer = Trainer(config, build_layout(config))
        trainer.pause()
        trainer.save_checkpoint()
        for seed in (3, 4):
            await trainer.submit("c", [_record(seed)], {"default_policy": 0}, False, env_steps=16,
                                 batch=BatchId("s", seed))
        trainer.journal.close()  # (killed: the journal holds both batches)

    asyncio.run(first_run())
    resumed = Trainer(_config(tmp_path, resume=str(tmp_path / "checkpoint.pt")), build_layout(config))
    assert resumed.pool_steps == 32
    assert all(p.chunk.obs.dtype == np.uint8 for p in resumed.pool.items())  # (replayed as they were written)
    seen = _batches_seen(resumed)

    async def second_run() -> None:
        resumed.learner_loop.maybe_start()
        await asyncio.wait_for(resumed.learner_loop.published(), 60)
        await resumed.close(checkpoint=False)

    asyncio.run(second_run())
    assert resumed.metrics.updates == 1
    np.testing.assert_array_equal(seen[0], np.concatenate([_chunk(16, seed).obs for seed in (3, 4)]))
