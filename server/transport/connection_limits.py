"""What open connections may cost the server, counted the same for TCP and websocket.

- at most ``max_connections`` connections (TOO_MANY_CONNECTIONS), counted from a
  connection's first byte; of them at most ``max_handshaking`` still in their
  handshake: one more closes the oldest handshaking connection (HANDSHAKE_TIMEOUT),
  so silent sockets cannot lock clients out, and never an established one;
- with a token, an address that sent too many wrong tokens is refused for a while
  (AUTH_THROTTLED; see ``AuthThrottle``);
- the unfinished frames (or websocket messages) of all connections together hold at
  most ``max_partial_frame_bytes`` (the largest holder is closed, SERVER_OVERLOADED).

Each refusal is one unsolicited ERROR (no "request" field), then the connection is closed.
"""

from __future__ import annotations

import itertools
import sys
import time
from typing import Any, Callable

from tether.protocol.errors import ErrorCode
from tether.protocol.framing import encode_frame
from tether.protocol.messages import error_message

from ..config import ServerConfig
from .auth_throttle import AuthThrottle, peer_address
from .sockets import ACCEPT_ERROR_REPORT_S


def handshake_share(max_connections: int, configured: int = 0) -> int:
    """How many of ``max_connections`` may be handshaking at once (``configured``, 0: max(8, 1/8 of them))."""
    return max(1, min(max_connections, configured or max(8, max_connections // 8)))


class OpenConnection:
    """Transport-side bookkeeping of one connection, TCP or websocket, from its
    first byte: it counts toward max_connections (and, until its handshake is
    complete, toward the handshaking share of them) and holds its share of
    max_partial_frame_bytes."""

    __slots__ = ("key", "address", "partial_bytes", "evicted", "refusal", "established", "answering", "speaks_1_3",
                 "said_goodbye", "goodbye", "_evict")
    _keys = itertools.count(1)

    def __init__(self, evict: Callable[[bytes, bool], None], address: str | None = None) -> None:
        self.key = next(self._keys)
        #: What the peer's wrong auth tokens are counted under (see ``peer_address``).
        self.address = address
        #: Bytes of unfinished frames (or websocket messages) held for this connection.
        self.partial_bytes = 0
        #: Set when the server closed this connection for others (memory, or a handshaking slot).
        self.evicted = False
        #: The ERROR it is refused with as it arrives (TOO_MANY_CONNECTIONS, AUTH_THROTTLED), or None.
        self.refusal: bytes | None = None
        #: Set once its handshake is complete: from then on no newcomer can close it.
        self.established = False
        #: Set while one of its requests is being answered (a handshaking one is then not closed for a newcomer).
        self.answering = False
        #: Its PING announced protocol 1.3 or later (it is told TRAINING_DONE at the end of the run).
        self.speaks_1_3 = False
        #: Set once it was told TRAINING_DONE: nothing more is answered on it.
        self.said_goodbye = False
        #: How the transport says a final ERROR and lets the peer close first (TCP: write, then
        #: half-close and keep reading, so that bytes the peer still sends cannot reset the connection
        #: before it read the ERROR); None: ``evict`` (a websocket closes with a handshake of its own).
        self.goodbye: Callable[[bytes], None] | None = None
        self._evict = evict

    @property
    def over_limit(self) -> bool:
        """Whether it was refused on arrival (it is not counted among the open connections)."""
        return self.refusal is not None

    def say_goodbye(self, frame: bytes) -> None:
        """Send ``frame`` (ERROR TRAINING_DONE) as the last thing on this connection."""
        self.said_goodbye = True
        if self.goodbye is not None:
            self.goodbye(frame)
        else:
            self.evict(frame, False)

    def evict(self, frame: bytes, current: bool) -> None:
        """Send ``frame`` (a connection-level ERROR) and close; ``current``: its own handler is running now."""
        self.evicted = True
        self._evict(frame, current)


class ConnectionLimits:
    """Every open connection, TCP and websocket, and the limits they share."""

    def __init__(self, max_connections: int, max_partial_frame_bytes: int, max_handshaking_connections: int = 0,
                 auth_throttle: AuthThrottle | None = None) -> None:
        self.max_connections = max_connections
        #: As configured (0: a share of max_connections, see ``handshake_share``).
        self.max_handshaking_connections = max_handshaking_connections
        self.max_handshaking = handshake_share(max_connections, max_handshaking_connections)
        self.max_partial_frame_bytes = max_partial_frame_bytes
        #: Wrong auth tokens per address; None without a token (nothing to guess).
        self.auth_throttle = auth_throttle
        #: Connections past their handshake (the clients record_share is shared among, §13.2).
        self.established_connections = 0
        #: Connections refused or closed by a limit, by error code (for tests and logs).
        self.closed_by_limit: dict[str, int] = {}
        self._open: dict[int, OpenConnection] = {}
        #: Connections still in their handshake (see OpenConnection.established), oldest first.
        self._handshaking: dict[int, OpenConnection] = {}
        self._partial_total = 0
        self._last_throttle_report = -ACCEPT_ERROR_REPORT_S

    @classmethod
    def from_config(cls, config: ServerConfig) -> "ConnectionLimits":
        return cls(config.max_connections, max(config.max_partial_frame_bytes, config.max_frame_bytes),
                   config.max_handshaking_connections,
                   AuthThrottle(config.auth_max_failures, config.auth_backoff_max_s) if config.auth_token else None)

    def set_max_connections(self, max_connections: int) -> None:
        """Change max_connections (the open-file limit allows fewer); the handshaking share follows."""
        self.max_connections = max_connections
        self.max_handshaking = handshake_share(max_connections, self.max_handshaking_connections)

    def __len__(self) -> int:
        """Open connections (those refused on arrival are not counted)."""
        return len(self._open)

    def __contains__(self, conn: OpenConnection) -> bool:
        return conn.key in self._open

    def open_connections(self) -> list[OpenConnection]:
        """Every open connection, oldest first."""
        return list(self._open.values())

    @property
    def partial_total(self) -> int:
        """Bytes of unfinished frames (or websocket messages) all open connections hold."""
        return self._partial_total

    def count(self, code: ErrorCode) -> None:
        """Count a connection refused or closed by a limit."""
        self.closed_by_limit[code.value] = self.closed_by_limit.get(code.value, 0) + 1

    # -- memory held by unfinished frames ------------------------------------------

    def set_partial(self, conn: OpenConnection, nbytes: int) -> None:
        """Record what ``conn`` holds; over the global limit, close the largest holders.
        A connection closed, refused or evicted holds nothing the server counts: whatever
        its handler still reads before it ends is not added back."""
        if conn.evicted or self._open.get(conn.key) is not conn:
            return
        self._partial_total += nbytes - conn.partial_bytes
        conn.partial_bytes = nbytes
        while self._partial_total > self.max_partial_frame_bytes:
            # Connections still in their handshake go first: however many bytes they hold
            # together, they cannot make the server close an established one.
            victim = max(self._open.values(),
                         key=lambda c: (not c.established and c.partial_bytes > 0, c.partial_bytes))
            if victim.partial_bytes <= 0:  # (the counts disagree: never spin, never close a connection holding nothing)
                self._partial_total = sum(c.partial_bytes for c in self._open.values())
                break
            self.count(ErrorCode.SERVER_OVERLOADED)
            frame = encode_frame(error_message(
                ErrorCode.SERVER_OVERLOADED,
                f"the server holds {self._partial_total} bytes of unfinished frames from all clients, over its "
                f"limit of {self.max_partial_frame_bytes} (max_partial_frame_bytes); this connection held the "
                f"most ({victim.partial_bytes} bytes) and is closed",
            ))
            self._partial_total -= victim.partial_bytes
            victim.partial_bytes = 0
            victim.evict(frame, victim is conn)

    # -- connections -------------------------------------------------------------------

    def open_connection(self, evict: Callable[[bytes, bool], None], peer: Any = None) -> OpenConnection:
        """Counts a new connection (TCP accepted, or websocket at its first byte) from ``peer``
        (its address), handshaking until :meth:`establish`. With the handshaking share or all
        max_connections taken, it closes the oldest handshaking connection to make room; when
        none can be closed (all established), or its address is refused for wrong auth tokens,
        the new one gets ``refusal`` and is not counted: send that and close it."""
        conn = OpenConnection(evict, peer_address(peer))
        conn.refusal = self.throttled(conn)
        if conn.refusal is not None:
            return conn
        if ((len(self._handshaking) >= self.max_handshaking or len(self._open) >= self.max_connections)
                and not self._close_oldest_handshake()):
            self.count(ErrorCode.TOO_MANY_CONNECTIONS)
            conn.refusal = self.too_many_connections_frame()
            return conn
        self._open[conn.key] = conn
        self._handshaking[conn.key] = conn
        return conn

    def _close_oldest_handshake(self) -> bool:
        """Close the oldest handshaking connection not being answered (HANDSHAKE_TIMEOUT) to make
        room for a newer one; False when there is none. Established connections are never closed:
        a peer that cannot complete a handshake can only push out others that have not either."""
        victim = next((c for c in self._handshaking.values() if not c.answering), None)
        if victim is None:
            return False
        self.count(ErrorCode.HANDSHAKE_TIMEOUT)
        frame = encode_frame(error_message(
            ErrorCode.HANDSHAKE_TIMEOUT,
            f"closed before its handshake was complete: newer connections needed its place ({len(self._handshaking)} "
            f"of {len(self._open)} connections were in their handshake, {self.max_handshaking} at most "
            f"(max_handshaking_connections), and this was the oldest); reconnect and send PING at once"))
        self.close_connection(victim)
        victim.evict(frame, False)
        return True

    def establish(self, conn: OpenConnection) -> None:
        """``conn`` completed its handshake: it leaves the handshaking share and no newcomer can close it."""
        if not conn.established:
            self.established_connections += 1
        conn.established = True
        self._handshaking.pop(conn.key, None)

    def close_connection(self, conn: OpenConnection) -> None:
        """A connection counted by :meth:`open_connection` has ended: its slot and bytes are free."""
        if conn.established and conn.key in self._open:
            self.established_connections -= 1
        self._handshaking.pop(conn.key, None)
        if self._open.pop(conn.key, None) is not None:
            self._partial_total -= conn.partial_bytes
            conn.partial_bytes = 0

    def too_many_connections_frame(self) -> bytes:
        return encode_frame(error_message(
            ErrorCode.TOO_MANY_CONNECTIONS,
            f"the server already has {len(self._open)} connections, its limit (max_connections); try later"))

    # -- wrong auth tokens ---------------------------------------------------------------

    def throttled(self, conn: OpenConnection) -> bytes | None:
        """The AUTH_THROTTLED refusal of a connection whose address is refused for wrong auth
        tokens now (counted), else None. Asked again at each request of a connection still in
        its handshake: one opened before its address was refused gets no guess either."""
        if self.auth_throttle is None:
            return None
        wait = self.auth_throttle.refused_for(conn.address, time.monotonic())
        if wait <= 0:
            return None
        self.count(ErrorCode.AUTH_THROTTLED)
        return encode_frame(error_message(
            ErrorCode.AUTH_THROTTLED,
            f"too many wrong auth tokens from {conn.address or 'this address'}: its connections are refused for "
            f"{wait:.1f} more s; reconnect then"))

    def wrong_token(self, conn: OpenConnection) -> str:
        """Count a wrong auth token from ``conn``'s address; returns what its AUTH_FAILED text adds
        when that starts a refusal period of the address ("" otherwise)."""
        if self.auth_throttle is None:
            return ""
        backoff = self.auth_throttle.failed(conn.address, time.monotonic())
        if not backoff:
            return ""
        self._report_throttled(conn.address, backoff)
        return f"; too many from {conn.address}: its connections are refused for {backoff:g} s"

    def _report_throttled(self, address: str | None, backoff: float) -> None:
        """Tell the operator that someone guesses the token, in one line now and then, not once per address."""
        now = time.monotonic()
        if now - self._last_throttle_report >= ACCEPT_ERROR_REPORT_S:
            self._last_throttle_report = now
            print(f"[tether] wrong auth tokens from {address}: its connections are refused for {backoff:g} s "
                  f"(further refusals of any address are not reported for {ACCEPT_ERROR_REPORT_S:g} s)",
                  file=sys.stderr, flush=True)
