"""Test helpers: a real ``tether serve`` subprocess and a raw RLlink socket."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tether.protocol import FrameDecoder, decode_message, encode_frame

REPO = Path(__file__).resolve().parents[2]
_SERVING = re.compile(r"serving on ([\d.]+):(\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """Runs ``python -m server.cli serve`` with the given flags; port 0 unless given."""

    def __init__(self, tmp_path: Path, *flags: str, port: int = 0, name: str = "server",
                 env: dict[str, str] | None = None) -> None:
        self.summary_file = tmp_path / f"{name}-summary.json"
        self.logdir = tmp_path / f"{name}-run"
        self.cmd = [sys.executable, "-m", "tether.server.cli", "serve", "--port", str(port), "--logdir", str(self.logdir),
                    "--summary-file", str(self.summary_file), "--no-tensorboard", *flags]
        self.lines: list[str] = []
        self.port = port
        self.env = env or {}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> "ServerProcess":
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1", **self.env))
        ready = threading.Event()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line.rstrip())
                match = _SERVING.search(line)
                if match:
                    self.port = int(match.group(2))
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(timeout):
            self.kill()
            raise RuntimeError("server did not start:\n" + "\n".join(self.lines))
        return self

    def stop(self, timeout: float = 30.0) -> dict[str, Any]:
        """SIGTERM (as an operator would), wait, and return the run summary."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout)
        return self.summary()

    def wait(self, timeout: float) -> dict[str, Any]:
        assert self.proc is not None
        self.proc.wait(timeout)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        return json.loads(self.summary_file.read_text())

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.kill()


class RawClient:
    """A bare socket speaking frames, for sending exactly the bytes a test wants."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.decoder = FrameDecoder()

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(encode_frame(message))

    def receive(self) -> dict[str, Any]:
        while True:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed by server")
            bodies = self.decoder.feed(data)
            if bodies:
                assert len(bodies) == 1, "one response per request"
                return decode_message(bodies[0])[1]

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        self.send(message)
        return self.receive()

    def is_closed_by_server(self, timeout: float = 5.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def close(self) -> None:
        self.sock.close()


def two_free_ports() -> int:
    """A free port P with P + 1 free too (a group's rank i listens on P + i, docs/scale-out.md)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


def read_until_closed(sock: socket.socket, timeout: float = 15.0) -> bytes:
    """Everything the server sends before it closes ``sock`` (what came, if it does not in time)."""
    sock.settimeout(timeout)
    received = b""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return received
            received += data
    except OSError:  # (socket.timeout and a reset are OSErrors)
        return received


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
