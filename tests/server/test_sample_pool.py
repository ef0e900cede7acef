"""The sample pool hands out at most one batch of agent steps, splitting a
chunk exactly where the batch is full, and makes senders wait while full."""

from __future__ import annotations

import asyncio

import numpy as np

from tether.sdk.protocol import EpisodeChunk
from tether.server.sample_pool import Pooled, SamplePool, split_chunk


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


# -- admission: only what an update takes within max_staleness is stored --------------------


def oracle_staleness(pool: SamplePool, running: set[str], versions: dict[str, int], module: str, steps: int,
                     seq: int) -> list[int]:
    """Per step of a chunk appended now, its staleness when an update takes it, by playing the FIFO forward."""
    v = {m: n + (m in running) for m, n in versions.items()}
    queue = [[p.module_id, p.chunk.env_steps, False] for p in pool.items()] + [[module, steps, True]]
    out: list[int] = []
    while queue:
        room, trained = pool.batch_steps, set()
        while queue and room:
            item = queue[0]
            n = min(item[1], room)
            trained.add(item[0])
            if item[2]:
                out += [v[module] - seq] * n
            item[1] -= n
            room -= n
            if item[1] == 0:
                queue.pop(0)
        for m in trained:
            v[m] += 1
    return out


def test_admission_stores_exactly_the_steps_an_update_takes_in_time() -> None:
    """Random traffic of two modules with updates in between: the admitted head of every chunk is the
    longest one whose steps the FIFO trains within max_staleness (checked against playing it forward),
    and no step taken by an update is older than max_staleness."""
    from tether.server.sample_pool import Admission

    rng = np.random.default_rng(3)
    for max_staleness in (0, 1, 2):
        pool, versions, running = SamplePool(batch_steps=10, capacity=10_000), {"a": 0, "b": 0}, set()
        refused = partial = 0
        for _ in range(400):
            op = rng.random()
            if op < 0.6:
                module, steps = str(rng.choice(["a", "b"])), int(rng.integers(1, 13))
                seq = versions[module] - int(rng.integers(0, 3))
                expected = sum(s <= max_staleness for s in oracle_staleness(pool, running, versions, module, steps, seq))
                admission = Admission(pool, running)
                fresh = admission.fresh_steps(module, steps, versions[module] - seq, max_staleness)
                assert fresh == expected, (max_staleness, module, steps, seq, versions, running)
                refused += steps - fresh
                partial += 0 < fresh < steps
                if fresh:
                    pool.add(Pooled(module, chunk(steps) if fresh == steps else split_chunk(chunk(steps), fresh)[0], seq))
            elif op < 0.8 and not running and pool.steps >= pool.batch_steps:
                taken = pool.take()
                assert all(versions[p.module_id] - p.weights_seq_no <= max_staleness for p in taken)
                running = {p.module_id for p in taken}
            elif running:
                for m in running:
                    versions[m] += 1
                running = set()
        assert refused > 0 and partial > 0, "the traffic must exercise refusals and split chunks"


def test_admission_counts_chunks_of_one_message_in_order() -> None:
    """Two 10-step chunks of one message at staleness 1 with max_staleness 1 and an empty pool: the first
    is taken by the next update; the second by the one after, when the first has made it two versions old."""
    from tether.server.sample_pool import Admission

    pool = SamplePool(batch_steps=10, capacity=100)
    admission = Admission(pool, set())
    assert admission.fresh_steps("m", 10, 1, 1) == 10
    admission.append("m", 10)
    assert admission.fresh_steps("m", 10, 1, 1) == 0
    assert admission.fresh_steps("other", 10, 1, 1) == 10  # another module's version does not move
