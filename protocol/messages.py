"""RLlink message types and the decoding of a frame body into a message.

A message is a plain ``dict`` with a ``"type"`` key: that is what travels on
the wire, and keeping it a dict keeps the hot path free of copies.
"""

from __future__ import annotations

import json
import reprlib
from enum import Enum
from typing import Any

import orjson

from .errors import ErrorCode, MessageError
from .tensors import bind_attachment

#: Protocol version this implementation speaks. Major 1 is RLlib's RLlink v1;
#: minor versions add fields a plain v1 peer never sees (1.1: handshake,
#: errors, spaces; 1.2: multi-agent modules, mapping, groups; 1.3: raw Box
#: samples in records, exactly-once batches, heartbeats and connection limits).
PROTOCOL_VERSION = "1.9"


class MessageType(str, Enum):
    """Every message type of RLlink v1 plus Tether's ERROR response."""

    # Requests: client -> server.
    PING = "PING"
    GET_CONFIG = "GET_CONFIG"
    GET_STATE = "GET_STATE"
    EPISODES = "EPISODES"
    EPISODES_AND_GET_STATE = "EPISODES_AND_GET_STATE"
    MAP_AGENTS = "MAP_AGENTS"  # 1.2: which module serves these agents (server-side mapping)
    # Responses: server -> client.
    PONG = "PONG"
    SET_CONFIG = "SET_CONFIG"
    SET_STATE = "SET_STATE"
    AGENT_MODULES = "AGENT_MODULES"  # 1.2: answer to MAP_AGENTS
    ERROR = "ERROR"


REQUEST_TYPES = frozenset(
    {
        MessageType.PING,
        MessageType.GET_CONFIG,
        MessageType.GET_STATE,
        MessageType.EPISODES,
        MessageType.EPISODES_AND_GET_STATE,
        MessageType.MAP_AGENTS,
    }
)
RESPONSE_TYPES = frozenset(
    {MessageType.PONG, MessageType.SET_CONFIG, MessageType.SET_STATE, MessageType.AGENT_MODULES, MessageType.ERROR}
)

#: The response each request expects; EPISODES expects none (RLlink v1).
EXPECTED_RESPONSE: dict[MessageType, MessageType | None] = {
    MessageType.PING: MessageType.PONG,
    MessageType.GET_CONFIG: MessageType.SET_CONFIG,
    MessageType.GET_STATE: MessageType.SET_STATE,
    MessageType.EPISODES_AND_GET_STATE: MessageType.SET_STATE,
    MessageType.EPISODES: None,
    MessageType.MAP_AGENTS: MessageType.AGENT_MODULES,
}

_TYPES_BY_NAME = {t.value: t for t in MessageType}

#: Deepest nesting of arrays and objects a body may have (the body object is level 1, §4.1).
MAX_NESTING = 64

# Every byte but the brackets and the quote: what the nesting check drops.
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
# Objects count as arrays: only how deep they nest matters.
_BRACKETS_ONLY = bytes.maketrans(b"{}", b"[]")


def nesting_exceeds(body: bytes, limit: int = MAX_NESTING) -> bool:
    """Whether a JSON text opens more than ``limit`` arrays and objects at once,
    brackets inside strings aside, found without parsing it (one pass of
    ``bytes.translate`` over the body, then work on its brackets only).

    For a text whose brackets do not balance the answer may be either: the
    parser refuses such a text anyway."""
    if len(body) <= 2 * limit:
        return False  # too short to open more than ``limit`` brackets and close them
    if b"\\" in body:
        # An escaped quote does not end a string; an escaped backslash escapes nothing.
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = body.translate(_BRACKETS_ONLY, _NOT_STRUCTURE)
    if len(marks) <= limit:
        return False
    marks = marks.replace(b'""', b"")  # strings without brackets (keys, ids): the common case
    if b'"' in marks:
        marks = b"".join(marks.split(b'"')[::2])  # what lies between quotes is inside strings
    # Each pass removes the innermost pairs, one level: a pair still there after
    # ``limit`` passes encloses more than ``limit`` levels.
    for _ in range(limit):
        shorter = marks.replace(b"[]", b"")
        if len(shorter) == len(marks):
            return False  # nothing left, or brackets that do not balance
        marks = shorter
    return b"[]" in marks


