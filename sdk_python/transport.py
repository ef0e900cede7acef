"""A blocking TCP transport around the Sans-I/O ``ClientConnection``."""

from __future__ import annotations

import socket
from typing import Any

from .protocol.connection import ClientConnection
from .protocol.messages import MessageType


class SocketTransport:
    """One TCP connection; ``request`` sends a request and returns its response pair."""

    def __init__(self, host: str, port: int, connect_timeout_s: float = 5.0, max_frame_bytes: int | None = None) -> None:
        self.host = host
        self.port = port
        self.connect_timeout_s = connect_timeout_s
        self._conn = ClientConnection(max_frame_bytes) if max_frame_bytes else ClientConnection()
        self._sock: socket.socket | None = None
        self._pending: list[tuple[MessageType | None, dict[str, Any]]] = []

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)
        self._sock = sock
        self._conn.reset()
        self._pending.clear()

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def send(self, message: dict[str, Any]) -> None:
        """Send a request that has no response (EPISODES)."""
        if self._sock is None:
            raise ConnectionError("not connected")
        self._sock.sendall(self._conn.send(message))

    def request(self, message: dict[str, Any]) -> list[tuple[MessageType | None, dict[str, Any]]]:
        """Send a request and read until its response arrives.

        Returns every response read on the way, in order: the last one answers
        this request; earlier ones are ERRORs for fire-and-forget EPISODES.
        """
        self.send(message)
        assert self._sock is not None
        received: list[tuple[MessageType | None, dict[str, Any]]] = []
        while True:
            while self._pending:
                item = self._pending.pop(0)
                received.append(item)
                if item[0] is not None:
                    return received
            data = self._sock.recv(1 << 20)
            if not data:
                self.close()
                raise ConnectionError(f"server {self.host}:{self.port} closed the connection")
            try:
                self._pending.extend(self._conn.receive_data(data))
            except Exception:
                self.close()  # the stream cannot be trusted after a protocol violation
                raise
