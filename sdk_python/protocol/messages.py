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

#: Protocol version this implementation speaks. Major 1 is RLlib's RLlink v1;
#: minor versions add fields a plain v1 peer never sees (1.1: handshake,
#: errors, spaces; 1.2: multi-agent modules, mapping, groups; 1.3: raw Box
#: samples in records, exactly-once batches, heartbeats and connection limits).
PROTOCOL_VERSION = "1.3"


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


def decode_message(body: bytes) -> tuple[MessageType, dict[str, Any]]:
    """Parse a frame body into its type and the message dict.

    Raises ``MessageError`` with a distinct code for invalid UTF-8, invalid
    JSON, a body that is not a JSON object, and a missing or unknown type.
    """
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


def _decode_slow_path(body: bytes, exc: Exception) -> Any:
    """Classify a body orjson refused; accept NaN/Infinity tokens so they are
    reported as non-finite values (Python's json module writes them) rather
    than as invalid JSON."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as utf_exc:
        raise MessageError(
            ErrorCode.INVALID_UTF8, f"body is not valid UTF-8 ({utf_exc.reason} at byte {utf_exc.start})"
        ) from None
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
