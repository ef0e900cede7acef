"""Error types of the RLlink protocol, each tied to a wire error code.

Two families, as in h11: errors caused by the peer (``RemoteProtocolError``:
bad bytes or a bad message received) and errors caused by the local program
(``LocalProtocolError``: the API was misused). A peer's refusal that arrives
as an ERROR message is raised as ``ServerError`` (or one of its subclasses).
"""

from __future__ import annotations

from enum import Enum


class ErrorCode(str, Enum):
    """Every error code that may appear in an ERROR message's ``code`` field."""

    # Framing errors: the byte stream can no longer be trusted; the connection closes.
    BAD_HEADER = "BAD_HEADER"
    FRAME_TOO_LARGE = "FRAME_TOO_LARGE"
    # Message errors: the frame was sound but its body was not; the connection stays open.
    INVALID_UTF8 = "INVALID_UTF8"
    INVALID_JSON = "INVALID_JSON"
    NOT_AN_OBJECT = "NOT_AN_OBJECT"
    MISSING_TYPE = "MISSING_TYPE"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    NOT_A_REQUEST = "NOT_A_REQUEST"
    INVALID_FIELD = "INVALID_FIELD"
    EPISODE_LENGTH_MISMATCH = "EPISODE_LENGTH_MISMATCH"
    OBS_SHAPE_MISMATCH = "OBS_SHAPE_MISMATCH"
    NON_FINITE_VALUE = "NON_FINITE_VALUE"
    ACTION_OUT_OF_SPACE = "ACTION_OUT_OF_SPACE"
    MISSING_ACTION_LOGP = "MISSING_ACTION_LOGP"
    AUTH_FAILED = "AUTH_FAILED"
    VERSION_MISMATCH = "VERSION_MISMATCH"
    # Multi-agent (protocol 1.2).
    UNKNOWN_MODULE = "UNKNOWN_MODULE"
    UNMAPPED_AGENT = "UNMAPPED_AGENT"
    MODULE_MISMATCH = "MODULE_MISMATCH"
    AGENT_ALREADY_DONE = "AGENT_ALREADY_DONE"
    GROUP_MEMBER_OUTSIDE_GROUP = "GROUP_MEMBER_OUTSIDE_GROUP"
    # Protocol 1.3: behaviour log-probabilities no served model can have produced.
    ACTION_LOGP_MISMATCH = "ACTION_LOGP_MISMATCH"
    # Protocol 1.3: the client's data kept making learner updates non-finite; its episodes are refused.
    DATA_REFUSED = "DATA_REFUSED"
    # Protocol 1.3 connection-level refusals: sent once, unsolicited, then the server closes.
    TOO_MANY_CONNECTIONS = "TOO_MANY_CONNECTIONS"
    HANDSHAKE_TIMEOUT = "HANDSHAKE_TIMEOUT"
    CLIENT_TIMEOUT = "CLIENT_TIMEOUT"
    SERVER_OVERLOADED = "SERVER_OVERLOADED"
    # Refused at once: too many wrong auth tokens came from the peer's address lately.
    AUTH_THROTTLED = "AUTH_THROTTLED"
    # Protocol 1.3: the run reached its end (stop_at_return, max_env_steps): a normal end, not a failure.
    TRAINING_DONE = "TRAINING_DONE"
    # Protocol 1.4: a tensor object that cannot be read, and observations of another element type than the space's.
    INVALID_TENSOR = "INVALID_TENSOR"
    OBS_DTYPE_MISMATCH = "OBS_DTYPE_MISMATCH"
    # Protocol 1.4: a composite observation without one of its space's leaves or with another one.
    OBS_LEAF_MISMATCH = "OBS_LEAF_MISMATCH"
    # Protocol 1.4 action masks (§11.6): a mask value other than 0 and 1, a mask that allows no
    # action at a step that took one, and an action its own mask forbids.
    INVALID_ACTION_MASK = "INVALID_ACTION_MASK"
    ACTION_MASK_EMPTY = "ACTION_MASK_EMPTY"
    ACTION_MASKED = "ACTION_MASKED"
    # Protocol 1.5 recurrent state (§10.1): a record of a module with memory without its state_in, a
    # state_in of other names, size or element type (or one for a module without memory), and a chunk
    # of such a module longer than MAX_RECURRENT_CHUNK_STEPS.
    MISSING_STATE = "MISSING_STATE"
    INVALID_STATE = "INVALID_STATE"
    SEQUENCE_TOO_LONG = "SEQUENCE_TOO_LONG"
    INTERNAL = "INTERNAL"

    @property
    def closes_connection(self) -> bool:
        """Whether a peer that sends or receives this error must close the connection."""
        return self in _FATAL_CODES


