"""The sample pool hands out at most one batch of agent steps, splitting a
chunk exactly where the batch is full, and makes senders wait while full."""

from __future__ import annotations

import asyncio

import numpy as np

from tether.sdk.protocol import EpisodeChunk
from tether.server.sample_pool import Pooled, SamplePool


def chunk(steps: int, terminated: bool = True) -> EpisodeChunk:
    obs = np.arange(steps + 1, dtype=np.float32)[:, None]
    return EpisodeChunk(obs, np.arange(steps) % 2, np.arange(steps, dtype=np.float32), np.full(steps, -0.7, np.float32),
                        None, terminated, False, "e", value_obs=np.repeat(obs, 2, axis=1))


def test_take_splits_the_last_chunk_at_the_batch_size() -> None:
    pool = SamplePool(batch_steps=10, capacity=20)
    pool.add(Pooled("m", chunk(4), 0))
    pool.add(Pooled("m", chunk(9), 0))
    batch = pool.take()
    assert [p.chunk.env_steps for p in batch] == [4, 6] and pool.steps == 3
    head, (tail,) = batch[1].chunk, [p.chunk for p in [pool.take()[0]]]
    assert not head.is_terminated and tail.is_terminated  # the cut part is bootstrapped, the end keeps its flag
    assert head.obs[-1, 0] == tail.obs[0, 0] == 6.0  # o_6 ends one part and starts the other
    assert list(head.rewards) + list(tail.rewards) == list(range(9))
    assert head.value_obs.shape == (7, 2) and tail.value_obs.shape == (4, 2)


def test_senders_wait_while_the_pool_is_full() -> None:
    async def scenario() -> list[str]:
        pool, events = SamplePool(batch_steps=10, capacity=20), []
        pool.add(Pooled("m", chunk(25), 0))

        async def sender() -> None:
            await pool.wait_for_room()
            events.append("stored")

        task = asyncio.create_task(sender())
        await asyncio.sleep(0.05)
        events.append("update")
        pool.take()  # 15 left: below capacity
        await asyncio.wait_for(task, 1)
        return events

    assert asyncio.run(scenario()) == ["update", "stored"]
