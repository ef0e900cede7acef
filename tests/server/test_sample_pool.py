"""The sample pool hands out at most one batch of agent steps, splitting a
chunk exactly where the batch is full, and makes senders wait while full."""

from __future__ import annotations

import asyncio
from dataclasses import replace

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


def oracle_part(pool: SamplePool, running: set[str], versions: dict[str, int], module: str, step_versions: list[int],
                max_staleness: int) -> tuple[int, int]:
    """The part of a chunk to store, found by playing the FIFO forward: it starts at the first step that
    would be fresh enough stored first, and ends before the first later step that is not."""
    def staleness_when_trained(steps: list[int]) -> list[int]:
        v = {m: n + (m in running) for m, n in versions.items()}
        queue = [[p.module_id, p.chunk.env_steps, False] for p in pool.items()] + [[module, len(steps), True]]
        out, done = [], 0
        while queue:
            room, trained = pool.batch_steps, set()
            while queue and room:
                item = queue[0]
                n = min(item[1], room)
                trained.add(item[0])
                if item[2]:
                    out += [v[module] - s for s in steps[done:done + n]]
                    done += n
                item[1] -= n
                room -= n
                if item[1] == 0:
                    queue.pop(0)
            for m in trained:
                v[m] += 1
        return out

    for start in range(len(step_versions)):
        stale = staleness_when_trained(step_versions[start:])
        if stale[0] <= max_staleness:
            ok = [s <= max_staleness for s in stale]
            return start, start + (ok.index(False) if False in ok else len(ok))
    return 0, 0


def test_admission_stores_exactly_the_steps_an_update_takes_in_time() -> None:
    """Random traffic of two modules, with per-step versions that grow along a chunk, and updates in
    between: the stored part of every chunk is the one playing the FIFO forward finds, and no step an
    update takes is older than max_staleness."""
    from tether.server.sample_pool import Admission, part_of

    rng = np.random.default_rng(3)
    for max_staleness in (0, 1, 2):
        pool, versions, running = SamplePool(batch_steps=10, capacity=10_000), {"a": 0, "b": 0}, set()
        refused = split_end = split_start = 0
        for _ in range(400):
            op = rng.random()
            if op < 0.6:
                module, steps = str(rng.choice(["a", "b"])), int(rng.integers(1, 13))
                step_versions = sorted(int(versions[module] - rng.integers(0, 4)) for _ in range(steps))
                expected = oracle_part(pool, running, versions, module, step_versions, max_staleness)
                admission = Admission(pool, running)
                start, end = admission.fresh_part(module, versions[module] - np.array(step_versions), max_staleness)
                assert (start, end) == expected, (max_staleness, module, step_versions, versions, running)
                refused += steps - (end - start)
                split_start += start > 0
                split_end += 0 < end < steps
                if end > start:
                    c = replace(chunk(steps), step_versions=np.array(step_versions))
                    part = part_of(c, start, end)
                    assert list(part.step_versions) == step_versions[start:end]
                    pool.add(Pooled(module, part, min(step_versions[start:end])))
            elif op < 0.8 and not running and pool.steps >= pool.batch_steps:
                taken = pool.take()
                for p in taken:  # every step, by its own version, and the item as the update's drop judges it
                    assert all(versions[p.module_id] - v <= max_staleness for v in p.chunk.step_versions)
                    assert versions[p.module_id] - p.weights_seq_no <= max_staleness
                running = {p.module_id for p in taken}
            elif running:
                for m in running:
                    versions[m] += 1
                running = set()
        assert refused and split_start and split_end, "the traffic must exercise refusals and both kinds of cut"


def test_admission_counts_chunks_of_one_message_in_order() -> None:
    """Two 10-step chunks of one message at staleness 1 with max_staleness 1 and an empty pool: the first
    is taken by the next update; the second by the one after, when the first has made it two versions old."""
    from tether.server.sample_pool import Admission

    pool = SamplePool(batch_steps=10, capacity=100)
    admission = Admission(pool, set())
    assert admission.fresh_part("m", np.full(10, 1), 1) == (0, 10)
    admission.append("m", 10)
    assert admission.fresh_part("m", np.full(10, 1), 1) == (0, 0)
    assert admission.fresh_part("other", np.full(10, 1), 1) == (0, 10)  # another module's version does not move
    # Per step: one held-back step two versions old is refused alone, not its whole chunk.
    assert Admission(pool, set()).fresh_part("other", np.array([2, 0, 0, 0]), 1) == (1, 4)