_FATAL_CODES = frozenset({
    ErrorCode.BAD_HEADER, ErrorCode.FRAME_TOO_LARGE,
    ErrorCode.TOO_MANY_CONNECTIONS, ErrorCode.HANDSHAKE_TIMEOUT, ErrorCode.CLIENT_TIMEOUT,
    ErrorCode.SERVER_OVERLOADED, ErrorCode.AUTH_THROTTLED, ErrorCode.TRAINING_DONE,
})


class TetherError(Exception):
    """Base class of every error raised by Tether's protocol code."""


class LocalProtocolError(TetherError):
    """The local program misused the protocol API (a bug on this side)."""


class RemoteProtocolError(TetherError):
    """The peer sent bytes or a message that break the protocol.

    ``code`` is the wire code to report back in an ERROR message; ``message``
    says what was wrong in words a person can act on.
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple:
        # Pickled by the server's decode workers: rebuild from (code, message), not from str(self).
        return (type(self), (self.code, self.message))


class FramingError(RemoteProtocolError):
    """The length header or the frame size was invalid; the stream is unusable."""


class MessageError(RemoteProtocolError):
    """The frame was well delimited but its message was invalid; the stream is fine."""


class ServerError(TetherError):
    """The server refused a request with an ERROR message.

    Attributes:
        code: the wire code as sent (a string; known codes also map to ``ErrorCode``).
        message: the server's own explanation.
        request: the type of the request that was refused, when the server said.
    """

    def __init__(self, code: str, message: str, request: str | None = None) -> None:
        super().__init__(f"server refused {request or 'request'}: {code}: {message}")
        self.code = code
        self.message = message
        self.request = request


class AuthenticationError(ServerError):
    """The server refused the auth token (ErrorCode.AUTH_FAILED)."""


class VersionMismatchError(ServerError):
    """The server speaks an incompatible major protocol version (ErrorCode.VERSION_MISMATCH)."""


def server_error_from_message(body: dict) -> ServerError:
    """Build the typed exception for a received ERROR message body."""
    code = str(body.get("code", ErrorCode.INTERNAL.value))
    message = str(body.get("message", ""))
    request = body.get("request")
    cls: type[ServerError] = ServerError
    if code == ErrorCode.AUTH_FAILED.value:
        cls = AuthenticationError
    elif code == ErrorCode.VERSION_MISMATCH.value:
        cls = VersionMismatchError
    return cls(code, message, request if isinstance(request, str) else None)


class TetherConnectionError(TetherError, ConnectionError):
    """The server could not be reached (again) within ``reconnect_timeout_s``.

    Attributes:
        address: the server's "host:port".
        code: the connection-level ERROR code (TOO_MANY_CONNECTIONS,
            HANDSHAKE_TIMEOUT, CLIENT_TIMEOUT, AUTH_THROTTLED, ...) the server sent before it
            closed the last connection, if it sent one.
    """

    def __init__(self, message: str, address: str = "", code: str | None = None) -> None:
        super().__init__(message)
        self.address = address
        self.code = code


class InvalidInputError(TetherError, ValueError):
    """The engine passed a value no record may carry (a NaN or infinite observation or reward):
    refused at the call, before it is recorded, as every SDK does (docs/parity.md), rather than
    refused by the server with the whole batch. ``code`` is the wire code it would get (NON_FINITE_VALUE)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code.value


class NotReadyError(TetherError):
    """The client has no model for the module yet (a module a new connection's SET_CONFIG added whose
    model has not arrived): ``code`` NOT_READY, as the C++ and C# SDKs report it."""

    code = "NOT_READY"


class TetherTimeoutError(TetherError, TimeoutError):
    """The server did not answer a request in time.

    Attributes:
        address: the server's "host:port".
        request: the type of the request that went unanswered (e.g. "EPISODES_AND_GET_STATE").
        timeout_s: how long the client waited.
        setting: the client option that set the wait ("response_timeout_s",
            "update_timeout_s" or "connect_timeout_s").
    """

    def __init__(self, address: str, request: str, timeout_s: float, setting: str, detail: str = "") -> None:
        text = (f"no answer from the Tether server at {address} to {request} within {timeout_s:g} s "
                f"({setting})")
        super().__init__(text + (f": {detail}" if detail else ""))
        self.address = address
        self.request = request
        self.timeout_s = timeout_s
        self.setting = setting