def is_text(value: str) -> bool:
    """Whether a received string is Unicode text: JSON can escape half of a
    surrogate pair alone (\\ud800), which no UTF-8 text holds (§4.1)."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def decode_message(body: bytes) -> tuple[MessageType, dict[str, Any]]:
    """Parse a frame body into its type and the message dict.

    Raises ``MessageError`` with a distinct code for invalid UTF-8, invalid
    JSON (a body nested more than ``MAX_NESTING`` levels deep counts as invalid:
    it is refused before it is parsed), a body that is not a JSON object, and a
    missing or unknown type.
    """
    # [1.4] A NUL byte ends the JSON text (JSON has none of its own): the rest is the attachment (§4.3).
    split = body.find(b"\0")
    attachment = None
    if split >= 0:
        attachment = memoryview(body)[split + 1:]
        body = body[:split]
    if nesting_exceeds(body):
        _check_utf8(body)  # the checks of §4.2 keep their order
        raise MessageError(ErrorCode.INVALID_JSON, f"body nests arrays and objects more than {MAX_NESTING} levels deep")
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        message = _decode_slow_path(body, exc)
    if not isinstance(message, dict):
        raise MessageError(
            ErrorCode.NOT_AN_OBJECT,
            f"body must be a JSON object, got {type(message).__name__}",
        )
    if "type" not in message:
        raise MessageError(ErrorCode.MISSING_TYPE, 'message has no "type" field')
    name = message["type"]
    kind = _TYPES_BY_NAME.get(name) if isinstance(name, str) else None
    if kind is None:
        raise MessageError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {describe_value(name)}")
    if kind in (MessageType.EPISODES, MessageType.EPISODES_AND_GET_STATE):
        bind_attachment(message, attachment)
    return kind, message


_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel = 3
_SHORT_REPR.maxstring = 60
_SHORT_REPR.maxother = 60


def describe_value(value: Any) -> str:
    """A short repr of a received value for an error message: bounded in
    length and depth (a plain repr of a list nested 1,000 deep raises RecursionError)."""
    return _SHORT_REPR.repr(value)


def _parse_int(text: str) -> int | float:
    # A JSON integer too large for a double becomes inf, so it is reported as a
    # non-finite value instead of overflowing later (float(10**400) raises).
    return int(text) if len(text) <= 20 else float(text)


def _check_utf8(body: bytes) -> str:
    """The body as text; INVALID_UTF8 (§4.2 check 1) if it is not UTF-8."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as utf_exc:
        raise MessageError(
            ErrorCode.INVALID_UTF8, f"body is not valid UTF-8 ({utf_exc.reason} at byte {utf_exc.start})"
        ) from None


def _decode_slow_path(body: bytes, exc: Exception) -> Any:
    """Classify a body orjson refused; accept NaN/Infinity tokens so they are
    reported as non-finite values (Python's json module writes them) rather
    than as invalid JSON."""
    text = _check_utf8(body)
    try:
        return json.loads(text, parse_int=_parse_int)
    except (ValueError, RecursionError):
        raise MessageError(ErrorCode.INVALID_JSON, f"body is not valid JSON: {exc}") from None


def error_message(code: ErrorCode, message: str, request: str | None = None) -> dict[str, Any]:
    """Build an ERROR response; ``request`` names the refused request's type."""
    msg: dict[str, Any] = {"type": MessageType.ERROR.value, "code": code.value, "message": message}
    if request is not None:
        msg["request"] = request
    return msg


def parse_version(text: str) -> tuple[int, int]:
    """Split "MAJOR.MINOR" (or "MAJOR.MINOR.PATCH") into (major, minor); ValueError when malformed."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a version: {text!r}")
    return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
