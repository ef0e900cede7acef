"""Who owns a client's episode state, and how long it is kept after the client leaves.

A batch that names a ``client_session`` (protocol 1.3) is owned by that session, so
its ongoing episodes survive a reconnect; otherwise by its connection. A connection's
own state is freed as it closes; a session's once no connection has used it for
``session_state_ttl_s``.
"""

from __future__ import annotations

import asyncio
from typing import Hashable

from .free_memory import TRIM_AFTER_ENTRIES, release_free_memory
from .ingest.batch_dedup import BatchId
from .ingest.validation import EpisodeIngest
from .metrics import EpisodeTracker


class SessionOwners:
    """The owners of per-episode state (in ``ingest`` and ``episodes``) and their expiry."""

    def __init__(self, ttl_s: float, ingest: EpisodeIngest, episodes: EpisodeTracker) -> None:
        self.ttl_s = ttl_s
        self.ingest = ingest
        self.episodes = episodes
        #: client_session -> connections using it, and expiry timers of sessions no connection uses.
        self._users: dict[str, set[Hashable]] = {}
        self._expiry: dict[str, asyncio.TimerHandle] = {}

    def owner(self, connection: Hashable, batch: BatchId | None) -> Hashable:
        """Who owns episode state: the client_session when the batch names one
        (so it survives a reconnect), else the connection."""
        if batch is None:
            return connection
        session = batch.client_session
        self._users.setdefault(session, set()).add(connection)
        timer = self._expiry.pop(session, None)
        if timer is not None:
            timer.cancel()
        return ("client_session", session)

    def forget_connection(self, connection: Hashable) -> None:
        """A connection closed: free its episode state now, and that of its
        client_sessions once no connection has used them for session_state_ttl_s."""
        self._forget(connection)
        for session, users in list(self._users.items()):
            users.discard(connection)
            if not users:
                del self._users[session]
                loop = asyncio.get_running_loop()
                self._expiry[session] = loop.call_later(self.ttl_s, self._expire, session)

    def _expire(self, session: str) -> None:
        self._expiry.pop(session, None)
        if session not in self._users:
            self._forget(("client_session", session))

    def _forget(self, owner: Hashable) -> None:
        held = self.ingest.open_state_size() + self.episodes.open_size()
        self.ingest.forget(owner)
        self.episodes.forget(owner)
        if held - self.ingest.open_state_size() - self.episodes.open_size() >= TRIM_AFTER_ENTRIES:
            release_free_memory()
