"""RLlink over websockets (docs/protocol.md §3.4) for clients that cannot open
TCP sockets, such as games built for the browser.

Each websocket text message carries one RLlink body (the JSON object, without
the 8-digit header); everything after framing is shared with TCP: the same
``RLlinkService`` (session rules: auth, version, one request in flight; the same
answers and errors; large bodies decoded in the same pool, off the event loop;
the same training), the same ``ConnectionLimits`` (the connection limit, counted
together with TCP's from a connection's first byte, handshakes included, in the
same handshaking share; the same refusal of an address after wrong auth tokens;
the same budget for bytes of unfinished messages), the same deadlines and the
same size limit.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from http import HTTPStatus
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.protocol import State

from tether.protocol import ErrorCode
from tether.protocol.connection import ServerConnection as RLlinkConnection
from tether.protocol.framing import HEADER_SIZE

from ..client_session import ClientSession
from .connection_limits import OpenConnection
from .deadlines import silence_allowed, timed_out_frame
from .sockets import BACKLOG, CLOSE_GRACE_S, enable_keepalive, listen
from .tcp import TetherServer

PATH = "/rllink"


#: Largest message read from a connection refused on arrival: it is told TOO_MANY_CONNECTIONS
#: (or AUTH_THROTTLED) and closed, so nothing it sends is ever answered or kept.
_REFUSED_MAX_MESSAGE = 4096
#: Bytes a refused connection may send in all (its upgrade included): past them it is
#: cut off, so a refused connection never makes the server hold more, counted or not.
_REFUSED_MAX_READ = 16 * 1024


def _held_bytes(ws: ServerConnection) -> int:
    """Bytes of messages this connection holds and the handler has not taken yet: the
    unparsed input, the fragments of the message being received (``current_size``, whether
    queued or already taken by a waiting ``recv``), and the complete messages queued."""
    try:
        protocol = ws.protocol
        queued = complete = 0
        for frame in ws.recv_messages.frames.queue:
            queued += len(frame.data)
            if frame.fin:
                complete = queued  # frames after the last final one are the current message's, counted already
        return len(protocol.reader.buffer) + (protocol.current_size or 0) + complete
    except AttributeError:  # (websockets internals moved: the size limit per message still holds)
        return 0


class _RLlinkWebSocket(ServerConnection):
    """A websocket connection that counts among the server's connections from its
    first byte, and holds its unfinished messages within max_partial_frame_bytes."""

    def __init__(self, rllink: "WebSocketRLlink", *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rllink = rllink
        self.slot: OpenConnection | None = None
        self.refused_read = 0  # bytes received while refused

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.slot = self.rllink.tcp.connections.open_connection(self._evict, transport.get_extra_info("peername"))
        self.rllink.connections.add(self)
        #: (loop time) The upgrade and the RLlink handshake both end within handshake_timeout_s of it.
        self.opened_at = asyncio.get_running_loop().time()
        if self.slot.over_limit:
            # Its upgrade is read (to answer with an ERROR), what follows is not kept: a tiny
            # message limit bounds what a refused connection can make the server hold.
            self.protocol.max_message_size = _REFUSED_MAX_MESSAGE
            self.rllink.refusing += 1
            if self.rllink.refusing > BACKLOG:  # a flood: no handshake, no explanation
                transport.abort()
            return
        enable_keepalive(transport.get_extra_info("socket"))

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.rllink.connections.discard(self)
        if self.slot is not None:
            if self.slot.over_limit:
                self.rllink.refusing -= 1
            self.rllink.tcp.connections.close_connection(self.slot)

    def data_received(self, data: bytes) -> None:
        if self.slot is not None and self.slot.over_limit:
            self.refused_read += len(data)
            if self.refused_read > _REFUSED_MAX_READ:  # (checked before parsing: nothing of it is kept)
                self.transport.abort()
                return
        super().data_received(data)
        self.report_held()

    def report_held(self) -> None:
        """Tell the server what this connection holds now (it may close the largest holders)."""
        if self.slot is not None and not self.slot.over_limit and not self.slot.evicted:
            self.rllink.tcp.connections.set_partial(self.slot, _held_bytes(self))

    def _evict(self, frame: bytes, current: bool) -> None:
        self.transport.pause_reading()  # nothing more is read from it; it is closed once its ERROR is out
        self.rllink.spawn(self.rllink.close_with(self, frame))


class WebSocketRLlink:
    """Serves RLlink on ``ws://host:port/rllink`` beside a running :class:`TetherServer`."""

    def __init__(self, tcp: TetherServer, host: str, port: int) -> None:
        self.tcp = tcp
        self.config = tcp.config
        self.host = host
        self.requested_port = port
        self._server: Server | None = None
        #: Connections refused on arrival still in their upgrade, to be told why (TOO_MANY_CONNECTIONS, ...).
        self.refusing = 0
        #: Every websocket connection with its socket open (upgraded or not).
        self.connections: set[_RLlinkWebSocket] = set()
        self._tasks: set[asyncio.Task] = set()
        #: Handlers running (one per upgraded connection), cancelled at stop.
        self._handlers: set[asyncio.Task] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return next(iter(self._server.sockets)).getsockname()[1]

    async def start(self) -> None:
        # A message over max_frame_bytes closes the connection (code 1009), as an oversized frame does on TCP.
        # max_queue=1: at most one received message waits for the handler (RLlink answers in
        # order), so a client that pipelines cannot make the server hold many large messages.
        # With an auth token every connection starts at the pre-auth limit (raised once it authenticates):
        # set here, not in the handler, since a message sent with the upgrade request is read before it runs.
        # The upgrade itself must finish within handshake_timeout_s. Few peers are accepted per loop
        # iteration, as on TCP (see TetherServer.start), while the kernel queues BACKLOG.
        first_limit = (min(self.config.pre_auth_max_frame_bytes, self.config.max_frame_bytes)
                       if self.config.auth_token else self.config.max_frame_bytes)
        burst = self.tcp.accept_burst
        self._server = await serve(self._handle, self.host, self.requested_port, process_request=self._http,
                                   max_size=first_limit, max_queue=1, ping_interval=None, compression=None,
                                   open_timeout=self.config.handshake_timeout_s, close_timeout=CLOSE_GRACE_S,
                                   create_connection=functools.partial(_RLlinkWebSocket, self), backlog=burst)
        if burst < BACKLOG:
            for listening in self._server.sockets:
                listen(listening.fileno(), BACKLOG)

    async def stop(self) -> None:
        """Stop accepting, end every connection and return: a handler waiting on training (a
        batch waiting for room in a paused pool) is cancelled, as TCP's are, not waited for."""
        if self._server is None:
            return
        self._server.close()  # no new connections; open ones get a close frame
        for ws in list(self.connections):
            if ws.protocol.state is State.CONNECTING:
                ws.transport.abort()  # in its upgrade: nothing to say goodbye to
        for task in list(self._handlers):
            task.cancel()
        await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()

    def spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close_with(self, ws: ServerConnection, frame: bytes) -> None:
        """Send a last ERROR (within CLOSE_GRACE_S: a peer that does not read is not waited for), then close."""
        if ws.protocol.state is not State.OPEN:  # still in its upgrade (no message can go yet), or closed
            ws.transport.abort()
            return
        try:
            async with asyncio.timeout(CLOSE_GRACE_S):
                await self._send(ws, frame)
        except (ConnectionClosed, TimeoutError):
            pass
        await ws.close()

    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.path.split("?")[0] != PATH:
            return connection.respond(HTTPStatus.NOT_FOUND, f"RLlink is served on {PATH}\n")
        return None

    async def _send(self, ws: ServerConnection, frame: bytes) -> None:
        await ws.send(frame[HEADER_SIZE:].decode("utf-8"))

    async def _handle(self, ws: ServerConnection) -> None:
        assert isinstance(ws, _RLlinkWebSocket) and ws.slot is not None
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._handle_open(ws)
        finally:
            self._handlers.discard(task)

    async def _handle_open(self, ws: _RLlinkWebSocket) -> None:
        assert ws.slot is not None
        if ws.slot.refusal is not None:
            await self.close_with(ws, ws.slot.refusal)
            return
        session = ClientSession(ws.remote_address, websocket=True)
        connection = self.tcp.service.connected(session)
        try:
            await self._serve(ws, session, connection)
        except (ConnectionClosed, asyncio.CancelledError):
            pass
        except Exception as exc:  # one connection's failure must never reach the others
            print(f"[tether] websocket connection from {session.peer} failed: {exc!r:.300}", file=sys.stderr, flush=True)
        finally:
            self.tcp.service.disconnected(session)
            await ws.close()

    async def _serve(self, ws: _RLlinkWebSocket, session: ClientSession, connection: RLlinkConnection) -> None:
        loop = asyncio.get_running_loop()
        slot = ws.slot
        assert slot is not None
        # Until its RLlink handshake is complete (None from then on).
        handshake_deadline: float | None = ws.opened_at + self.config.handshake_timeout_s
        client_timeout = self.config.client_timeout_s or None
        while True:
            if handshake_deadline is not None:
                deadline: float | None = handshake_deadline
                code = ErrorCode.HANDSHAKE_TIMEOUT
            elif client_timeout is not None:
                deadline, code = loop.time() + silence_allowed(connection, client_timeout), ErrorCode.CLIENT_TIMEOUT
            else:
                deadline, code = None, ErrorCode.CLIENT_TIMEOUT
            try:
                async with asyncio.timeout_at(deadline):
                    data = await ws.recv()
            except TimeoutError:
                await self._timed_out(ws, code)
                return
            if slot.evicted:
                return
            ws.report_held()  # the message taken is no longer held
            body = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
            del data
            slot.answering = True
            try:
                frame, closes = await self.tcp.service.answer(session, connection, body, slot)
            finally:
                slot.answering = False
            del body
            if closes:
                await self.close_with(ws, frame)
                return
            if handshake_deadline is not None and slot.established:
                handshake_deadline = None
                # (before the PONG goes out: a client sends its next message after it)
                ws.protocol.max_message_size = self.config.max_frame_bytes
            if frame is None:
                continue
            try:
                # A peer that does not read its answers before its handshake is complete does not outlive the deadline.
                async with asyncio.timeout_at(handshake_deadline):
                    await self._send(ws, frame)
            except TimeoutError:
                await self._timed_out(ws, ErrorCode.HANDSHAKE_TIMEOUT)
                return

    async def _timed_out(self, ws: ServerConnection, code: ErrorCode) -> None:
        self.tcp.connections.count(code)
        await self.close_with(ws, timed_out_frame(self.config, code, names_legacy_factor=False))
