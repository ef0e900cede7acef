"""The asyncio TCP transport: moves bytes between sockets and the Sans-I/O
``ServerConnection``, and routes requests to the ``Trainer``.

What one peer can cost is bounded:

- one request in flight per connection: the server takes the next frame of a
  connection only after the previous answer has been handed to the socket
  (``drain``), so a peer that pipelines requests and never reads its answers
  stalls itself, not the server;
- answers to GET_STATE reuse one encoded SET_STATE frame per weights version;
- with an auth token, an unauthenticated peer gets a small frame limit and
  ``handshake_timeout_s`` to authenticate (HANDSHAKE_TIMEOUT); a wrong token
  closes the connection;
- at most ``max_connections`` connections (TOO_MANY_CONNECTIONS);
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
import itertools
import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

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


class ClientSession:
    """What the server remembers about one connected client."""

    _ids = itertools.count(1)

    def __init__(self, peer: Any) -> None:
        self.id = next(self._ids)
        self.peer = peer
        #: weights_seq_no per module last sent to this client; used when a client omits it.
        self.last_sent: dict[str, int] = {}


class OpenConnection:
    """Transport-side bookkeeping of one connection, TCP or websocket, from its
    first byte: it counts toward max_connections and holds its share of
    max_partial_frame_bytes."""

    __slots__ = ("key", "partial_bytes", "evicted", "over_limit", "_evict")
    _keys = itertools.count(1)

    def __init__(self, evict: Callable[[bytes, bool], None]) -> None:
        self.key = next(self._keys)
        #: Bytes of unfinished frames (or websocket messages) held for this connection.
        self.partial_bytes = 0
        #: Set when the server closed this connection to free memory for others.
        self.evicted = False
        #: Set when it arrived with max_connections already open: it is refused.
        self.over_limit = False
        self._evict = evict

    def evict(self, frame: bytes, current: bool) -> None:
        """Send ``frame`` (SERVER_OVERLOADED) and close; ``current``: its own handler is running now."""
        self.evicted = True
        self._evict(frame, current)


def _evict_stream(writer: asyncio.StreamWriter) -> Callable[[bytes, bool], None]:
    def evict(frame: bytes, current: bool) -> None:
        writer.write(frame)
        if not current:
            writer.close()  # its handler sees EOF and cleans up
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
        asyncio.get_running_loop().set_exception_handler(self._loop_exception)
        self._server = await asyncio.start_server(
            self._handle_client, self.config.host, self.config.port, limit=_STREAM_LIMIT, backlog=backlog,
        )

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
        conn = self.open_connection(_evict_stream(writer))
        if conn.over_limit:
            writer.write(self.too_many_connections_frame())
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
        auth_deadline = (loop.time() + self.config.handshake_timeout_s
                         if connection.state is ServerState.AWAITING_AUTH else None)
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
                frame, closes = await self.answer(session, connection, body)
                del body
                if closes:
                    await self._refuse(writer, frame)
                if auth_deadline is not None and connection.state is ServerState.READY:
                    auth_deadline = None
                if frame is not None:
                    writer.write(frame)
                    if auth_deadline is None:
                        await writer.drain()
                    else:  # a peer that does not read its refusals must not outlive the handshake deadline
                        await self._before(auth_deadline, writer.drain(), writer, ErrorCode.HANDSHAKE_TIMEOUT)
            self.set_partial(conn, connection.buffered_bytes)
            # Wait for more bytes; silence is bounded by the handshake deadline, then by the client timeout.
            if auth_deadline is not None:
                data = await self._before(auth_deadline, reader.read(_READ_SIZE), writer, ErrorCode.HANDSHAKE_TIMEOUT)
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
            text = f"not authenticated within {self.config.handshake_timeout_s:g} s: send PING with auth_token first"
        else:
            text = (f"no data received for client_timeout_s ({self.config.client_timeout_s:g} s; "
                    f"x{LEGACY_TIMEOUT_FACTOR} for clients older than protocol 1.3); "
                    f"an idle client must PING every heartbeat_interval_s")
        await self._refuse(writer, encode_frame(error_message(code, text)))

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
            victim = max(self._open.values(), key=lambda c: c.partial_bytes)
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

    def open_connection(self, evict: Callable[[bytes, bool], None]) -> OpenConnection:
        """Counts a new connection (TCP accepted, or websocket at its first byte). One that
        arrives with max_connections open is marked ``over_limit`` and not counted: refuse it."""
        conn = OpenConnection(evict)
        if len(self._open) >= self.max_connections:
            conn.over_limit = True
            self._count(ErrorCode.TOO_MANY_CONNECTIONS)
        else:
            self._open[conn.key] = conn
        return conn

    def close_connection(self, conn: OpenConnection) -> None:
        """A connection counted by :meth:`open_connection` has ended: its slot and bytes are free."""
        if self._open.pop(conn.key, None) is not None:
            self._partial_total -= conn.partial_bytes
            conn.partial_bytes = 0

    def too_many_connections_frame(self) -> bytes:
        return encode_frame(error_message(
            ErrorCode.TOO_MANY_CONNECTIONS,
            f"the server already has {len(self._open)} connections, its limit (max_connections); try later"))

    async def answer(self, session: ClientSession, connection: ServerConnection, body: bytes) -> tuple[bytes | None, bool]:
        """One received body, answered the same way on every transport: returns the frame to
        send (None: nothing) and whether the connection closes after it. A large body of an
        authenticated peer is parsed and validated in the decode pool, off the event loop."""
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
            if observer is not None:
                observer.refused(session.id, event.error.code.value, event.error.message, event.request_type)
            return _encode_error(event.error.code, event.error.message, event.request_type), event.closes_connection
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
                    kept = {m: set(h.versions) for m, h in trainer.histories.items()}
                    versions = {m: (v if m not in kept or v in kept[m] else UNVERIFIED_VERSION)
                                for m, v in versions.items()}
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
                    await trainer.submit(owner, records, versions, wait_for_update=wants_state and self.config.force_on_policy,
                                         env_steps=env_steps, source=f"#{session.id} {session.peer}")
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
        message = trainer.state_message(client_holds, may_omit_model=connection.client_version is not None)
        # Only a client that announced protocol 1.1+ may get SET_STATE without the
        # model: RLlib's v1 documentation lets a plain client send weights_seq_no too.
        if "models" in message:
            session.last_sent.update({m: entry["weights_seq_no"] for m, entry in message["models"].items()})
            for m, rt in trainer.modules.items():
                session.last_sent.setdefault(m, rt.weights_seq_no)
            key: tuple = ("models", *message["models"])
        else:
            if trainer.default_module is not None:
                session.last_sent[trainer.default_module] = message["weights_seq_no"]
            key = ("v1", "onnx_file" in message)
        return self._state_frame(key, message)

    def _state_frame(self, key: tuple, message: dict) -> bytes:
        """The encoded frame of ``message``, encoded once per weights version:
        a model is large, and re-encoding it per answer cost memory and time."""
        versions = tuple(rt.weights_seq_no for rt in self.trainer.modules.values())
        if versions != self._state_versions:
            self._state_frames.clear()
            self._state_versions = versions
        frame = self._state_frames.get(key)
        if frame is None:
            frame = self._state_frames[key] = encode_frame(message)
        return frame
