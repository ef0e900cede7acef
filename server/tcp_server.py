"""The asyncio TCP transport: moves bytes between sockets and the Sans-I/O
``ServerConnection``, and routes requests to the ``Trainer``.

What one peer can cost is bounded:

- one request in flight per connection: the server takes the next frame of a
  connection only after the previous answer has been handed to the socket
  (``drain``), so a peer that pipelines requests and never reads its answers
  stalls itself, not the server;
- answers to GET_STATE reuse one encoded SET_STATE frame per weights version;
- a connection is *handshaking* until it completes its handshake (with an auth
  token: authenticated; without: its first request was accepted), and must do so
  within ``handshake_timeout_s`` (HANDSHAKE_TIMEOUT); with a token it gets a small
  frame limit meanwhile, and a wrong token closes the connection;
- at most ``max_connections`` connections (TOO_MANY_CONNECTIONS), of which at most
  ``max_handshaking_connections`` handshaking: one more closes the oldest handshaking
  connection (HANDSHAKE_TIMEOUT), so silent sockets cannot lock clients out, and never
  an established one;
- with a token, an address that sent ``auth_max_failures`` wrong tokens has its
  connections refused for a while (AUTH_THROTTLED; see ``AuthThrottle``);
- the unfinished frames of all connections together hold at most
  ``max_partial_frame_bytes`` (the largest holder is closed, SERVER_OVERLOADED);
- a connection silent for ``client_timeout_s`` while it is owed no answer is
  closed (CLIENT_TIMEOUT).

Each connection-level refusal is one unsolicited ERROR (no "request" field),
then the server closes the connection.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import itertools
import os
import socket
import sys
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from tether.sdk.protocol.connection import Refusal, ServerConnection, ServerState
from tether.sdk.protocol.errors import ErrorCode, FramingError, MessageError
from tether.sdk.protocol.framing import encode_frame
from tether.sdk.protocol.messages import MessageType, error_message, parse_version

from .batch_dedup import batch_id
from .decode_pool import DecodePool
from .ingest import message_env_steps
from .trainer import UNVERIFIED_VERSION, Trainer

_READ_SIZE = 1 << 20
#: Messages with up to this many observation values have their behaviour logp
#: checked on the event loop (a few ms at most); larger ones in a thread, beside it.
_INLINE_LOGP_CHECK_VALUES = 65_536


def _obs_values(records: list) -> int:
    """Observation values in a message's records: what the logp check's forward pass costs."""
    return sum(agent.chunk.obs.size for record in records for agent in record.agents)

#: How much longer a client that did not announce protocol 1.3 (and so sends no
#: heartbeats) may stay silent than client_timeout_s.
LEGACY_TIMEOUT_FACTOR = 10


def _speaks_1_3(connection: ServerConnection) -> bool:
    """Whether the client's PING announced protocol 1.3 or later (it then sends heartbeats)."""
    try:
        return connection.client_version is not None and parse_version(connection.client_version) >= (1, 3)
    except ValueError:
        return False
#: StreamReader stops reading a socket once it holds 2x this; kept small because
#: a connection's bytes wait there while its current request is answered.
_STREAM_LIMIT = 256 * 1024
#: How long a closing connection may take to flush its last ERROR before it is aborted.
_CLOSE_GRACE_S = 2.0
#: Connections the kernel queues, and asyncio accepts in one go, before handlers run.
_BACKLOG = 128
#: Descriptors kept free for files, logs and checkpoints when capping connections.
_SPARE_FDS = 32
#: Seconds between two reports of the same accept error (no flood on stderr).
_ACCEPT_ERROR_REPORT_S = 60.0
#: Seconds of silence before the kernel probes an idle peer (TCP keepalive).
_KEEPALIVE_IDLE_S = 30
#: Wrong auth tokens of one address are counted over this many seconds.
AUTH_FAILURE_WINDOW_S = 60.0
#: The first refusal of an address after wrong tokens lasts this long; each next one twice as long.
AUTH_FIRST_BACKOFF_S = 1.0
#: Addresses whose wrong tokens are remembered at once (the least recently seen is forgotten first).
AUTH_THROTTLE_ADDRESSES = 4096


