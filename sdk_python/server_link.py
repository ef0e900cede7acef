"""The connection a client keeps to its server: handshake, request/response
with reconnect-and-resend, and the server's ERRORs raised as typed exceptions.
Shared by the single-agent and the multi-agent client."""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

from .protocol.errors import ServerError, VersionMismatchError, server_error_from_message
from .protocol.messages import PROTOCOL_VERSION, MessageType, parse_version
from .transport import SocketTransport


class TetherConnectionError(ConnectionError):
    """The server could not be reached within ``reconnect_timeout_s``."""


class ServerLink:
    """PING + GET_CONFIG on every (re)connect, then ``on_connected`` (which
    fetches the models); requests survive a lost connection."""

    def __init__(
        self,
        host: str,
        port: int,
        client_name: str,
        auth_token: str | None,
        reconnect_timeout_s: float,
        on_connected: Callable[[], None],
        verbose: bool = False,
    ) -> None:
        self.client_name = client_name
        self.auth_token = auth_token
        self.reconnect_timeout_s = reconnect_timeout_s
        self.verbose = verbose
        self._on_connected = on_connected
        self._transport = SocketTransport(host, port)
        self._deferred_errors: list[ServerError] = []
        #: PONG and SET_CONFIG of the current connection.
        self.server_info: dict[str, Any] = {}
        self.server_config: dict[str, Any] = {}
        #: Connections re-established after a loss.
        self.reconnects = 0

    @property
    def env_steps_per_sample(self) -> int:
        return int(self.server_config.get("env_steps_per_sample", 500))

    @property
    def force_on_policy(self) -> bool:
        return bool(self.server_config.get("force_on_policy", True))

    def connect(self) -> None:
        """Connect and handshake, retrying with exponential backoff until the timeout."""
        deadline = time.monotonic() + self.reconnect_timeout_s
        delay = 0.05
        while True:
            try:
                self._transport.close()
                self._transport.connect()
                self._handshake()
                self._on_connected()
                return
            except (OSError, ConnectionError) as exc:
                self._transport.close()
                if time.monotonic() + delay > deadline:
                    raise TetherConnectionError(
                        f"could not reach a Tether server at {self._transport.host}:{self._transport.port} "
                        f"within {self.reconnect_timeout_s:.0f} s: {exc}"
                    ) from exc
                if self.verbose:
                    print(f"[tether-client] server unreachable ({exc}); retrying in {delay:.2f} s", file=sys.stderr)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _handshake(self) -> None:
        ping: dict[str, Any] = {
            "type": MessageType.PING.value,
            "protocol_version": PROTOCOL_VERSION,
            "client_name": self.client_name,
        }
        if self.auth_token is not None:
            ping["auth_token"] = self.auth_token
        self.server_info = self._answer(self._transport.request(ping))
        server_version = self.server_info.get("protocol_version")
        if server_version is not None and parse_version(str(server_version))[0] != parse_version(PROTOCOL_VERSION)[0]:
            raise VersionMismatchError(
                "VERSION_MISMATCH", f"server speaks RLlink {server_version}, this client {PROTOCOL_VERSION}", "PING"
            )
        self.server_config = self._answer(self._transport.request({"type": MessageType.GET_CONFIG.value}))

    def _answer(self, responses: list[tuple[MessageType | None, dict[str, Any]]]) -> dict[str, Any]:
        """The response to the request just made; raise it if it is an ERROR.

        ERRORs for earlier fire-and-forget EPISODES are kept and raised by
        ``raise_deferred`` once the current response has been applied.
        """
        for _, message in responses[:-1]:
            self._deferred_errors.append(server_error_from_message(message))
        final = responses[-1][1]
        if final.get("type") == MessageType.ERROR.value:
            raise server_error_from_message(final)
        return final

    def request_now(self, message: dict[str, Any]) -> dict[str, Any]:
        """One request on the current connection, no reconnect (used during the handshake)."""
        return self._answer(self._transport.request(message))

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send a request, surviving disconnects: reconnect and resend until answered."""
        while True:
            try:
                if not self._transport.connected:
                    raise ConnectionError("not connected")
                return self._answer(self._transport.request(message))
            except ServerError:
                raise
            except (OSError, ConnectionError):
                self.reconnects += 1
                self.connect()

    def send(self, message: dict[str, Any]) -> None:
        """Send a request that has no response (EPISODES), reconnecting once if needed."""
        try:
            self._transport.send(message)
        except (OSError, ConnectionError):
            self.reconnects += 1
            self.connect()
            self._transport.send(message)

    def raise_deferred(self) -> None:
        """Raise the first ERROR the server sent for an earlier EPISODES message."""
        if self._deferred_errors:
            error, self._deferred_errors = self._deferred_errors[0], []
            raise error

    def close(self) -> None:
        self._transport.close()
