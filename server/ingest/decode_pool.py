"""Decodes large frame bodies in a separate process, off the event loop.

Why a process: parsing a 16 MiB EPISODES body with orjson takes ~300 ms here
and orjson holds the GIL throughout, so a decoding thread would still delay
the loop's PING answers by the whole parse; chunked validation with yields
cannot split the parse itself. Measured with bench/ingest.py --ping-probe
(16 MiB frames): PING p99 591 ms inline, 26 ms with the worker, and the
same decode time per message (the copies to and from the worker cost ~30 ms
of ~650). A worker process parses the JSON and turns each
episode record into validated numpy arrays (the pure part of ingest); only
the arrays come back (pickled numpy arrays cost a copy, not a parse), and the
event loop then runs the checks that need server state.

Bodies of at least ``threshold_bytes`` always go to a worker. Medium bodies
(``share_bytes`` and up) go to a worker while it has fewer than
``SHARE_QUEUE`` bodies in flight (one decoding, the next ones waiting, so it
never idles between them), and are decoded inline otherwise: the round trip
makes that one message a little slower, but the loop meanwhile serves other
clients on another core. Small bodies are always decoded inline. A body's size here is that of its
JSON text: a binary attachment (protocol 1.4) is read where it lies, at no parse cost.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Any

from tether.protocol.errors import ErrorCode, MessageError
from tether.protocol.messages import MessageType, decode_message
from tether.protocol.multi_agent import MultiAgentRecord

from .record_decode import decode_record

#: Bodies at least this large are decoded in a worker process.
DEFAULT_THRESHOLD_BYTES = 1 << 20

#: Bodies at least this large are decoded in a worker process while it is not too busy.
DEFAULT_SHARE_BYTES = 64 << 10

#: Medium bodies in flight per worker: one being decoded and two waiting.
SHARE_QUEUE = 3


def default_workers() -> int:
    """One worker per core this process may use beyond the event loop's, at least one, at most four."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 2
    return max(1, min(4, cores - 1))

#: Fields of a non-episode request that the server reads; a large request of
#: another type comes back with only these (unknown fields are ignored anyway).
_REQUEST_FIELDS = ("type", "protocol_version", "client_name", "auth_token", "weights_seq_no", "weights_seq_nos",
                   "agent_ids", "episode_id")

_EPISODE_TYPES = (MessageType.EPISODES, MessageType.EPISODES_AND_GET_STATE)

# Set in the worker process by _init_worker.
_specs: dict[str, Any] = {}
_default_module: str | None = None
_require_logp = False


#: How often a worker checks that the server that started it is still alive.
PARENT_CHECK_S = 1.0


def _exit_with_parent(parent_pid: int) -> None:
    # A worker holds both ends of its task queue's pipe (multiprocessing passes the
    # whole queue to a spawned child), so a killed server never closes it and the
    # worker would wait on it forever; it leaves once it has been re-parented.
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def _init_worker(server_pid: int, specs: dict[str, Any], default_module: str | None, require_logp: bool) -> None:
    global _specs, _default_module, _require_logp
    # Ctrl-C reaches the whole process group; the server shuts the worker down itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The server's pid comes from the server: one killed while this worker was still
    # starting has already been replaced as its parent.
    threading.Thread(target=_exit_with_parent, args=(server_pid,), name="parent-watch", daemon=True).start()
    _specs, _default_module, _require_logp = specs, default_module, require_logp


def predecode_record(record: Any, index: int, specs: dict[str, Any], default_module: str | None,
                     require_logp: bool) -> tuple[bool, MultiAgentRecord] | MessageError:
    """``decode_record`` in a worker: (is multi-agent, record), or the MessageError, returned
    rather than raised (a nesting or number overflow becomes one that names the record)."""
    try:
        return decode_record(record, index, specs, default_module, require_logp)
    except MessageError as exc:
        return exc
    except RecursionError:
        return MessageError(ErrorCode.INVALID_FIELD, f"episodes[{index}]: a value is nested too deeply")
    except OverflowError as exc:
        return MessageError(ErrorCode.NON_FINITE_VALUE, f"episodes[{index}]: a number is out of range: {exc}")