def handshake_share(max_connections: int, configured: int = 0) -> int:
    """How many of ``max_connections`` may be handshaking at once (``configured``, 0: max(8, 1/8 of them))."""
    return max(1, min(max_connections, configured or max(8, max_connections // 8)))


def peer_address(peer: Any) -> str | None:
    """The address a peer's wrong tokens are counted under: its IPv4 address, or its IPv6
    /64 network (one host usually holds a whole /64); None when the peer has no IP address."""
    if not isinstance(peer, tuple) or not peer or not isinstance(peer[0], str):
        return None
    try:
        ip = ipaddress.ip_address(peer[0].split("%", 1)[0])
    except ValueError:
        return peer[0]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class _AddressRecord:
    __slots__ = ("failures", "blocked_until", "backoff", "last")

    def __init__(self) -> None:
        self.failures: deque[float] = deque()  # times of wrong tokens not yet answered by a refusal
        self.blocked_until = 0.0
        self.backoff = 0.0  # length of the last refusal period (0: none yet)
        self.last = 0.0  # the latest wrong token or the end of the refusal period, whichever is later


class AuthThrottle:
    """Wrong auth tokens per address, and how long an address is refused for them.

    ``max_failures`` wrong tokens within ``window_s`` start a refusal period of
    ``first_backoff_s``; after it, each further wrong token starts one twice as long
    as the last, up to ``max_backoff_s``. An address quiet for ``window_s`` after its
    last wrong token (or refusal period) starts afresh. At most ``max_addresses`` are
    remembered; the least recently seen is forgotten first. Every client behind one
    address (one host, one NAT) shares its record.
    """

    def __init__(self, max_failures: int = 5, max_backoff_s: float = 60.0, window_s: float = AUTH_FAILURE_WINDOW_S,
                 first_backoff_s: float = AUTH_FIRST_BACKOFF_S, max_addresses: int = AUTH_THROTTLE_ADDRESSES) -> None:
        self.max_failures = max_failures
        self.max_backoff_s = max_backoff_s
        self.window_s = window_s
        self.first_backoff_s = min(first_backoff_s, max_backoff_s)
        self.max_addresses = max_addresses
        self._records: OrderedDict[str, _AddressRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def _record(self, address: str, now: float) -> _AddressRecord | None:
        record = self._records.get(address)
        if record is not None and now - record.last >= self.window_s:
            del self._records[address]  # quiet long enough: forgiven
            return None
        return record

    def refused_for(self, address: str | None, now: float) -> float:
        """Seconds for which connections from ``address`` are still refused (0: none)."""
        if address is None:
            return 0.0
        record = self._record(address, now)
        if record is None or record.blocked_until <= now:
            return 0.0
        self._records.move_to_end(address)
        return record.blocked_until - now

    def failed(self, address: str | None, now: float) -> float:
        """Count a wrong token from ``address``; returns the refusal period it starts (0: none)."""
        if address is None:
            return 0.0
        record = self._record(address, now)
        if record is None:
            record = self._records[address] = _AddressRecord()
            while len(self._records) > self.max_addresses:
                self._records.popitem(last=False)
        self._records.move_to_end(address)
        record.last = max(record.last, now)
        if record.blocked_until > now:  # (a guess sent before the period began): it does not extend it
            return 0.0
        record.failures.append(now)
        while record.failures and now - record.failures[0] >= self.window_s:
            record.failures.popleft()
        if record.backoff == 0.0 and len(record.failures) < self.max_failures:
            return 0.0
        record.failures.clear()
        record.backoff = (min(self.max_backoff_s, record.backoff * 2) if record.backoff
                          else self.first_backoff_s)
        record.blocked_until = now + record.backoff
        record.last = record.blocked_until
        return record.backoff


class ClientSession:
    """What the server remembers about one connected client."""

    _ids = itertools.count(1)

    def __init__(self, peer: Any) -> None:
        self.id = next(self._ids)
        self.peer = peer
        #: weights_seq_no per module last sent to this client; used when a client omits it.
        self.last_sent: dict[str, int] = {}
        #: weights_seq_no per module whose model (onnx_file) this connection was sent: it holds it.
        self.models_sent: dict[str, int] = {}
        #: Agent steps of this connection's data not stored as stale since its last SET_STATE (§13.2).
        self.refused_stale = 0


class OpenConnection:
    """Transport-side bookkeeping of one connection, TCP or websocket, from its
    first byte: it counts toward max_connections (and, until its handshake is
    complete, toward the handshaking share of them) and holds its share of
    max_partial_frame_bytes."""

    __slots__ = ("key", "address", "partial_bytes", "evicted", "refusal", "established", "answering", "speaks_1_3",
                 "_evict")
    _keys = itertools.count(1)

    def __init__(self, evict: Callable[[bytes, bool], None], address: str | None = None) -> None:
        self.key = next(self._keys)
        #: What the peer's wrong auth tokens are counted under (see ``peer_address``).
        self.address = address
        #: Bytes of unfinished frames (or websocket messages) held for this connection.
        self.partial_bytes = 0
        #: Set when the server closed this connection for others (memory, or a handshaking slot).
        self.evicted = False
        #: The ERROR it is refused with as it arrives (TOO_MANY_CONNECTIONS, AUTH_THROTTLED), or None.
        self.refusal: bytes | None = None
        #: Set once its handshake is complete: from then on no newcomer can close it.
        self.established = False
        #: Set while one of its requests is being answered (a handshaking one is then not closed for a newcomer).
        self.answering = False
        #: Its PING announced protocol 1.3 or later (it is told TRAINING_DONE at the end of the run).
        self.speaks_1_3 = False
        self._evict = evict

    @property
    def over_limit(self) -> bool:
        """Whether it was refused on arrival (it is not counted among the open connections)."""
        return self.refusal is not None

    def evict(self, frame: bytes, current: bool) -> None:
        """Send ``frame`` (a connection-level ERROR) and close; ``current``: its own handler is running now."""
        self.evicted = True
        self._evict(frame, current)


def _evict_stream(writer: asyncio.StreamWriter) -> Callable[[bytes, bool], None]:
    def evict(frame: bytes, current: bool) -> None:
        writer.write(frame)
        if not current:
            # Its handler sees EOF and cleans up. A peer that does not read (answers still queued) is
            # cut off at once: no longer counted, it must not keep its descriptor until a deadline.
            if writer.transport.get_write_buffer_size():
                writer.transport.abort()
            else:
                writer.close()
    return evict


def _encode_error(code: ErrorCode, text: str, request: str | None) -> bytes:
    """An ERROR frame; text quoting a received string keeps a lone surrogate as an escape."""
    return encode_frame(error_message(code, text.encode("utf-8", "backslashreplace").decode("utf-8"), request))


def _encode_echo(message: dict[str, Any]) -> bytes:
    """Encode an answer that repeats strings the client sent. JSON may escape a
    lone surrogate, which is no Unicode text and cannot be written back as UTF-8."""
    try:
        return encode_frame(message)
    except TypeError:
        raise MessageError(ErrorCode.INVALID_FIELD, "a string holds a lone surrogate (\\ud800-\\udfff escape), "
                                                    "which is not Unicode text") from None


class _Close(Exception):
    """Ends a connection's handler after its last frame was written."""


def enable_keepalive(sock: socket.socket | None) -> None:
    """Let the kernel detect a vanished peer on an idle connection (best effort)."""
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", _KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
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


def _open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64


class TetherServer:
    """Accepts clients on one port and serves them concurrently, within the configured limits."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.config = trainer.config
        self._server: asyncio.base_events.Server | None = None
        self._config_frame = encode_frame(self._config_message())
        self.ingest = trainer.ingest
        #: Large bodies are parsed and validated in another process (see decode_pool).
        self._logp_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-logp-check")
        self.decode_pool = DecodePool(trainer.layout.specs, trainer.layout.default_module(),
                                      trainer.config.force_on_policy)
        self._handlers: set[asyncio.Task] = set()
        #: Every open connection, TCP and websocket (see ws_server), by key.
        self._open: dict[int, OpenConnection] = {}
        self._partial_total = 0
        self.max_connections = self.config.max_connections
        #: Connections past their handshake (the clients record_share is shared among, §13.2).
        self.established_connections = 0
        #: Connections still in their handshake (see OpenConnection.established), oldest first.
        self._handshaking: dict[int, OpenConnection] = {}
        self.max_handshaking = handshake_share(self.max_connections, self.config.max_handshaking_connections)
        #: Peers accepted per loop iteration (set by ``start``), fewer than the handshaking share.
        self.accept_burst = max(1, self.max_handshaking // 4)
        #: Wrong auth tokens per address; None without a token (nothing to guess).
        self.auth_throttle = (AuthThrottle(self.config.auth_max_failures, self.config.auth_backoff_max_s)
                              if self.config.auth_token else None)
        self.max_partial_frame_bytes = max(self.config.max_partial_frame_bytes, self.config.max_frame_bytes)
        #: Encoded SET_STATE frames of the current weights, keyed by what they contain.
        self._state_frames: dict[tuple, bytes] = {}
        self._state_versions: tuple = ()
        #: Connections refused or closed by a limit, by error code (for tests and logs).
        self.closed_by_limit: dict[str, int] = {}
        #: Told of connections, requests, refusals and stored batches (the console's ConsoleState), or None.
        self.observer: Any = None

    def _config_message(self) -> dict[str, Any]:
        message = self.trainer.config_message()
        timeout = self.config.client_timeout_s
        if timeout > 0:  # absent: the server never drops a silent client
            message["client_timeout_s"] = timeout
            message["heartbeat_interval_s"] = timeout / 4
        message["session_state_ttl_s"] = self.config.session_state_ttl_s
        return message

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        limit = open_file_limit()
        backlog = min(_BACKLOG, self.max_connections)
        self.decode_pool.start()  # its workers' pipes count among the descriptors in use
        if limit is not None:
            in_use = _open_descriptors()
            # The loop accepts up to `backlog` peers per iteration, and a refused one holds its
            # descriptor for about three more iterations (transport, handler, close): keep four
            # bursts, and what is in use now, free; a tight limit gets a smaller backlog.
            backlog = min(backlog, max(16, (limit - in_use - _SPARE_FDS) // 8))
            reserved = in_use + 4 * backlog + _SPARE_FDS
            if self.max_connections > limit - reserved:
                capped = max(1, limit - reserved)
                print(f"[tether] max_connections {self.max_connections} lowered to {capped}: the process may open "
                      f"only {limit} files", file=sys.stderr, flush=True)
                self.max_connections = capped
        self.max_handshaking = handshake_share(self.max_connections, self.config.max_handshaking_connections)
        asyncio.get_running_loop().set_exception_handler(self._loop_exception)
        # asyncio accepts up to `backlog` peers per loop iteration before any of them is read: fewer than
        # the handshaking share, so a client's PING, sent as it connects, is read before a burst of newer
        # arrivals can make it the oldest handshaking connection. The kernel still queues `backlog`.
        burst = self.accept_burst = max(1, min(backlog, self.max_handshaking // 4))
        self._server = await asyncio.start_server(
            self._handle_client, self.config.host, self.config.port, limit=_STREAM_LIMIT, backlog=burst,
        )
        if burst < backlog:
            for listening in self._server.sockets:
                listen(listening.fileno(), backlog)

    _last_accept_error = 0.0

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """Report running out of descriptors in one line now and then, not once per attempt."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            now = time.monotonic()
            if now - self._last_accept_error >= _ACCEPT_ERROR_REPORT_S:
                self._last_accept_error = now
                print(f"[tether] cannot accept connections: {exc.strerror} ({len(self._open)} open); "
                      f"lower max_connections or raise the open-file limit", file=sys.stderr, flush=True)
            return
        loop.default_exception_handler(context)

    async def say_goodbye(self, summary: dict[str, Any], flush_s: float = 1.0) -> None:
        """The run is done (§6.6): every connection past its handshake whose client speaks 1.3 gets an
        unsolicited ERROR TRAINING_DONE with the run's ``summary`` and is closed; others are closed by
        ``stop`` as before. Waits up to ``flush_s`` for those connections to close."""
        if self._server is not None:
            self._server.close()  # no newcomer is served after the goodbye
        reason = summary.get("reason")
        text = (f"training is done ({reason}): {summary.get('updates')} updates, "
                f"{summary.get('agent_steps_trained')} agent steps trained; do not reconnect")
        frame = encode_frame({**error_message(ErrorCode.TRAINING_DONE, text), "summary": summary})
        told = [c for c in list(self._open.values()) if c.established and c.speaks_1_3 and not c.evicted]
        for conn in told:
            conn.evict(frame, False)
        deadline = asyncio.get_running_loop().time() + flush_s
        while any(c.key in self._open for c in told) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        self.decode_pool.close()
        self._logp_executor.shutdown(wait=False)

    # -- one connection ----------------------------------------------------------

    async def _handle_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        session = ClientSession(writer.get_extra_info("peername"))
        conn = self.open_connection(_evict_stream(writer), session.peer)
        if conn.refusal is not None:
            writer.write(conn.refusal)
            await self._close(writer)
            self._handlers.discard(task)
            return
        enable_keepalive(writer.get_extra_info("socket"))
        connection = ServerConnection(self.config.max_frame_bytes, self.config.auth_token,
                                      pre_auth_max_frame_bytes=self.config.pre_auth_max_frame_bytes)
        metrics = self.trainer.metrics
        metrics.clients_connected += 1
        if self.observer is not None:
            self.observer.connected(session.id, session.peer)
        try:
            await self._serve(conn, session, connection, reader, writer)
        except (_Close, ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        except Exception as exc:  # one connection's failure must never reach the others (nor print a traceback)
            print(f"[tether] connection from {session.peer} failed: {exc!r:.300}", file=sys.stderr, flush=True)
        finally:
            metrics.clients_connected -= 1
            if self.observer is not None:
                self.observer.disconnected(session.id)
            self.close_connection(conn)
            self.trainer.forget_connection(session.id)
            self._handlers.discard(task)
            await self._close(writer)

    async def _serve(self, conn: OpenConnection, session: ClientSession, connection: ServerConnection,
                     reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        # Until its handshake is complete (None from then on).
        handshake_deadline: float | None = loop.time() + self.config.handshake_timeout_s
        client_timeout = self.config.client_timeout_s or None
        while True:
            # Answer every complete frame, one at a time: the next one is parsed
            # only after this answer is on its way (one request in flight).
            while True:
                try:
                    body = connection.next_body()
                except FramingError as exc:
                    await self._refuse(writer, connection.framing_error_frame(exc))
                if body is None or conn.evicted:
                    break
                conn.answering = True
                try:
                    frame, closes = await self.answer(session, connection, body, conn)
                finally:
                    conn.answering = False
                del body
                if closes:
                    await self._refuse(writer, frame)
                if handshake_deadline is not None and conn.established:
                    handshake_deadline = None
                if frame is not None:
                    writer.write(frame)
                    if handshake_deadline is None:
                        await writer.drain()
                    else:  # a peer that does not read its refusals must not outlive the handshake deadline
                        await self._before(handshake_deadline, writer.drain(), writer, ErrorCode.HANDSHAKE_TIMEOUT)
            self.set_partial(conn, connection.buffered_bytes)
            # Wait for more bytes; silence is bounded by the handshake deadline, then by the client timeout.
            if handshake_deadline is not None:
                data = await self._before(handshake_deadline, reader.read(_READ_SIZE), writer,
                                          ErrorCode.HANDSHAKE_TIMEOUT)
            elif client_timeout is not None:
                # Clients older than 1.3 send no heartbeats (an engine paused in a menu is silent):
                # they get LEGACY_TIMEOUT_FACTOR times longer; TCP keepalive finds dead peers sooner.
                wait = client_timeout if _speaks_1_3(connection) else client_timeout * LEGACY_TIMEOUT_FACTOR
                data = await self._before(loop.time() + wait, reader.read(_READ_SIZE), writer,
                                          ErrorCode.CLIENT_TIMEOUT)
            else:
                data = await reader.read(_READ_SIZE)
            if not data or conn.evicted:
                return  # EOF; a partial frame is discarded, nothing stored
            connection.add_data(data)
            self.set_partial(conn, connection.buffered_bytes)
            if conn.evicted:
                return

    async def _before(self, deadline: float, awaitable: Any, writer: asyncio.StreamWriter, code: ErrorCode) -> Any:
        """Await ``awaitable`` until ``deadline`` (loop time); past it, refuse with ``code`` and close."""
        try:
            async with asyncio.timeout_at(deadline):
                return await awaitable
        except TimeoutError:
            pass
        self._count(code)
        if code is ErrorCode.HANDSHAKE_TIMEOUT:
            text = self.handshake_timeout_text()
        else:
            text = (f"no data received for client_timeout_s ({self.config.client_timeout_s:g} s; "
                    f"x{LEGACY_TIMEOUT_FACTOR} for clients older than protocol 1.3); "
                    f"an idle client must PING every heartbeat_interval_s")
        await self._refuse(writer, encode_frame(error_message(code, text)))

    def handshake_timeout_text(self) -> str:
        """The message of HANDSHAKE_TIMEOUT at the deadline."""
        limit = self.config.handshake_timeout_s
        if self.config.auth_token:
            return f"not authenticated within {limit:g} s: send PING with auth_token first"
        return f"no request within {limit:g} s of connecting: send PING first"

    async def _refuse(self, writer: asyncio.StreamWriter, frame: bytes) -> None:
        """Write a final ERROR and end the handler (which closes the connection)."""
        writer.write(frame)
        raise _Close()

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        writer.close()
        try:
            async with asyncio.timeout(_CLOSE_GRACE_S):
                await writer.wait_closed()
        except (TimeoutError, ConnectionError, asyncio.CancelledError):
            writer.transport.abort()  # the peer does not read: drop what is left unsent
        except Exception:
            writer.transport.abort()

    def _count(self, code: ErrorCode) -> None:
        self.closed_by_limit[code.value] = self.closed_by_limit.get(code.value, 0) + 1

    # -- memory held by unfinished frames ------------------------------------------

    def set_partial(self, conn: OpenConnection, nbytes: int) -> None:
        """Record what ``conn`` holds; over the global limit, close the largest holders.
        A connection closed, refused or evicted holds nothing the server counts: whatever
        its handler still reads before it ends is not added back."""
        if conn.evicted or self._open.get(conn.key) is not conn:
            return
        self._partial_total += nbytes - conn.partial_bytes
        conn.partial_bytes = nbytes
        while self._partial_total > self.max_partial_frame_bytes:
            # Connections still in their handshake go first: however many bytes they hold
            # together, they cannot make the server close an established one.
            victim = max(self._open.values(),
                         key=lambda c: (not c.established and c.partial_bytes > 0, c.partial_bytes))
            if victim.partial_bytes <= 0:  # (the counts disagree: never spin, never close a connection holding nothing)
                self._partial_total = sum(c.partial_bytes for c in self._open.values())
                break
            self._count(ErrorCode.SERVER_OVERLOADED)
            frame = encode_frame(error_message(
                ErrorCode.SERVER_OVERLOADED,
                f"the server holds {self._partial_total} bytes of unfinished frames from all clients, over its "
                f"limit of {self.max_partial_frame_bytes} (max_partial_frame_bytes); this connection held the "
                f"most ({victim.partial_bytes} bytes) and is closed",
            ))
            self._partial_total -= victim.partial_bytes
            victim.partial_bytes = 0
            victim.evict(frame, victim is conn)

    # -- connections, TCP and websocket ---------------------------------------------

    #: (Defaults of a server whose tables are set up by hand, without ``__init__``.)
    _handshaking: dict[int, OpenConnection] | None = None
    max_handshaking = 0
    auth_throttle: AuthThrottle | None = None
    established_connections = 0

    def open_connection(self, evict: Callable[[bytes, bool], None], peer: Any = None) -> OpenConnection:
        """Counts a new connection (TCP accepted, or websocket at its first byte) from ``peer``
        (its address), handshaking until :meth:`establish`. With the handshaking share or all
        max_connections taken, it closes the oldest handshaking connection to make room; when
        none can be closed (all established), or its address is refused for wrong auth tokens,
        the new one gets ``refusal`` and is not counted: send that and close it."""
        conn = OpenConnection(evict, peer_address(peer))
        if self.auth_throttle is not None:
            wait = self.auth_throttle.refused_for(conn.address, time.monotonic())
            if wait > 0:
                self._count(ErrorCode.AUTH_THROTTLED)
                conn.refusal = self._throttled_frame(conn.address, wait)
                return conn
        if self._handshaking is None:
            self._handshaking = {}
        share = self.max_handshaking or handshake_share(self.max_connections)
        if ((len(self._handshaking) >= share or len(self._open) >= self.max_connections)
                and not self._close_oldest_handshake(share)):
            self._count(ErrorCode.TOO_MANY_CONNECTIONS)
            conn.refusal = self.too_many_connections_frame()
            return conn
        self._open[conn.key] = conn
        self._handshaking[conn.key] = conn
        return conn

    def _close_oldest_handshake(self, share: int) -> bool:
        """Close the oldest handshaking connection not being answered (HANDSHAKE_TIMEOUT) to make
        room for a newer one; False when there is none. Established connections are never closed:
        a peer that cannot complete a handshake can only push out others that have not either."""
        assert self._handshaking is not None
        victim = next((c for c in self._handshaking.values() if not c.answering), None)
        if victim is None:
            return False
        self._count(ErrorCode.HANDSHAKE_TIMEOUT)
        frame = encode_frame(error_message(
            ErrorCode.HANDSHAKE_TIMEOUT,
            f"closed before its handshake was complete: newer connections needed its place ({len(self._handshaking)} "
            f"of {len(self._open)} connections were in their handshake, {share} at most (max_handshaking_connections)"
            f", and this was the oldest); reconnect and send PING at once"))
        self.close_connection(victim)
        victim.evict(frame, False)
        return True

    def establish(self, conn: OpenConnection) -> None:
        """``conn`` completed its handshake: it leaves the handshaking share and no newcomer can close it."""
        if not conn.established:
            self.established_connections += 1
        conn.established = True
        if self._handshaking is not None:
            self._handshaking.pop(conn.key, None)

    def close_connection(self, conn: OpenConnection) -> None:
        """A connection counted by :meth:`open_connection` has ended: its slot and bytes are free."""
        if conn.established and conn.key in self._open:
            self.established_connections -= 1
        if self._handshaking is not None:
            self._handshaking.pop(conn.key, None)
        if self._open.pop(conn.key, None) is not None:
            self._partial_total -= conn.partial_bytes
            conn.partial_bytes = 0

    _last_throttle_report = -_ACCEPT_ERROR_REPORT_S

    def _report_throttled(self, address: str | None, backoff: float) -> None:
        """Tell the operator that someone guesses the token, in one line now and then, not once per address."""
        now = time.monotonic()
        if now - self._last_throttle_report >= _ACCEPT_ERROR_REPORT_S:
            self._last_throttle_report = now
            print(f"[tether] wrong auth tokens from {address}: its connections are refused for {backoff:g} s "
                  f"(further refusals of any address are not reported for {_ACCEPT_ERROR_REPORT_S:g} s)",
                  file=sys.stderr, flush=True)

    def _throttled_frame(self, address: str | None, wait: float) -> bytes:
        return encode_frame(error_message(
            ErrorCode.AUTH_THROTTLED,
            f"too many wrong auth tokens from {address or 'this address'}: its connections are refused for "
            f"{wait:.1f} more s; reconnect then"))

    def too_many_connections_frame(self) -> bytes:
        return encode_frame(error_message(
            ErrorCode.TOO_MANY_CONNECTIONS,
            f"the server already has {len(self._open)} connections, its limit (max_connections); try later"))

    async def answer(self, session: ClientSession, connection: ServerConnection, body: bytes,
                     conn: OpenConnection | None = None) -> tuple[bytes | None, bool]:
        """One received body, answered the same way on every transport: returns the frame to
        send (None: nothing) and whether the connection closes after it. A large body of an
        authenticated peer is parsed and validated in the decode pool, off the event loop.
        ``conn`` (the connection's slot) is established by its first request accepted in
        READY, and its wrong tokens are counted against its address."""
        address = conn.address if conn is not None else None
        throttle = self.auth_throttle if conn is not None and not conn.established else None
        if throttle is not None:
            # A connection opened before its address was refused gets no guess either.
            wait = throttle.refused_for(address, time.monotonic())
            if wait > 0:
                self._count(ErrorCode.AUTH_THROTTLED)
                return self._throttled_frame(address, wait), True
        predecoded = None
        # Workers serve authenticated peers only: an unauthenticated body is refused, not decoded.
        done = await self.decode_pool.decode(body) if connection.state is ServerState.READY else None
        if done is None:
            event = connection.handle_body(body)
        elif done[0] == "error":
            event = connection.handle_body(body, MessageError(ErrorCode(done[1]), done[2]))
        else:
            event = connection.handle_body(body, (MessageType(done[1]), done[2]))
            predecoded = done[3]
        del body, done
        observer = self.observer
        if isinstance(event, Refusal):
            text = event.error.message
            if throttle is not None and event.closes_connection and event.error.code is ErrorCode.AUTH_FAILED:
                backoff = throttle.failed(address, time.monotonic())
                if backoff:
                    text += f"; too many from {address}: its connections are refused for {backoff:g} s"
                    self._report_throttled(address, backoff)
            if observer is not None:
                observer.refused(session.id, event.error.code.value, text, event.request_type)
            return _encode_error(event.error.code, text, event.request_type), event.closes_connection
        if conn is not None and not conn.established and connection.state is ServerState.READY:
            self.establish(conn)
        if conn is not None and event.kind is MessageType.PING:
            conn.speaks_1_3 = _speaks_1_3(connection)
        if observer is not None:
            observer.request(session.id, event.kind.value, event.message)
            started = asyncio.get_running_loop().time()
        frame = await self._respond(session, connection, event.kind, event.message, predecoded)
        if observer is not None:
            observer.answered(session.id, event.kind.value, asyncio.get_running_loop().time() - started)
        return frame, False

    # -- requests ----------------------------------------------------------------

    async def _respond(
        self, session: ClientSession, connection: ServerConnection, kind: MessageType, message: dict,
        predecoded: list | None = None,
    ) -> bytes | None:
        trainer = self.trainer
        try:
            if kind is MessageType.PING:
                return encode_frame(connection.pong())
            if kind is MessageType.GET_CONFIG:
                return self._config_frame
            if kind is MessageType.GET_STATE:
                return self._send_state(session, connection, self._client_holds(message))
            if kind is MessageType.MAP_AGENTS:
                modules = self.ingest.assign(session.id, message)
                return _encode_echo({"type": MessageType.AGENT_MODULES.value, "modules": modules})
            # EPISODES or EPISODES_AND_GET_STATE; a duplicate batch (1.3) is answered as if new, not stored.
            wants_state = kind is MessageType.EPISODES_AND_GET_STATE
            batch = batch_id(message)
            async with trainer.dedup.slot(batch) as duplicate:
                owner = trainer.owner(session.id, batch)  # a resend also re-attaches its session to this connection
                if not duplicate:
                    versions = self._data_versions(session, message)
                    pending = self.ingest.validate(owner, message, via=session.id, predecoded=predecoded)
                    # Versions kept now: data claiming any other one (older than max_staleness, or not
                    # served yet) is not checked, so it must not be trained on either, even if that
                    # version is published while this message waits for room in the pool.
                    # Without the check, the staleness rule alone decides (§13.2: a newer version is accepted).
                    if self.ingest.logp_check is not None:
                        kept = {m: set(h.versions) for m, h in trainer.histories.items()}
                        versions = {m: (v if m not in kept or v in kept[m] else UNVERIFIED_VERSION)
                                    for m, v in versions.items()}
                        _unverified_runs(pending.records, kept)
                    if self.ingest.logp_check is not None and _obs_values(pending.records) <= _INLINE_LOGP_CHECK_VALUES:
                        # About 0.1 us an observation value with a small MLP: for a message this
                        # small, less than a hop to another thread and back costs in GIL hand-offs.
                        self.ingest.logp_check(pending.records, versions)
                    elif self.ingest.logp_check is not None:
                        # A large one: ONNX Runtime releases the GIL, so other clients' PINGs are
                        # answered meanwhile (the check held the loop 80 ms per 80k steps).
                        await asyncio.get_running_loop().run_in_executor(
                            self._logp_executor, self.ingest.logp_check, pending.records, versions)
                    pending.commit()
                    records = pending.records
                    env_steps = message_env_steps(message, records)
                    if self.observer is not None:
                        self.observer.batch(session.id, env_steps, versions, records)
                    session.refused_stale += await trainer.submit(
                        owner, records, versions, wait_for_update=wants_state and self.config.force_on_policy,
                        env_steps=env_steps, source=f"#{session.id} {session.peer}", batch=batch)
            return self._send_state(session, connection, self._client_holds(message)) if wants_state else None
        except MessageError as exc:
            if self.observer is not None:
                self.observer.refused(session.id, exc.code.value, exc.message, kind.value)
            return _encode_error(exc.code, exc.message, kind.value)
        except RecursionError:
            return encode_frame(error_message(ErrorCode.INVALID_FIELD, "a value is nested too deeply", kind.value))
        except OverflowError as exc:
            return encode_frame(error_message(ErrorCode.NON_FINITE_VALUE, f"a number is out of range: {exc}",
                                              kind.value))
        except Exception as exc:  # never let one bad request take the server down
            print(f"[tether] internal error on {kind.value} from {session.peer}: {exc!r:.300}", file=sys.stderr)
            return encode_frame(error_message(ErrorCode.INTERNAL, "internal server error", kind.value))

    @staticmethod
    def _client_holds(message: dict) -> Any:
        """What the client says it holds: per module (1.2) or one number (1.1)."""
        per_module = message.get("weights_seq_nos")
        return per_module if isinstance(per_module, dict) else message.get("weights_seq_no")

    def _data_versions(self, session: ClientSession, message: dict) -> dict[str, int]:
        """The weights version per module the message's data was computed with."""
        versions = dict(session.last_sent)
        per_module = message.get("weights_seq_nos")
        single = message.get("weights_seq_no")
        if isinstance(per_module, dict):
            versions.update({m: v for m, v in per_module.items() if isinstance(v, int) and not isinstance(v, bool)})
        elif isinstance(single, int) and not isinstance(single, bool) and self.trainer.default_module is not None:
            versions[self.trainer.default_module] = single
        for module_id in self.trainer.modules:
            versions.setdefault(module_id, 0)
        return versions

    def _send_state(self, session: ClientSession, connection: ServerConnection, client_holds: Any) -> bytes:
        trainer = self.trainer
        # Only a client that announced protocol 1.1+ may get SET_STATE without the
        # model: RLlib's v1 documentation lets a plain client send weights_seq_no too.
        # Such a client is not sent a model again that this connection already got (§7.5).
        message = trainer.state_message(client_holds, may_omit_model=connection.client_version is not None,
                                        clients=self.established_connections,
                                        sent=session.models_sent)
        if "models" in message:
            session.models_sent.update({m: entry["weights_seq_no"] for m, entry in message["models"].items()})
            session.last_sent.update({m: entry["weights_seq_no"] for m, entry in message["models"].items()})
            for m, rt in trainer.modules.items():
                session.last_sent.setdefault(m, rt.weights_seq_no)
            key: tuple = ("models", "record_share" in message, message.get("steps_per_batch"), *message["models"])
        else:
            if trainer.default_module is not None:
                session.last_sent[trainer.default_module] = message["weights_seq_no"]
            if "onnx_file" in message:
                session.models_sent[trainer.served_module] = message["weights_seq_no"]
            key = ("v1", "onnx_file" in message, "record_share" in message, message.get("steps_per_batch"))
        refused, session.refused_stale = session.refused_stale, 0
        if refused and connection.client_version is not None:
            # Per connection and answer: not worth a cached frame.
            return encode_frame({**message, "steps_refused_stale": refused})
        return self._state_frame(key, message)

    def _state_frame(self, key: tuple, message: dict) -> bytes:
        """The encoded frame of ``message``, encoded once per weights version:
        a model is large, and re-encoding it per answer cost memory and time."""
        versions = (*(rt.weights_seq_no for rt in self.trainer.modules.values()), self.trainer.record_share.value)
        if versions != self._state_versions:
            self._state_frames.clear()
            self._state_versions = versions
        frame = self._state_frames.get(key)
        if frame is None:
            frame = self._state_frames[key] = encode_frame(message)
        return frame


def _unverified_runs(records: list, kept: dict[str, set[int]]) -> None:
    """Steps whose own version (weights_seq_no_runs) is not kept now could not be checked: they are
    given UNVERIFIED_VERSION, so they are never trained, even if that version is published while the
    message waits for room."""
    for record in records:
        for agent in record.agents:
            versions = agent.chunk.step_versions
            if versions is not None and agent.module_id in kept:
                versions[~np.isin(versions, list(kept[agent.module_id]))] = UNVERIFIED_VERSION
