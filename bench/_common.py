"""Helpers shared by the benchmark scripts: free ports, waiting for a server,
and process cleanup that runs however the benchmark ends."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

_children: list[subprocess.Popen] = []


def log(*parts: object) -> None:
    """Progress goes to stderr; stdout is reserved for the one JSON result."""
    print("[bench]", *parts, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    """Environment for child processes: the repository importable, output unbuffered."""
    path = str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")


def spawn(cmd: list[str], **kw: object) -> subprocess.Popen:
    """Start a child in its own process group (so its own children die with it)
    and remember it for cleanup."""
    kw.setdefault("env", child_env())
    kw.setdefault("cwd", str(REPO_ROOT))
    proc = subprocess.Popen(cmd, start_new_session=True, **kw)  # type: ignore[call-overload]
    _children.append(proc)
    return proc


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc: subprocess.Popen, grace_s: float = 5.0) -> int | None:
    """SIGTERM the child's process group, then SIGKILL after ``grace_s``."""
    if proc.poll() is None:
        _kill_group(proc, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
    else:
        # The leader exited; make sure nothing it started lingers.
        _kill_group(proc, signal.SIGKILL)
    return proc.returncode


def stop_all() -> None:
    while _children:
        proc = _children.pop()
        stop(proc, grace_s=2.0)


def _on_signal(signum: int, _frame: object) -> None:
    stop_all()
    sys.exit(128 + signum)


def install_cleanup() -> None:
    """Children are stopped at exit, on SIGTERM/SIGINT/SIGHUP, and on exceptions."""
    atexit.register(stop_all)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)


def wait_for_port(port: int, proc: subprocess.Popen | None, timeout_s: float, poll_s: float = 0.005) -> float:
    """Block until something accepts TCP connections on ``port``; returns time.time() then."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return time.time()
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on port {port} after {timeout_s} s") from None
            time.sleep(poll_s)