def _decode_in_worker(body: bytes) -> tuple[Any, ...]:
    """("ok", kind, message, predecoded) or ("error", code, text, request_type)."""
    try:
        kind, message = decode_message(body)
    except MessageError as exc:
        return ("error", exc.code.value, exc.message, None)
    if kind not in _EPISODE_TYPES:
        return ("ok", kind.value, {k: message[k] for k in _REQUEST_FIELDS if k in message}, None)
    records = message.get("episodes")
    if not isinstance(records, list):
        return ("ok", kind.value, message, None)  # small once the list is gone; the loop refuses it
    predecoded: list[Any] = []
    for index, record in enumerate(records):
        item = predecode_record(record, index, _specs, _default_module, _require_logp)
        predecoded.append(item)
        if isinstance(item, MessageError):
            break  # a message is all-or-nothing: later records are never looked at
    stub = {k: v for k, v in message.items() if k != "episodes"}
    stub["episodes"] = [None] * len(records)
    return ("ok", kind.value, stub, predecoded)


class DecodePool:
    """Worker processes that decode large bodies (and medium ones while the
    workers are not too busy); falls back to inline decoding if a worker fails."""

    def __init__(self, specs: dict[str, Any], default_module: str | None, require_logp: bool,
                 threshold_bytes: int = DEFAULT_THRESHOLD_BYTES, share_bytes: int = DEFAULT_SHARE_BYTES,
                 workers: int | None = None) -> None:
        self.threshold_bytes = threshold_bytes
        self.share_bytes = share_bytes
        self.workers = workers if workers is not None else default_workers()
        self._init_args = (specs, default_module, require_logp)
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._in_flight = 0  # bodies submitted and not yet finished by a worker

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: the server process has threads (torch, the learner).
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker, initargs=(os.getpid(), *self._init_args),
            )
        return self._pool

    def start(self) -> None:
        """Start the workers now (each takes a second to import), not on the first large frame."""
        executor = self._executor()
        for _ in range(self.workers):
            executor.submit(int, 0)

    async def decode(self, body: bytes) -> tuple[Any, ...] | None:
        """A worker's result for the body, or None to decode it inline (a small
        body, a medium one while every worker is busy, or no worker)."""
        # The JSON text is what costs (1.4: a binary attachment after a NUL byte is read in place, §4.3).
        split = body.find(b"\0")
        size = len(body) if split < 0 else split
        if size < self.share_bytes or (size < self.threshold_bytes and self._in_flight >= SHARE_QUEUE * self.workers):
            return None
        try:
            future = self._executor().submit(_decode_in_worker, body)
        except (concurrent.futures.process.BrokenProcessPool, RuntimeError):
            self._pool = None  # new workers next time; this body is decoded inline
            return None
        self._in_flight += 1
        # Counted until the worker is done with it, even if this wait is cancelled.
        loop = asyncio.get_running_loop()
        future.add_done_callback(lambda _: self._call_on(loop, self._finished))
        try:
            return await asyncio.wrap_future(future)
        except concurrent.futures.process.BrokenProcessPool:
            self._pool = None
            return None
        except Exception as exc:  # a worker failure must not drop the connection: decode inline instead
            print(f"[tether] decode worker failed ({exc!r:.200}); decoding inline", file=sys.stderr, flush=True)
            return None

    @staticmethod
    def _call_on(loop: asyncio.AbstractEventLoop, callback: Any) -> None:
        try:
            loop.call_soon_threadsafe(callback)  # the counter lives on the loop's thread
        except RuntimeError:
            pass  # the loop is closed: the server has stopped

    def _finished(self) -> None:
        self._in_flight -= 1

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
