"""The sample pool hands out at most one batch of agent steps, splitting a
chunk exactly where the batch is full, and makes senders wait while full."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np

from tether.protocol import EpisodeChunk
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


def oracle_parts(pool: SamplePool, running: set[str], versions: dict[str, int], module: str, step_versions: list[int],
                 max_staleness: int) -> list[tuple[int, int]]:
    """The parts of a chunk to store, found by playing the FIFO forward for each step in turn: a step is
    stored when, appended after the steps stored before it, it is trained within max_staleness."""
    def staleness_of_last(stored: list[int]) -> int:
        v = {m: n + (m in running) for m, n in versions.items()}
        queue = [[p.module_id, p.chunk.env_steps, None] for p in pool.items()] + [[module, 1, s] for s in stored]
        while queue:
            room, trained = pool.batch_steps, set()
            while queue and room:
                item = queue[0]
                n = min(item[1], room)
                trained.add(item[0])
                if item[2] is not None and len(queue) == 1:
                    return v[module] - item[2]
                item[1] -= n
                room -= n
                if item[1] == 0:
                    queue.pop(0)
            for m in trained:
                v[m] += 1
        raise AssertionError("unreachable")

    stored: list[int] = []
    kept: list[int] = []
    for i, version in enumerate(step_versions):
        if staleness_of_last(stored + [version]) <= max_staleness:
            stored.append(version)
            kept.append(i)
    parts: list[tuple[int, int]] = []
    for i in kept:
        if parts and parts[-1][1] == i:
            parts[-1] = (parts[-1][0], i + 1)
        else:
            parts.append((i, i + 1))
    return parts


def test_admission_stores_exactly_the_steps_an_update_takes_in_time() -> None:
    """Random traffic of three modules, with per-step versions that grow along a chunk, and updates in
    between: the stored parts of every chunk are the ones playing the FIFO forward finds, and no step an
    update takes is older than max_staleness."""
    from tether.server.sample_pool import Admission, part_of

    rng = np.random.default_rng(3)
    refused = split_end = split_start = gaps = 0
    for max_staleness, with_drops in ((0, False), (1, False), (2, False), (1, True)):
        pool, versions, running = SamplePool(batch_steps=10, capacity=10_000), {"a": 0, "b": 0, "c": 0}, set()
        for _ in range(400):
            op = rng.random()
            if op < 0.6:
                module, steps = str(rng.choice(["a", "b", "c"])), int(rng.integers(1, 25))
                step_versions = sorted(int(versions[module] - rng.integers(0, 3)) for _ in range(steps))
                expected = oracle_parts(pool, running, versions, module, step_versions, max_staleness)
                admission = Admission(pool, running)
                parts = admission.fresh_parts(module, versions[module] - np.array(step_versions), max_staleness)
                assert parts == expected, (max_staleness, module, step_versions, versions, running)
                refused += steps - sum(e - s for s, e in parts)
                split_start += bool(parts) and parts[0][0] > 0
                split_end += bool(parts) and parts[-1][1] < steps
                gaps += len(parts) > 1
                c = replace(chunk(steps), step_versions=np.array(step_versions))
                for start, end in parts:
                    part = part_of(c, start, end)
                    assert list(part.step_versions) == step_versions[start:end]
                    assert np.array_equal(part.obs, c.obs[start:end + 1])
                    pool.add(Pooled(module, part, min(step_versions[start:end])))
            elif op < 0.63 and with_drops and not running and pool.steps:  # a refused client's data goes (renumbers the rest)
                gone = str(rng.choice(["a", "b", "c"]))
                pool.drop(lambda p: p.module_id != gone or rng.random() < 0.5)
            elif op < 0.65 and not running and 0 < pool.steps < pool.batch_steps:  # a short take empties the pool
                running = {p.module_id for p in pool.take()}
            elif op < 0.8 and not running and pool.steps >= pool.batch_steps:
                # The update's own staleness drop: only data moved forward by a removal can be stale.
                stale = pool.drop(lambda p: versions[p.module_id] - p.weights_seq_no <= max_staleness)
                assert with_drops or stale == 0
                if pool.steps < pool.batch_steps:
                    continue
                taken = pool.take()
                for p in taken:  # every step, by its own version, and the item as the update's drop judges it
                    assert all(versions[p.module_id] - v <= max_staleness for v in p.chunk.step_versions)
                    assert versions[p.module_id] - p.weights_seq_no <= max_staleness
                running = {p.module_id for p in taken}
            elif running:
                for m in running:
                    versions[m] += 1
                running = set()
            for m in "abc":  # the pool's running account of which updates take a module equals a walk
                start, walked = 0, set()
                for p in pool.items():
                    n = p.chunk.env_steps
                    if p.module_id == m and n:
                        walked.update(range(start // pool.batch_steps, (start + n - 1) // pool.batch_steps + 1))
                    start += n
                assert pool.updates_with(m) == walked
    assert refused and split_start and split_end and gaps, "the traffic must exercise refusals and every cut"


def test_admission_counts_chunks_of_one_message_in_order() -> None:
    """Two 10-step chunks of one message at staleness 1 with max_staleness 1 and an empty pool: the first
    is taken by the next update; the second by the one after, when the first has made it two versions old."""
    from tether.server.sample_pool import Admission

    pool = SamplePool(batch_steps=10, capacity=100)
    admission = Admission(pool, set())
    assert admission.fresh_parts("m", np.full(10, 1), 1) == [(0, 10)]
    admission.append("m", 10)
    assert admission.fresh_parts("m", np.full(10, 1), 1) == []
    assert admission.fresh_parts("other", np.full(10, 1), 1) == [(0, 10)]  # another module's version does not move
    # Per step: one held-back step two versions old is refused alone, not its whole chunk.
    assert Admission(pool, set()).fresh_parts("other", np.array([2, 0, 0, 0]), 1) == [(1, 4)]


def test_old_steps_crossing_an_update_do_not_cost_the_fresh_ones_after_them() -> None:
    """Updates of 10, 8 steps of another module pooled, max_staleness 1, a chunk of 4 steps one version
    old then 6 current ones: the first two old steps fit the next update, the other two would be trained
    after it (two versions old) and are refused; the six current ones, one version old then, are kept."""
    from tether.server.sample_pool import Admission

    pool = SamplePool(batch_steps=10, capacity=100)
    pool.add(Pooled("other", chunk(8), 0))
    assert Admission(pool, set()).fresh_parts("m", np.array([1] * 4 + [0] * 6), 1) == [(0, 2), (4, 10)]
