"""The asyncio TCP transport: moves bytes between sockets and the Sans-I/O
``ServerConnection``, and hands every complete frame to ``RLlinkService.answer``.

What one peer can cost is bounded (the limits themselves, shared with the
websocket transport, are in connection_limits.py and deadlines.py):

- one request in flight per connection: the server takes the next frame of a
  connection only after the previous answer has been handed to the socket
  (``drain``), so a peer that pipelines requests and never reads its answers
  stalls itself, not the server;
- a connection is *handshaking* until it completes its handshake (with an auth
  token: authenticated; without: its first request was accepted), and must do so
  within ``handshake_timeout_s`` (HANDSHAKE_TIMEOUT); with a token it gets a small
  frame limit meanwhile, and a wrong token closes the connection;
- max_connections, the handshaking share of them, refusals of an address after
  wrong tokens, and max_partial_frame_bytes (see ``ConnectionLimits``);
- a connection silent for ``client_timeout_s`` while it is owed no answer is
  closed (CLIENT_TIMEOUT);
- max_connections is lowered to what the process's open-file limit allows.

Each connection-level refusal is one unsolicited ERROR (no "request" field),
then the server closes the connection.
"""

from __future__ import annotations

import asyncio
import errno
import sys
import time
from typing import Any, Callable

from tether.protocol.connection import ServerConnection
from tether.protocol.errors import ErrorCode, FramingError
from tether.protocol.framing import encode_frame
from tether.protocol.messages import error_message

from ..client_session import ClientSession
from ..rllink_service import RLlinkService
from ..trainer import Trainer
from .connection_limits import ConnectionLimits, OpenConnection
from .deadlines import silence_allowed, timed_out_frame
from .sockets import (ACCEPT_ERROR_REPORT_S, BACKLOG, CLOSE_GRACE_S, descriptor_budget, enable_keepalive, listen,
                      open_file_limit)

_READ_SIZE = 1 << 20
#: StreamReader stops reading a socket once it holds 2x this; kept small because
#: a connection's bytes wait there while its current request is answered.
_STREAM_LIMIT = 256 * 1024


def _evict_stream(writer: asyncio.StreamWriter) -> Callable[[bytes, bool], None]:
    def evict(frame: bytes, current: bool) -> None:
        writer.write(frame)
        if not current:
            # Its handler sees EOF and cleans up. A peer that does not read (answers still queued) is
            # cut off at once: no longer counted, it must not keep its descriptor until a deadline.
            if writer.transport.get_write_buffer_size():
                writer.transport.abort()
            else:
                writer.close()
    return evict


def _goodbye_stream(writer: asyncio.StreamWriter) -> Callable[[bytes], None]:
    def goodbye(frame: bytes) -> None:
        # Written after whatever is queued, then a half-close: the handler reads on (and drops) what the
        # peer still sends until it closes, so a reset cannot destroy the ERROR before the peer read it.
        writer.write(frame)
        if writer.can_write_eof():
            writer.write_eof()
    return goodbye


class _Close(Exception):
    """Ends a connection's handler after its last frame was written."""


