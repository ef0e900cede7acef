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


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands out for a bind to port 0 or an outgoing connection."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


#: Ports this process handed out (never twice).
_handed_out: set[int] = set()


def free_port(count: int = 1) -> int:
    """A port P, with P .. P + count - 1 free now, for a process that binds it later. Drawn below the
    kernel's ephemeral range: a port the kernel handed out (bound to 0 and closed) can be given again,
    meanwhile, to any process's outgoing connection or listener (gloo's, a client's), which then holds
    it when the server binds it (an "address already in use" seen in a two-rank test)."""
    import random

    top = _ephemeral_floor() - count
    for _ in range(200):
        port = random.randrange(20000, top)
        wanted = range(port, port + count)
        if any(p in _handed_out for p in wanted):
            continue
        try:
            for p in wanted:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", p))
        except OSError:
            continue
        _handed_out.update(wanted)
        return port
    raise RuntimeError(f"no {count} consecutive free ports below {top + count}")


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
    return free_port(2)


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
