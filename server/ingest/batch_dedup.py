"""Exactly-once batches (protocol 1.3): which (client_session, batch_seq) were stored.

A client names its batches with a session id it keeps across reconnects and a
sequence number that grows by one per batch. The server remembers, per session,
the highest sequence number it stored; a batch at or below it is a duplicate
(a resend whose answer was lost) and is answered without being stored again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from typing import Any, AsyncIterator, NamedTuple

from tether.protocol.errors import ErrorCode, MessageError
from tether.protocol.messages import is_text

#: Sessions remembered; the least recently used is forgotten first.
MAX_SESSIONS = 65_536
MAX_SESSION_CHARS = 128


class BatchId(NamedTuple):
    client_session: str
    batch_seq: int


def batch_id(message: dict[str, Any]) -> BatchId | None:
    """The message's (client_session, batch_seq), None when it has neither; INVALID_FIELD when malformed."""
    session, seq = message.get("client_session"), message.get("batch_seq")
    if session is None and seq is None:
        return None
    if session is None or seq is None:
        raise MessageError(ErrorCode.INVALID_FIELD, '"client_session" and "batch_seq" come together: give both or neither')
    if not isinstance(session, str) or not 1 <= len(session) <= MAX_SESSION_CHARS:
        raise MessageError(ErrorCode.INVALID_FIELD, f'"client_session" must be a string of 1 to {MAX_SESSION_CHARS} characters')
    if not is_text(session):  # it is kept (and checkpointed): Unicode text only (§4.1)
        raise MessageError(ErrorCode.INVALID_FIELD, f'"client_session" {session!r} is not Unicode text (a lone surrogate)')
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise MessageError(ErrorCode.INVALID_FIELD, '"batch_seq" must be an integer >= 1')
    return BatchId(session, seq)


class BatchDedup:
    """client_session -> highest stored batch_seq, bounded (LRU), with one lock per
    session so that a resend racing its original waits and is then seen as a duplicate."""

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._stored: OrderedDict[str, int] = OrderedDict()
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self.duplicates = 0

    def __len__(self) -> int:
        return len(self._stored)

    def is_duplicate(self, batch: BatchId) -> bool:
        return batch.batch_seq <= self._stored.get(batch.client_session, 0)

    def mark_stored(self, batch: BatchId) -> None:
        self._stored[batch.client_session] = max(batch.batch_seq, self._stored.get(batch.client_session, 0))
        self._stored.move_to_end(batch.client_session)
        while len(self._stored) > self.max_sessions:
            self._stored.popitem(last=False)

    @contextlib.asynccontextmanager
    async def slot(self, batch: BatchId | None) -> AsyncIterator[bool]:
        """Hold the batch's session while it is checked and stored; yields whether it is a
        duplicate. Leaving without an exception marks a new batch stored; an error
        (a refused batch) does not advance the session's counter."""
        if batch is None:
            yield False
            return
        lock, users = self._locks.setdefault(batch.client_session, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                duplicate = self.is_duplicate(batch)
                if duplicate:
                    self.duplicates += 1
                yield duplicate
                if not duplicate:
                    self.mark_stored(batch)
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[batch.client_session]

    def state(self) -> dict[str, int]:
        """What a checkpoint keeps (oldest first)."""
        return dict(self._stored)

    def load_state(self, state: dict[str, int]) -> None:
        self._stored = OrderedDict((str(k), int(v)) for k, v in state.items())
        while len(self._stored) > self.max_sessions:
            self._stored.popitem(last=False)


def merged_marks(tables: list[dict[str, int]]) -> dict[str, int]:
    """The exactly-once marks of several ranks as one table (protocol §6.7): per client_session, the
    highest batch_seq any of them stored. Each table is ordered oldest first (as ``state`` gives it);
    the merged one interleaves them by recency, every table's most recent sessions last, so that a
    table trimmed to its limit (``load_state``) drops the sessions longest unused on every rank, never
    one rank's recent ones."""
    merged: dict[str, int] = {}
    recency: dict[str, int] = {}  # session -> its place from the newest end (0: most recent), the least of any rank
    for marks in tables:
        for place, (session, seq) in enumerate(reversed(list(marks.items()))):
            merged[session] = max(int(seq), merged.get(session, 0))
            recency[session] = min(place, recency.get(session, place))
    return {session: merged[session] for session in sorted(merged, key=lambda s: -recency[s])}
