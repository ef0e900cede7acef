"""How long a peer may stay silent, on every transport: until its handshake is
complete, ``handshake_timeout_s`` from its first byte (HANDSHAKE_TIMEOUT); then
``client_timeout_s`` while it is owed no answer (CLIENT_TIMEOUT), longer for a
client that sends no heartbeats."""

from __future__ import annotations

from tether.protocol.connection import ServerConnection
from tether.protocol.errors import ErrorCode
from tether.protocol.framing import encode_frame
from tether.protocol.messages import error_message, parse_version

from ..config import ServerConfig

#: How much longer a client that did not announce protocol 1.3 (and so sends no
#: heartbeats) may stay silent than client_timeout_s.
LEGACY_TIMEOUT_FACTOR = 10


def speaks_1_3(connection: ServerConnection) -> bool:
    """Whether the client's PING announced protocol 1.3 or later (it then sends heartbeats)."""
    try:
        return connection.client_version is not None and parse_version(connection.client_version) >= (1, 3)
    except ValueError:
        return False


def silence_allowed(connection: ServerConnection, client_timeout_s: float) -> float:
    """Seconds an established client may stay silent. Clients older than 1.3 send no heartbeats
    (an engine paused in a menu is silent): they get LEGACY_TIMEOUT_FACTOR times longer; TCP
    keepalive finds dead peers sooner."""
    return client_timeout_s if speaks_1_3(connection) else client_timeout_s * LEGACY_TIMEOUT_FACTOR


def handshake_timeout_text(config: ServerConfig) -> str:
    """The message of HANDSHAKE_TIMEOUT at the deadline."""
    limit = config.handshake_timeout_s
    if config.auth_token:
        return f"not authenticated within {limit:g} s: send PING with auth_token first"
    return f"no request within {limit:g} s of connecting: send PING first"


def timed_out_frame(config: ServerConfig, code: ErrorCode, names_legacy_factor: bool = True) -> bytes:
    """The ERROR that closes a connection silent past its deadline (HANDSHAKE_TIMEOUT or CLIENT_TIMEOUT).
    (The websocket transport's CLIENT_TIMEOUT text has never named the legacy factor, though it applies it.)"""
    if code is ErrorCode.HANDSHAKE_TIMEOUT:
        text = handshake_timeout_text(config)
    else:
        legacy = f"; x{LEGACY_TIMEOUT_FACTOR} for clients older than protocol 1.3" if names_legacy_factor else ""
        text = (f"no data received for client_timeout_s ({config.client_timeout_s:g} s{legacy}); "
                f"an idle client must PING every heartbeat_interval_s")
    return encode_frame(error_message(code, text))
