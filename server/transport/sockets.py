"""Sockets and descriptors, shared by the TCP and websocket transports: keepalive, the
kernel's accept queue, and how many connections the process's open-file limit allows."""

from __future__ import annotations

import os
import socket

#: How long a closing connection may take to flush its last ERROR before it is aborted.
CLOSE_GRACE_S = 2.0
#: Connections the kernel queues, and asyncio accepts in one go, before handlers run.
BACKLOG = 128
#: Descriptors kept free for files, logs and checkpoints when capping connections.
SPARE_FDS = 32
#: Seconds between two reports of the same accept error (no flood on stderr).
ACCEPT_ERROR_REPORT_S = 60.0
#: Seconds of silence before the kernel probes an idle peer (TCP keepalive).
KEEPALIVE_IDLE_S = 30


def enable_keepalive(sock: socket.socket | None) -> None:
    """Let the kernel detect a vanished peer on an idle connection (best effort)."""
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    except OSError:
        pass


def open_file_limit() -> int | None:
    """The soft RLIMIT_NOFILE after raising it as far as the hard limit allows (None if unknown)."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return None if soft == resource.RLIM_INFINITY else soft


def listen(fd: int, backlog: int) -> None:
    """Set the kernel's queue of a listening socket to ``backlog`` connections (best effort)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:  # the same socket; closing the duplicate leaves it open
            sock.listen(backlog)
    except OSError:
        pass


def open_descriptors() -> int:
    """Descriptors this process has open (a guess where /proc is missing)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64


def descriptor_budget(limit: int, backlog: int, max_connections: int) -> tuple[int, int]:
    """The accept backlog and max_connections that fit ``limit`` open files beside what is in use now.

    The loop accepts up to ``backlog`` peers per iteration, and a refused one holds its
    descriptor for about three more iterations (transport, handler, close): four bursts,
    and what is in use now, are kept free; a tight limit gets a smaller backlog."""
    in_use = open_descriptors()
    backlog = min(backlog, max(16, (limit - in_use - SPARE_FDS) // 8))
    reserved = in_use + 4 * backlog + SPARE_FDS
    if max_connections > limit - reserved:
        max_connections = max(1, limit - reserved)
    return backlog, max_connections
