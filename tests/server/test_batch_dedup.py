"""The exactly-once table is bounded (least recently used sessions go first)
and a resend racing its original waits for it, then counts as a duplicate."""

from __future__ import annotations

import asyncio

import pytest

from tether.protocol import MessageError
from tether.server.ingest.batch_dedup import BatchDedup, BatchId, batch_id


def test_table_is_bounded_lru_and_round_trips() -> None:
    dedup = BatchDedup(max_sessions=3)
    for s in "abc":
        dedup.mark_stored(BatchId(s, 1))
    dedup.mark_stored(BatchId("a", 2))  # "a" is now the most recent
    dedup.mark_stored(BatchId("d", 1))  # evicts "b"
    assert dedup.state() == {"c": 1, "a": 2, "d": 1}
    restored = BatchDedup(max_sessions=3)
    restored.load_state(dedup.state())
    assert restored.is_duplicate(BatchId("a", 2)) and not restored.is_duplicate(BatchId("a", 3))
    assert batch_id({}) is None
    with pytest.raises(MessageError):
        batch_id({"client_session": "a"})


def test_a_resend_racing_its_original_is_a_duplicate() -> None:
    async def scenario() -> list[bool]:
        dedup, seen = BatchDedup(), []

        async def send(delay: float) -> None:
            async with dedup.slot(BatchId("s", 1)) as duplicate:
                seen.append(duplicate)
                await asyncio.sleep(delay)  # the original is still being stored

        await asyncio.gather(send(0.05), send(0.0))
        return seen

    assert asyncio.run(scenario()) == [False, True]
