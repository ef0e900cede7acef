"""Sans-I/O RLlink connections: bytes in, messages out; messages in, bytes out.

``ServerConnection`` is what a server holds per client; ``ClientConnection``
is what a client holds. Transports (asyncio TCP in the server, a blocking
socket in the Python SDK) only move bytes to and from these objects.

Server-side state, as a table (h11 style)::

    AWAITING_AUTH --PING with the right token--> READY
    READY         --any request--------------> READY

A server without an auth token starts in READY, so plain RLlink v1 clients
that never send PING (or send it without fields) work unchanged.
"""

from __future__ import annotations

import hmac
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Any, Union

from .errors import ErrorCode, LocalProtocolError, MessageError, RemoteProtocolError
from .framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from .messages import (
    EXPECTED_RESPONSE,
    PROTOCOL_VERSION,
    REQUEST_TYPES,
    MessageType,
    decode_message,
    error_message,
    parse_version,
)


#: Codes after which the server closes the connection (protocol 1.3, §5.3): such an
#: ERROR answers no request, and the requests still outstanding stay unanswered.
_CLOSING_CODES = frozenset(code.value for code in ErrorCode if code.closes_connection)


class ServerState(Enum):
    AWAITING_AUTH = "AWAITING_AUTH"
    READY = "READY"


@dataclass
class Request:
    """A valid request received by the server."""

    kind: MessageType
    message: dict[str, Any]


@dataclass
class Refusal:
    """A request the server must answer with ERROR; the connection stays open."""

    error: MessageError
    request_type: str | None

    def to_message(self) -> dict[str, Any]:
        return error_message(self.error.code, self.error.message, self.request_type)


ServerEvent = Union[Request, Refusal]


class ServerConnection:
    """One client's connection as the server sees it.

    ``receive_data`` returns the requests (and refusals) the bytes complete;
    it raises ``FramingError`` when the stream is broken, after which the
    transport sends ``framing_error_frame(err)`` and closes.
    """

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        auth_token: str | None = None,
        server_name: str = "tether",
    ) -> None:
        self._decoder = FrameDecoder(max_frame_bytes)
        self._auth_token = auth_token
        self._server_name = server_name
        self.state = ServerState.AWAITING_AUTH if auth_token else ServerState.READY
        #: What the client said of itself in PING (name, version), for logs.
        self.client_name: str | None = None
        self.client_version: str | None = None

    def receive_data(self, data: bytes) -> list[ServerEvent]:
        """Events for the frames ``data`` completes.

        If a bad header follows complete frames in the same data, those frames'
        events are returned and the ``FramingError`` is raised by the next call
        (``framing_error`` tells the transport to answer them and then close).
        """
        return [self._handle_body(body) for body in self._decoder.feed(data)]

    @property
    def framing_error(self) -> RemoteProtocolError | None:
        """Set once the byte stream is broken; the transport must close after answering."""
        return self._decoder.error

    def _handle_body(self, body: bytes) -> ServerEvent:
        request_type: str | None = None
        try:
            kind, message = decode_message(body)
            request_type = kind.value
            if kind not in REQUEST_TYPES:
                raise MessageError(
                    ErrorCode.NOT_A_REQUEST, f"{kind.value} is a response; a client may only send requests"
                )
            if kind is MessageType.PING:
                self._handle_ping(message)
            elif self.state is ServerState.AWAITING_AUTH:
                raise MessageError(
                    ErrorCode.AUTH_FAILED, f"{kind.value} before authentication: send PING with auth_token first"
                )
            return Request(kind, message)
        except MessageError as exc:
            return Refusal(exc, request_type)

    def _handle_ping(self, message: dict[str, Any]) -> None:
        version = message.get("protocol_version")
        if version is not None:
            try:
                major, _ = parse_version(str(version))
            except ValueError:
                raise MessageError(ErrorCode.VERSION_MISMATCH, f"unreadable protocol_version {version!r}") from None
            ours, _ = parse_version(PROTOCOL_VERSION)
            if major != ours:
                raise MessageError(
                    ErrorCode.VERSION_MISMATCH,
                    f"client speaks RLlink {version}, this server speaks {PROTOCOL_VERSION} "
                    f"(major versions must match)",
                )
            self.client_version = str(version)
        name = message.get("client_name")
        if isinstance(name, str):
            self.client_name = name[:200]
        if self.state is ServerState.AWAITING_AUTH:
            assert self._auth_token is not None
            token = message.get("auth_token")
            if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self._auth_token.encode()):
                what = "missing" if token is None else "wrong"
                raise MessageError(ErrorCode.AUTH_FAILED, f"{what} auth_token")
            self.state = ServerState.READY

    def pong(self) -> dict[str, Any]:
        """The PONG for an accepted PING (extension fields are ignored by v1 clients)."""
        return {"type": MessageType.PONG.value, "protocol_version": PROTOCOL_VERSION, "server": self._server_name}

    @staticmethod
    def framing_error_frame(error: RemoteProtocolError) -> bytes:
        """Bytes of the ERROR a server sends before closing on a framing error."""
        return encode_frame(error_message(error.code, error.message))


class ClientConnection:
    """The client's side: encodes requests and pairs responses with them.

    ``receive_data`` returns ``(request_type, response)`` pairs in order. An
    ERROR response is returned like any other (its ``request`` field names the
    refused request); the caller raises it with ``server_error_from_message``.
    An ERROR for EPISODES, which has no success response, pairs with nothing.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._decoder = FrameDecoder(max_frame_bytes)
        self._awaiting: deque[MessageType] = deque()

    @property
    def awaiting_response(self) -> bool:
        return bool(self._awaiting)

    def send(self, message: dict[str, Any]) -> bytes:
        """Encode a request; raise ``LocalProtocolError`` for a non-request."""
        try:
            kind = MessageType(message.get("type"))
        except ValueError:
            raise LocalProtocolError(f"unknown message type {message.get('type')!r}") from None
        if kind not in REQUEST_TYPES:
            raise LocalProtocolError(f"a client cannot send {kind.value}")
        if EXPECTED_RESPONSE[kind] is not None:
            self._awaiting.append(kind)
        return encode_frame(message)

    def receive_data(self, data: bytes) -> list[tuple[MessageType | None, dict[str, Any]]]:
        """Complete responses in ``data``, each with the request type it answers."""
        responses: list[tuple[MessageType | None, dict[str, Any]]] = []
        for body in self._decoder.feed(data):
            kind, message = decode_message(body)
            if kind is MessageType.ERROR:
                # An ERROR for EPISODES, or a connection-level one (no "request", a code
                # after which the server closes), answers no outstanding request.
                if (message.get("request") == MessageType.EPISODES.value or not self._awaiting
                        or ("request" not in message and message.get("code") in _CLOSING_CODES)):
                    responses.append((None, message))
                else:
                    responses.append((self._awaiting.popleft(), message))
                continue
            if not self._awaiting:
                raise RemoteProtocolError(ErrorCode.NOT_A_REQUEST, f"unsolicited {kind.value} from server")
            request = self._awaiting.popleft()
            expected = EXPECTED_RESPONSE[request]
            if kind is not expected:
                raise RemoteProtocolError(
                    ErrorCode.UNKNOWN_TYPE,
                    f"expected {expected.value if expected else 'nothing'} for {request.value}, got {kind.value}",
                )
            responses.append((request, message))
        return responses

    def reset(self) -> None:
        """Forget partial bytes and pending requests (after a reconnect)."""
        self._decoder = FrameDecoder(self._decoder.max_frame_bytes)
        self._awaiting.clear()