class TetherServer:
    """Accepts clients on one port and serves them concurrently, within the configured limits.
    Its ``connections`` and ``service`` are shared with the websocket transport (websocket.py)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.config = trainer.config
        self._server: asyncio.base_events.Server | None = None
        #: Every open connection, TCP and websocket, and the limits they share.
        self.connections = ConnectionLimits.from_config(self.config)
        self.service = RLlinkService(trainer, self.connections)
        self._handlers: set[asyncio.Task] = set()
        #: Peers accepted per loop iteration (set by ``start``), fewer than the handshaking share.
        self.accept_burst = max(1, self.connections.max_handshaking // 4)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        limits = self.connections
        limit = open_file_limit()
        backlog = min(BACKLOG, limits.max_connections)
        self.service.start()  # its decode workers' pipes count among the descriptors in use
        if limit is not None:
            backlog, allowed = descriptor_budget(limit, backlog, limits.max_connections)
            if allowed < limits.max_connections:
                print(f"[tether] max_connections {limits.max_connections} lowered to {allowed}: the process may open "
                      f"only {limit} files", file=sys.stderr, flush=True)
            limits.set_max_connections(allowed)
        asyncio.get_running_loop().set_exception_handler(self._loop_exception)
        # asyncio accepts up to `backlog` peers per loop iteration before any of them is read: fewer than
        # the handshaking share, so a client's PING, sent as it connects, is read before a burst of newer
        # arrivals can make it the oldest handshaking connection. The kernel still queues `backlog`.
        burst = self.accept_burst = max(1, min(backlog, limits.max_handshaking // 4))
        self._server = await asyncio.start_server(
            self._handle_client, self.config.host, self.config.port, limit=_STREAM_LIMIT, backlog=burst,
        )
        if burst < backlog:
            for listening in self._server.sockets:
                listen(listening.fileno(), backlog)

    _last_accept_error = 0.0

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """Report running out of descriptors in one line now and then, not once per attempt."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            now = time.monotonic()
            if now - self._last_accept_error >= ACCEPT_ERROR_REPORT_S:
                self._last_accept_error = now
                print(f"[tether] cannot accept connections: {exc.strerror} ({len(self.connections)} open); "
                      f"lower max_connections or raise the open-file limit", file=sys.stderr, flush=True)
            return
        loop.default_exception_handler(context)

    async def say_goodbye(self, summary: dict[str, Any], flush_s: float = 1.0) -> None:
        """The run is done (§6.6): every connection past its handshake whose client speaks 1.3 gets an
        unsolicited ERROR TRAINING_DONE with the run's ``summary`` and is closed; others are closed by
        ``stop`` as before. Waits up to ``flush_s`` for those connections to close."""
        if self._server is not None:
            self._server.close()  # no newcomer is served after the goodbye
        reason = summary.get("reason")
        text = (f"training is done ({reason}): {summary.get('updates')} updates, "
                f"{summary.get('agent_steps_trained')} agent steps trained; do not reconnect")
        frame = encode_frame({**error_message(ErrorCode.TRAINING_DONE, text), "summary": summary})
        told = [c for c in self.connections.open_connections() if c.established and c.speaks_1_3 and not c.evicted]
        for conn in told:
            conn.say_goodbye(frame)
        deadline = asyncio.get_running_loop().time() + flush_s
        while any(c in self.connections for c in told) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        self.service.close()

    # -- one connection ----------------------------------------------------------

    async def _handle_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        session = ClientSession(writer.get_extra_info("peername"))
        conn = self.connections.open_connection(_evict_stream(writer), session.peer)
        conn.goodbye = _goodbye_stream(writer)
        if conn.refusal is not None:
            writer.write(conn.refusal)
            await self._close(writer)
            self._handlers.discard(task)
            return
        enable_keepalive(writer.get_extra_info("socket"))
        connection = self.service.connected(session)
        try:
            await self._serve(conn, session, connection, reader, writer)
        except (_Close, ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        except Exception as exc:  # one connection's failure must never reach the others (nor print a traceback)
            print(f"[tether] connection from {session.peer} failed: {exc!r:.300}", file=sys.stderr, flush=True)
        finally:
            self.connections.close_connection(conn)
            self.service.disconnected(session)
            self._handlers.discard(task)
            await self._close(writer)

    async def _serve(self, conn: OpenConnection, session: ClientSession, connection: ServerConnection,
                     reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        # Until its handshake is complete (None from then on).
        handshake_deadline: float | None = loop.time() + self.config.handshake_timeout_s
        client_timeout = self.config.client_timeout_s or None
        while True:
            # Answer every complete frame, one at a time: the next one is parsed
            # only after this answer is on its way (one request in flight).
            while True:
                try:
                    body = connection.next_body()
                except FramingError as exc:
                    await self._refuse(writer, connection.framing_error_frame(exc))
                if body is None or conn.evicted or conn.said_goodbye:
                    break
                conn.answering = True
                try:
                    frame, closes = await self.service.answer(session, connection, body, conn)
                finally:
                    conn.answering = False
                del body
                if closes:
                    await self._refuse(writer, frame)
                if handshake_deadline is not None and conn.established:
                    handshake_deadline = None
                if frame is not None and not conn.said_goodbye:
                    writer.write(frame)
                    if handshake_deadline is None:
                        await writer.drain()
                    else:  # a peer that does not read its refusals must not outlive the handshake deadline
                        await self._before(handshake_deadline, writer.drain(), writer, ErrorCode.HANDSHAKE_TIMEOUT)
            self.connections.set_partial(conn, connection.buffered_bytes)
            # Wait for more bytes; silence is bounded by the handshake deadline, then by the client timeout.
            if handshake_deadline is not None:
                data = await self._before(handshake_deadline, reader.read(_READ_SIZE), writer,
                                          ErrorCode.HANDSHAKE_TIMEOUT)
            elif client_timeout is not None:
                data = await self._before(loop.time() + silence_allowed(connection, client_timeout),
                                          reader.read(_READ_SIZE), writer, ErrorCode.CLIENT_TIMEOUT)
            else:
                data = await reader.read(_READ_SIZE)
            if not data or conn.evicted:
                return  # EOF; a partial frame is discarded, nothing stored
            if conn.said_goodbye:
                continue  # read and dropped until the peer, told TRAINING_DONE, closes
            connection.add_data(data)
            self.connections.set_partial(conn, connection.buffered_bytes)
            if conn.evicted:
                return

    async def _before(self, deadline: float, awaitable: Any, writer: asyncio.StreamWriter, code: ErrorCode) -> Any:
        """Await ``awaitable`` until ``deadline`` (loop time); past it, refuse with ``code`` and close."""
        try:
            async with asyncio.timeout_at(deadline):
                return await awaitable
        except TimeoutError:
            pass
        self.connections.count(code)
        await self._refuse(writer, timed_out_frame(self.config, code))

    async def _refuse(self, writer: asyncio.StreamWriter, frame: bytes) -> None:
        """Write a final ERROR and end the handler (which closes the connection)."""
        writer.write(frame)
        raise _Close()

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        writer.close()
        try:
            async with asyncio.timeout(CLOSE_GRACE_S):
                await writer.wait_closed()
        except (TimeoutError, ConnectionError, asyncio.CancelledError):
            writer.transport.abort()  # the peer does not read: drop what is left unsent
        except Exception:
            writer.transport.abort()
