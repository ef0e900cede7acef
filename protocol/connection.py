"""Sans-I/O RLlink connections: bytes in, messages out; messages in, bytes out.

``ServerConnection`` is what a server holds per client; ``ClientConnection``
is what a client holds. Transports (asyncio TCP in the server, a blocking
socket in the Python SDK) only move bytes to and from these objects.

Server-side state, as a table (h11 style)::

    AWAITING_AUTH --PING with the right token--> READY
    AWAITING_AUTH --PING with a wrong token----> (AUTH_FAILED, then the transport closes)
    READY         --any request--------------> READY

A server without an auth token starts in READY, so plain RLlink v1 clients
that never send PING (or send it without fields) work unchanged. While a
server with a token awaits authentication, its frame limit is the small
``pre_auth_max_frame_bytes``: an unauthenticated peer cannot make it buffer
or parse a large body.
"""

from __future__ import annotations

import hmac
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Any, Union

from .errors import ErrorCode, FramingError, LocalProtocolError, MessageError, RemoteProtocolError
from .framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame

#: Frame limit before authentication (server with a token): a PING fits easily.
DEFAULT_PRE_AUTH_MAX_FRAME_BYTES = 64 * 1024
from .messages import (
    EXPECTED_RESPONSE,
    PROTOCOL_VERSION,
    REQUEST_TYPES,
    MessageType,
    decode_message,
    describe_value,
    error_message,
    parse_version,
)


#: Codes after which the server closes the connection (protocol 1.3, §5.3): such an
#: ERROR answers no request, and the requests still outstanding stay unanswered.
_CLOSING_CODES = frozenset(code.value for code in ErrorCode if code.closes_connection)


def run_id_of(pong: dict[str, Any]) -> str | None:
    """**[1.8]** The server run a PONG names (§7.2); None when it names none (an older server)."""
    run_id = pong.get("run_id")
    return run_id if isinstance(run_id, str) and run_id else None


def from_another_run(acted_in: str | None, connected_to: str | None) -> bool:
    """**[1.8]** Whether steps acted with weights learned on a connection to run ``acted_in`` were
    acted with another run's weights than those of ``connected_to`` (§6.5): only when both are
    known and differ. Their weights versions name other weights there; they are dropped, not sent."""
    return acted_in is not None and connected_to is not None and acted_in != connected_to


# -- [1.9] servers in a group: the ranks' addresses, redirects and the reconnect order (§6.7) ----------

#: A client address of a rank: (host, port).
Address = tuple[str, int]


def parse_address(value: Any) -> Address | None:
    """**[1.9]** ``"host:port"`` as §6.7 writes a rank's address, or None when ``value`` is not one:
    the port is 1 to 65535 in decimal digits; an IPv6 host is in brackets (``"[::1]:9000"``), which are
    taken off; any other host holds no ``:`` and no whitespace, and is not empty."""
    if not isinstance(value, str) or len(value) > 300:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or len(port) > 5 or not 1 <= int(port) <= 65535:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not host or any(c in host for c in "[]") or ":" not in host:
            return None
    elif not host or any(c in host for c in ":[]"):
        return None
    if any(c.isspace() for c in host):
        return None
    return host, int(port)


