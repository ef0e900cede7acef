"""RLlink over websockets (docs/protocol.md §3.4) for clients that cannot open
TCP sockets, such as games built for the browser.

Each websocket text message carries one RLlink body (the JSON object, without
the 8-digit header); everything after framing is the TCP server's: the same
session rules (auth, version, one request in flight), the same answers and
errors, the same connection limit, timeouts and size limit, the same training.
"""

from __future__ import annotations

import asyncio
import sys
from http import HTTPStatus

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from tether.sdk.protocol import ErrorCode, error_message
from tether.sdk.protocol.connection import Refusal, ServerConnection as RLlinkConnection, ServerState
from tether.sdk.protocol.framing import HEADER_SIZE, encode_frame

from .tcp_server import LEGACY_TIMEOUT_FACTOR, ClientSession, TetherServer, _encode_error, _speaks_1_3

PATH = "/rllink"


class WebSocketRLlink:
    """Serves RLlink on ``ws://host:port/rllink`` beside a running :class:`TetherServer`."""

    def __init__(self, tcp: TetherServer, host: str, port: int) -> None:
        self.tcp = tcp
        self.config = tcp.config
        self.host = host
        self.requested_port = port
        self._server: Server | None = None
        self.open = 0

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
        first_limit = (min(self.config.pre_auth_max_frame_bytes, self.config.max_frame_bytes)
                       if self.config.auth_token else self.config.max_frame_bytes)
        self._server = await serve(self._handle, self.host, self.requested_port, process_request=self._http,
                                   max_size=first_limit, max_queue=1, ping_interval=None, compression=None)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.path.split("?")[0] != PATH:
            return connection.respond(HTTPStatus.NOT_FOUND, f"RLlink is served on {PATH}\n")
        return None

    async def _send(self, ws: ServerConnection, frame: bytes) -> None:
        await ws.send(frame[HEADER_SIZE:].decode("utf-8"))

    async def _handle(self, ws: ServerConnection) -> None:
        tcp = self.tcp
        if len(tcp._open) + self.open >= tcp.max_connections:
            tcp._count(ErrorCode.TOO_MANY_CONNECTIONS)
            await self._send(ws, encode_frame(error_message(
                ErrorCode.TOO_MANY_CONNECTIONS,
                f"the server already has {len(tcp._open) + self.open} connections, its limit (max_connections); try later")))
            await ws.close()
            return
        session = ClientSession(ws.remote_address)
        connection = RLlinkConnection(self.config.max_frame_bytes, self.config.auth_token,
                                      pre_auth_max_frame_bytes=self.config.pre_auth_max_frame_bytes)
        self.open += 1
        metrics = tcp.trainer.metrics
        metrics.clients_connected += 1
        if tcp.observer is not None:
            tcp.observer.connected(session.id, session.peer)
        try:
            await self._serve(ws, session, connection)
        except (ConnectionClosed, asyncio.CancelledError):
            pass
        except Exception as exc:  # one connection's failure must never reach the others
            print(f"[tether] websocket connection from {session.peer} failed: {exc!r:.300}", file=sys.stderr, flush=True)
        finally:
            self.open -= 1
            metrics.clients_connected -= 1
            if tcp.observer is not None:
                tcp.observer.disconnected(session.id)
            tcp.trainer.forget_connection(session.id)
            await ws.close()

    async def _serve(self, ws: ServerConnection, session: ClientSession, connection: RLlinkConnection) -> None:
        loop = asyncio.get_running_loop()
        tcp = self.tcp
        auth_deadline = (loop.time() + self.config.handshake_timeout_s
                         if connection.state is ServerState.AWAITING_AUTH else None)
        client_timeout = self.config.client_timeout_s or None
        while True:
            if auth_deadline is not None:
                deadline: float | None = auth_deadline
                code = ErrorCode.HANDSHAKE_TIMEOUT
            elif client_timeout is not None:
                wait = client_timeout if _speaks_1_3(connection) else client_timeout * LEGACY_TIMEOUT_FACTOR
                deadline, code = loop.time() + wait, ErrorCode.CLIENT_TIMEOUT
            else:
                deadline, code = None, ErrorCode.CLIENT_TIMEOUT
            try:
                async with asyncio.timeout_at(deadline):
                    data = await ws.recv()
            except TimeoutError:
                tcp._count(code)
                text = (f"not authenticated within {self.config.handshake_timeout_s:g} s: send PING with auth_token first"
                        if code is ErrorCode.HANDSHAKE_TIMEOUT else
                        f"no data received for client_timeout_s ({self.config.client_timeout_s:g} s); "
                        f"an idle client must PING every heartbeat_interval_s")
                await self._send(ws, encode_frame(error_message(code, text)))
                return
            body = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
            event = connection.handle_body(body)
            observer = tcp.observer
            if isinstance(event, Refusal):
                if observer is not None:
                    observer.refused(session.id, event.error.code.value, event.error.message, event.request_type)
                await self._send(ws, _encode_error(event.error.code, event.error.message, event.request_type))
                if event.closes_connection:
                    return
                continue
            if auth_deadline is not None and connection.state is ServerState.READY:
                auth_deadline = None
                # (before the PONG goes out: a client sends its next message after it)
                ws.protocol.max_message_size = self.config.max_frame_bytes
            if observer is not None:
                observer.request(session.id, event.kind.value, event.message)
                started = loop.time()
            frame = await tcp._respond(session, connection, event.kind, event.message, None)
            if observer is not None:
                observer.answered(session.id, event.kind.value, loop.time() - started)
            if frame is not None:
                await self._send(ws, frame)
