"""A TCP transport around the Sans-I/O ``ClientConnection``, used by the
client's one I/O thread: connect with a timeout, TCP keepalive, write frames,
and read whatever responses have arrived."""

from __future__ import annotations

import socket
from typing import Any

from tether.protocol.connection import ClientConnection
from tether.protocol.errors import ErrorCode
from tether.protocol.messages import MessageType

#: TCP keepalive: probe after this much silence, then every interval, give up after count probes.
KEEPALIVE_IDLE_S = 30
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_COUNT = 3

_CONNECTION_LEVEL_CODES = frozenset(code.value for code in ErrorCode if code.closes_connection)


class ConnectionLost(ConnectionError):
    """The connection ended. ``code`` is the connection-level ERROR code the
    server sent before closing (TOO_MANY_CONNECTIONS, CLIENT_TIMEOUT, ...), if any."""

    def __init__(self, reason: str, code: str | None = None, body: dict | None = None) -> None:
        super().__init__(reason)
        self.code = code
        #: The connection-level ERROR itself (TRAINING_DONE's ``summary`` is in it), or None.
        self.body = body


def enable_keepalive(sock: socket.socket) -> None:
    """Let the kernel notice a silently dead peer (where the platform allows tuning it)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", KEEPALIVE_COUNT)):
        option = getattr(socket, name, None)
        if option is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
            except OSError:
                pass


class SocketTransport:
    """One TCP connection at a time to ``host:port``.

    ``send`` writes a request (a send that cannot complete within
    ``send_timeout_s`` raises ``socket.timeout``); ``read_available`` reads
    once from a socket known to be readable and returns the responses that
    completed, each paired with the request type it answers (None for an
    ERROR refusing a fire-and-forget EPISODES).
    """

    def __init__(self, host: str, port: int, connect_timeout_s: float = 10.0, send_timeout_s: float = 60.0) -> None:
        self.host = host
        self.port = port
        self.connect_timeout_s = connect_timeout_s
        self.send_timeout_s = send_timeout_s
        self._conn = ClientConnection()
        self._sock: socket.socket | None = None
        #: A connection-level ERROR read together with earlier answers, raised after them.
        self._pending_loss: ConnectionLost | None = None

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def connected(self) -> bool:
        return self._sock is not None

    @property
    def sock(self) -> socket.socket:
        if self._sock is None:
            raise ConnectionLost("not connected")
        return self._sock

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        enable_keepalive(sock)
        sock.settimeout(self.send_timeout_s)  # bounds sendall; reads only happen once select says readable
        self._sock = sock
        self._conn.reset()
        self._pending_loss = None

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def send(self, message: dict[str, Any], attachment: bytes | None = None) -> None:
        """Send one request, with its binary attachment (§4.3) if any."""
        self._raise_pending_loss()
        self.sock.sendall(self._conn.send(message, attachment))

    def _until_connection_loss(self, responses: list, peer: str) -> list:
        """The responses before the first connection-level ERROR; that ERROR becomes the loss.

        Answers that arrived before it in the same read still count (e.g. the SET_STATE of
        the batch just sent), so the loss is raised on the next call; with nothing before
        it, it is raised now."""
        for i, (_, message) in enumerate(responses):
            code = message.get("code")
            if message.get("type") == MessageType.ERROR.value and code in _CONNECTION_LEVEL_CODES:
                loss = ConnectionLost(f"server {peer} closed the connection with {code}: "
                                      f"{message.get('message', '')}", str(code), message)
                if i == 0:
                    self.close()
                    raise loss
                self._pending_loss = loss
                return responses[:i]
        return responses

    def _raise_pending_loss(self) -> None:
        loss, self._pending_loss = self._pending_loss, None
        if loss is not None:
            self.close()
            raise loss

    def _receive(self) -> bytes:
        """What the socket holds now (empty: nothing yet); ``ConnectionLost`` at EOF or on a failed read."""
        try:
            data = self.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return b""
        except OSError as exc:
            self.close()
            raise ConnectionLost(f"connection to {self.address} failed: {exc}") from exc
        if not data:
            self.close()
            raise ConnectionLost(f"server {self.address} closed the connection")
        return data

    def read_available(self) -> list[tuple[MessageType | None, dict[str, Any]]]:
        """Read what the socket holds; raise ``ConnectionLost`` at EOF or on a
        connection-level ERROR (the server closes after sending one)."""
        self._raise_pending_loss()
        data = self._receive()
        if not data:
            return []
        try:
            responses = self._conn.receive_data(data)
        except Exception as exc:
            self.close()  # the stream cannot be trusted after a protocol violation
            raise ConnectionLost(f"server {self.address} broke the protocol: {exc}") from exc
        return self._until_connection_loss(responses, self.address)


class WebSocketTransport(SocketTransport):
    """RLlink over a websocket (docs/protocol.md §3.4) to ``url``
    (``ws://host:port/rllink``), with the same interface as SocketTransport: one
    socket the I/O thread can select on, written and read through websockets'
    Sans-I/O client protocol. Each request goes as one text message holding the
    body; each message received is one response."""

    def __init__(self, url: str, connect_timeout_s: float = 10.0, send_timeout_s: float = 60.0,
                 max_message_bytes: int = 64 * 2**20) -> None:
        from websockets.uri import parse_uri

        self.url = url
        self._uri = parse_uri(url)
        if self._uri.secure:
            raise ValueError("wss:// is not supported by the Python SDK; use ws:// (or TCP)")
        super().__init__(self._uri.host, self._uri.port, connect_timeout_s, send_timeout_s)
        self.max_message_bytes = max_message_bytes
        self._ws: Any = None
        self._fragments: list[bytes] = []

    @property
    def address(self) -> str:
        return self.url

    def connect(self) -> None:
        import time

        from websockets.client import ClientProtocol
        from websockets.http11 import Response

        super().connect()
        ws = ClientProtocol(self._uri, max_size=self.max_message_bytes)
        ws.send_request(ws.connect())
        self._flush(ws)
        deadline = time.monotonic() + self.connect_timeout_s
        sock = self.sock
        while True:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = sock.recv(1 << 16)
            except OSError as exc:
                self.close()
                raise ConnectionLost(f"websocket handshake with {self.url} failed: {exc}") from exc
            finally:
                sock.settimeout(self.send_timeout_s)
            if not data:
                self.close()
                raise ConnectionLost(f"server {self.url} closed the connection during the websocket handshake")
            ws.receive_data(data)
            events = ws.events_received()
            if any(isinstance(e, Response) for e in events):
                break
        if ws.handshake_exc is not None:
            self.close()
            raise ConnectionLost(f"websocket handshake with {self.url} refused: {ws.handshake_exc}")
        self._ws = ws
        self._fragments = []

    def _flush(self, ws: Any) -> None:
        for chunk in ws.data_to_send():
            if chunk:
                self.sock.sendall(chunk)

    def close(self) -> None:
        self._ws = None
        super().close()

    def send(self, message: dict[str, Any], attachment: bytes | None = None) -> None:
        """Send one request as a text message; with a binary attachment (§4.3), as a binary message."""
        self._raise_pending_loss()
        frame = self._conn.send(message, attachment)  # pairs the answer with this request
        ws = self._ws
        if ws is None:
            raise ConnectionLost("not connected")
        if attachment is None:
            ws.send_text(frame[8:])
        else:
            ws.send_binary(frame[8:])
        self._flush(ws)

    def read_available(self) -> list[tuple[MessageType | None, dict[str, Any]]]:
        from websockets.frames import Opcode

        self._raise_pending_loss()
        ws = self._ws
        if ws is None:
            raise ConnectionLost("not connected")
        data = self._receive()
        if not data:
            return []
        ws.receive_data(data)
        framed = bytearray()
        closed = None
        for event in ws.events_received():
            if event.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
                self._fragments.append(bytes(event.data))
                if event.fin:
                    body = b"".join(self._fragments)
                    self._fragments = []
                    framed += f"{len(body):08d}".encode() + body  # the same pairing and checks as over TCP
            elif event.opcode is Opcode.CLOSE:
                # (close_exc asserts a fully closed connection; the client is still closing here)
                rcvd = ws.close_rcvd
                closed = f"code {rcvd.code} {rcvd.reason}".strip() if rcvd is not None else "closed"
        self._flush(ws)  # pongs, and the answer to a close
        responses: list[tuple[MessageType | None, dict[str, Any]]] = []
        if framed:
            try:
                responses = self._conn.receive_data(bytes(framed))
            except Exception as exc:
                self.close()
                raise ConnectionLost(f"server {self.url} broke the protocol: {exc}") from exc
            kept = self._until_connection_loss(responses, self.url)
            if len(kept) < len(responses):
                return kept
        if closed is not None:
            if responses:
                self._pending_loss = ConnectionLost(f"server {self.url} closed the websocket: {closed}")
            else:
                self.close()
                raise ConnectionLost(f"server {self.url} closed the websocket: {closed}")
        return responses


def make_transport(host: str, port: int, connect_timeout_s: float, send_timeout_s: float) -> SocketTransport:
    """TCP to ``host:port``, or, when ``host`` is a ``ws://`` URL, RLlink over that websocket."""
    if host.startswith(("ws://", "wss://")):
        return WebSocketTransport(host, connect_timeout_s, send_timeout_s)
    return SocketTransport(host, port, connect_timeout_s, send_timeout_s)