def format_address(address: Address) -> str:
    """**[1.9]** ``address`` as §6.7 writes it: an IPv6 host (one holding ``:``) in brackets."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def rank_addresses(pong: dict[str, Any]) -> list[Address]:
    """**[1.9]** The ranks a PONG names (§7.2 ``ranks``), in order, each once; entries that are not
    addresses are left out, and a ``ranks`` that is not an array names none."""
    ranks = pong.get("ranks")
    if not isinstance(ranks, list):
        return []
    found: list[Address] = []
    for entry in ranks[:1024]:
        address = parse_address(entry)
        if address is not None and address not in found:
            found.append(address)
    return found


def redirect_of(pong: dict[str, Any], current: Address, redirected: bool) -> Address | None:
    """**[1.9]** The rank a PONG asks this client to move to (§7.2 ``redirect``), or None to stay: when the
    connection was itself made on a redirect (a client moves at most once per attempt), when the value is
    not an address, or when it names the address the client is on."""
    if redirected:
        return None
    target = parse_address(pong.get("redirect"))
    return None if target is None or target == current else target


def reconnect_order(given: Address, ranks: list[Address], lost: Address) -> list[Address]:
    """**[1.9]** Where a client's attempts go after its connection to ``lost`` ended (§6.7): the
    candidates are the address the application gave, then the ranks the last PONG named (each once);
    attempt k goes to the k-th candidate counted from ``lost`` (the first retries ``lost``), wrapping
    around. ``lost`` heads the list when it is not a candidate."""
    candidates = [given, *(r for r in ranks if r != given)]
    if lost not in candidates:
        candidates.insert(0, lost)
    start = candidates.index(lost)
    return candidates[start:] + candidates[:start]


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
    #: True when the transport must close the connection after sending the error
    #: (a failed auth token: one guess per connection slows guessing).
    closes_connection: bool = False

    def to_message(self) -> dict[str, Any]:
        return error_message(self.error.code, self.error.message, self.request_type)


ServerEvent = Union[Request, Refusal]


class ServerConnection:
    """One client's connection as the server sees it.

    ``receive_data`` returns the requests (and refusals) the bytes complete;
    it raises ``FramingError`` when the stream is broken, after which the
    transport sends ``framing_error_frame(err)`` and closes. A server that
    answers one request before it looks at the next uses ``add_data`` and
    ``next_event`` instead.
    """

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        auth_token: str | None = None,
        server_name: str = "tether",
        pre_auth_max_frame_bytes: int = DEFAULT_PRE_AUTH_MAX_FRAME_BYTES,
        run_id: str | None = None,
    ) -> None:
        self._max_frame_bytes = max_frame_bytes
        #: **[1.8]** The server run's id, sent in PONG (None: not sent).
        self._run_id = run_id
        self._auth_token = auth_token.encode("utf-8", "surrogatepass") if auth_token else None
        self._server_name = server_name
        self.state = ServerState.AWAITING_AUTH if auth_token else ServerState.READY
        limit = min(max_frame_bytes, pre_auth_max_frame_bytes) if auth_token else max_frame_bytes
        self._decoder = FrameDecoder(limit)
        #: What the client said of itself in PING (name, version), for logs.
        self.client_name: str | None = None
        self.client_version: str | None = None

    def receive_data(self, data: bytes) -> list[ServerEvent]:
        """Events for the frames ``data`` completes.

        If a bad header follows complete frames in the same data, those frames'
        events are returned and the ``FramingError`` is raised by the next call
        (``framing_error`` tells the transport to answer them and then close).
        """
        self._decoder.add(data)
        events: list[ServerEvent] = []
        while True:
            try:
                event = self.next_event()
            except FramingError:
                if not events:
                    raise
                return events  # raised again by the next call; ``framing_error`` is set
            if event is None:
                return events
            events.append(event)

    def add_data(self, data: bytes) -> None:
        """Buffer received bytes; take the events with ``next_event``."""
        self._decoder.add(data)

    def next_event(self) -> ServerEvent | None:
        """The event of the next complete frame, or None until more bytes arrive.

        Raises ``FramingError`` when the next header is bad or announces a
        body over the current limit (the stream is then unusable).
        """
        body = self._decoder.next_body()
        return None if body is None else self._handle_body(body)

    def next_body(self) -> bytes | None:
        """The next complete frame body, unparsed (see ``handle_body``); None until more bytes arrive."""
        return self._decoder.next_body()

    def handle_body(self, body: bytes, decoded: tuple[MessageType, dict[str, Any]] | MessageError | None = None
                    ) -> ServerEvent:
        """The event of one body. ``decoded`` is ``decode_message(body)``'s result (or
        its error) when the transport parsed the body elsewhere, e.g. in another process."""
        return self._handle_body(body, decoded)

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and held but not yet returned as an event (a partial frame)."""
        return self._decoder.buffered_bytes

    @property
    def framing_error(self) -> RemoteProtocolError | None:
        """Set once the byte stream is broken; the transport must close after answering."""
        return self._decoder.error

    def _handle_body(self, body: bytes, decoded: Any = None) -> ServerEvent:
        request_type: str | None = None
        try:
            if isinstance(decoded, MessageError):
                raise decoded
            kind, message = decoded if decoded is not None else decode_message(body)
            request_type = kind.value
            if kind not in REQUEST_TYPES:
                raise MessageError(
                    ErrorCode.NOT_A_REQUEST, f"{kind.value} is a response; a client may only send requests"
                )
            if kind is MessageType.PING:
                if self._handle_ping(message):
                    return Refusal(MessageError(ErrorCode.AUTH_FAILED, "wrong auth_token"), kind.value,
                                   closes_connection=True)
            elif self.state is ServerState.AWAITING_AUTH:
                raise MessageError(
                    ErrorCode.AUTH_FAILED, f"{kind.value} before authentication: send PING with auth_token first"
                )
            return Request(kind, message)
        except MessageError as exc:
            return Refusal(exc, request_type)
        except RecursionError:  # e.g. a field nested 1,000 deep in a PING
            return Refusal(MessageError(ErrorCode.INVALID_FIELD, "a value is nested too deeply"), request_type)

    def _handle_ping(self, message: dict[str, Any]) -> bool:
        """Apply a PING; True when it carried a wrong token (the caller refuses and closes)."""
        version = message.get("protocol_version")
        if version is not None:
            try:
                major, _ = parse_version(str(version))
            except ValueError:
                raise MessageError(
                    ErrorCode.VERSION_MISMATCH, f"unreadable protocol_version {describe_value(version)}"
                ) from None
            ours, _ = parse_version(PROTOCOL_VERSION)
            if major != ours:
                raise MessageError(
                    ErrorCode.VERSION_MISMATCH,
                    f"client speaks RLlink {version}, this server speaks {PROTOCOL_VERSION} "
                    f"(major versions must match)",
                )
            self.client_version = str(version)
        name = message.get("client_name")
        if isinstance(name, str):  # for logs only: a lone surrogate is kept as its escape (\ud800)
            self.client_name = name[:200].encode("utf-8", "backslashreplace").decode("utf-8")
        if self.state is ServerState.AWAITING_AUTH:
            assert self._auth_token is not None
            token = message.get("auth_token")
            if token is None:
                raise MessageError(ErrorCode.AUTH_FAILED, "missing auth_token")
            # surrogatepass: a JSON string may hold a lone surrogate, which strict UTF-8 cannot encode.
            if not isinstance(token, str) or not hmac.compare_digest(
                token.encode("utf-8", "surrogatepass"), self._auth_token
            ):
                return True
            self.state = ServerState.READY
            self._decoder.max_frame_bytes = self._max_frame_bytes
        return False

    def pong(self) -> dict[str, Any]:
        """The PONG for an accepted PING (extension fields are ignored by v1 clients)."""
        pong = {"type": MessageType.PONG.value, "protocol_version": PROTOCOL_VERSION, "server": self._server_name}
        if self._run_id is not None:
            pong["run_id"] = self._run_id
        return pong

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

    def send(self, message: dict[str, Any], attachment: bytes | None = None) -> bytes:
        """Encode a request (**[1.4]** with its binary attachment, §4.3); raise ``LocalProtocolError``
        for a non-request."""
        try:
            kind = MessageType(message.get("type"))
        except ValueError:
            raise LocalProtocolError(f"unknown message type {message.get('type')!r}") from None
        if kind not in REQUEST_TYPES:
            raise LocalProtocolError(f"a client cannot send {kind.value}")
        if EXPECTED_RESPONSE[kind] is not None:
            self._awaiting.append(kind)
        return encode_frame(message, attachment)

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
