"""The connection a client keeps to its server, run by ONE background thread.

The engine thread never touches the socket. It hands the link immutable
``Batch`` objects (``submit``) and, rarely, a request it must wait for
(``request``: MAP_AGENTS, an explicit GET_STATE). The I/O thread connects and
handshakes, sends batches one at a time, decodes the models it receives
(building ONNX Runtime sessions off the engine thread), sends heartbeats,
enforces timeouts and reconnects. What the engine must know arrives as events
in ``events`` (a deque the engine drains between two of its calls), so a new
model is swapped in between two ``get_action`` calls.

Exactly-once batches (protocol 1.3): every batch carries the client's
``client_session`` (uuid4 hex, one per client object, kept across reconnects)
and a ``batch_seq`` (1, 2, ... in sending order). A batch whose answer was not
received is resent after a reconnect with the same session and seq; a batch the
server refused with ERROR is never resent. Off-policy EPISODES have no answer:
each is followed by GET_STATE, whose SET_STATE acknowledges it (the server
processes a connection's messages in order).
"""

from __future__ import annotations

import logging
import select
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tether.protocol.errors import (
    AuthenticationError,
    ErrorCode,
    ServerError,
    TetherConnectionError,
    TetherTimeoutError,
    VersionMismatchError,
    server_error_from_message,
)
from tether.protocol.connection import (
    Address,
    format_address,
    from_another_run,
    rank_addresses,
    reconnect_order,
    redirect_of,
    run_id_of,
)
from tether.protocol.env_params import EnvParamsError, parse_env_params
from tether.protocol.messages import PROTOCOL_VERSION, MessageType, parse_version
from tether.protocol.spaces import Space, is_composite, leaf_arrays, space_from_json
from tether.protocol.tensors import encode_tensor_at
from .transport import ConnectionLost, WebSocketTransport, make_transport

#: The SDK's name and version, sent in the handshake PING (docs/protocol.md §7.1).
SDK_NAME = "tether-python/0.1.0"

__all__ = ["Batch", "ServerLink", "TetherConnectionError"]

logger = logging.getLogger("tether.sdk")

#: Connection-level codes that answer the bytes just sent (not the connection's state).
_FRAMING_CODES = frozenset({"FRAME_TOO_LARGE", "BAD_HEADER"})
_MAX_REFUSED_EPISODES = 4096
#: Requests answered by SET_STATE: they say which parameter set the client holds (§19.2).
_STATE_REQUESTS = (MessageType.GET_STATE.value, MessageType.EPISODES_AND_GET_STATE.value)


@dataclass(eq=False)
class Batch:
    """Episode records cut on the engine thread; the engine never touches them again.

    ``weights`` is the claim sent with them ({"weights_seq_no": v} or
    {"weights_seq_nos": {...}}). ``seq`` (batch_seq) is given when the batch is
    first sent; ``done`` is set once the server answered (``error`` when it refused).
    """

    episodes: list[dict[str, Any]]
    env_steps: int
    agent_steps: int
    weights: dict[str, Any]
    seq: int | None = None
    done: bool = False
    #: Why it was not delivered: the server's refusal (``ServerError``), or
    #: ``TetherConnectionError`` once it was lost on ``max_batch_attempts`` connections.
    error: Exception | None = None
    #: Connections it was sent on (a batch lost with its connection goes again).
    attempts: int = 0
    sent_at: float | None = None
    #: Seconds from the first send to the answer (one value per answered batch).
    round_trip_s: float | None = None
    #: The connection (1, 2, ...) its steps' versions were learned on: only on it are
    #: they sent per step (weights_seq_no_runs, §10.1).
    connection: int | None = None
    #: **[1.4]** The observation spaces its records were recorded under that are not sent as plain
    #: JSON (byte boxes, Dict and Tuple; ``ServerLink.observation_forms`` when it was cut): a resend
    #: after a reconnect writes them for those spaces, whatever the new server's are (§6.5).
    forms: dict[str | None, Any] | None = None
    #: Cut with no records on purpose (its episodes held back, §13.2): it is sent all the same.
    empty: bool = False
    #: **[1.8]** Not sent: its steps were acted with another server run's weights (§6.5).
    other_run: bool = False


def _agent_steps(record: dict[str, Any]) -> int:
    if "agents" in record:
        return sum(len(entry["actions"]) for entry in record["agents"].values())
    return len(record["actions"])


@dataclass(eq=False)
class _Request:
    """A request the engine thread waits for. ``message`` may be a callable
    that builds the message on the I/O thread (GET_STATE needs its versions)."""

    message: dict[str, Any] | Callable[[], dict[str, Any]]
    done: threading.Event = field(default_factory=threading.Event)
    answer: dict[str, Any] | None = None
    error: BaseException | None = None
    abandoned: bool = False  # the engine stopped waiting: not sent (again); an answer on its way is still taken in


def check_server_version(info: dict[str, Any]) -> None:
    """A PONG announcing another major version than this client's is refused (VersionMismatchError)."""
    server_version = info.get("protocol_version")
    if server_version is not None and parse_version(str(server_version))[0] != parse_version(PROTOCOL_VERSION)[0]:
        raise VersionMismatchError(
            "VERSION_MISMATCH", f"server speaks RLlink {server_version}, this client {PROTOCOL_VERSION}", "PING"
        )


class ServerLink:
    """One client's server connection and the thread that owns it.

    Args:
        host, port: the server's address.
        client_name, auth_token: sent in the handshake PING.
        reconnect_timeout_s: how long to keep retrying a lost (or never made)
            connection before giving up with ``TetherConnectionError``.
        connect_timeout_s: limit of one TCP connect attempt.
        response_timeout_s: limit of every request's answer, except
        update_timeout_s: the limit of an EPISODES_AND_GET_STATE answer, and of
            the GET_STATE acknowledging an off-policy EPISODES; both may wait
            for a learner update.
        max_queued_steps: agent steps that may wait behind the batch in
            flight. None: what the server can still train on before data made
            now becomes too stale for it, (max_staleness + 1) * train_batch_size
            from its SET_CONFIG, or 2 * env_steps_per_sample when it does not
            say. When a new batch would exceed it, the oldest waiting batches
            are dropped (the stalest data) and counted; the newest always stays.
        max_queued_batches: a hard cap on waiting batches (memory), same policy.
        max_batch_attempts: connections a batch is sent on; a batch whose
            connection is lost before its answer that many times (one that
            kills every server it reaches) is given up and reported as
            ``TetherConnectionError``, and the rest of its episodes is not sent.
        max_queued_events: events kept for an engine that does not read them;
            beyond it the oldest error goes first.
        state_request: builds the GET_STATE message (runs on the I/O thread;
            ``initial`` is True right after a (re)connect).
        prepare_state: turns (SET_CONFIG, SET_STATE) into whatever the client
            applies later (ONNX sessions are built here, on the I/O thread).
    """

    def __init__(
        self,
        host: str,
        port: int,
        client_name: str,
        auth_token: str | None,
        reconnect_timeout_s: float,
        state_request: Callable[[bool], dict[str, Any]],
        prepare_state: Callable[[dict[str, Any], dict[str, Any]], Any],
        connect_timeout_s: float = 10.0,
        response_timeout_s: float = 60.0,
        update_timeout_s: float = 600.0,
        max_queued_steps: int | None = None,
        max_queued_batches: int = 64,
        max_batch_attempts: int = 5,
        max_queued_events: int = 1024,
        verbose: bool = False,
    ) -> None:
        if max_queued_batches < 1 or (max_queued_steps is not None and max_queued_steps < 1):
            raise ValueError("max_queued_batches and max_queued_steps must be >= 1")
        if max_batch_attempts < 1 or max_queued_events < 1:
            raise ValueError("max_batch_attempts and max_queued_events must be >= 1")
        self.max_batch_attempts = max_batch_attempts
        self.max_queued_events = max_queued_events
        self.client_name = client_name
        self.auth_token = auth_token
        self.reconnect_timeout_s = reconnect_timeout_s
        self.response_timeout_s = response_timeout_s
        self.update_timeout_s = update_timeout_s
        self.max_queued_steps = max_queued_steps
        self.max_queued_batches = max_queued_batches
        self.verbose = verbose
        self._state_request = state_request
        self._prepare_state = prepare_state
        self._transport = make_transport(host, port, connect_timeout_s, response_timeout_s)
        #: **[1.9]** The address the application gave (None over a websocket: a group serves TCP clients),
        #: the ranks the latest PONG named (§6.7), and the redirects followed.
        self._given: Address | None = (
            None if isinstance(self._transport, WebSocketTransport) else (self._transport.host, int(port)))
        self.ranks: list[Address] = []
        self.redirects = 0
        #: The address of the last connection whose handshake completed (before any: the given one).
        self.connected_address = self._transport.address
        #: Whether the connection being made follows a redirect (its PING says so; it is not redirected again).
        self._redirected = False
        #: One per client object, kept across reconnects (protocol 1.3 exactly-once batches).
        self.client_session = uuid.uuid4().hex
        self._next_seq = 1
        #: Events for the engine thread, in order: ("connected", info, config, prepared),
        #: ("state", prepared), ("batch", Batch), ("error", exc), ("fatal", exc) (stays at the head).
        self.events: deque[tuple[Any, ...]] = deque()
        #: PONG and SET_CONFIG of the current connection (as the I/O thread knows them).
        self.server_info: dict[str, Any] = {}
        self.server_config: dict[str, Any] = {}
        self._forms: dict[str | None, Space] = {}
        self._forms_of: dict[str, Any] | None = None  # (the SET_CONFIG ``_forms`` was parsed from)
        #: Connections re-established after a loss.
        self.reconnects = 0
        #: Connections made (the engine thread counts the same ones as they are announced).
        self.connections = 0
        #: **[1.8]** The run_id each connection's PONG named (None: none), connection 1 first.
        self._run_ids: list[str | None] = []
        #: **[1.8]** Agent steps of batches not sent because they were acted with another run's weights (§6.5).
        self.other_run_steps_dropped = 0
        #: Batches dropped because the queue was full, and their steps.
        self.batches_dropped = 0
        #: **[1.6]** Logged steps let go because the server was older than 1.6 (§15).
        self.logged_steps_dropped = 0
        self.env_steps_dropped = 0
        self.agent_steps_dropped = 0
        #: Agent steps the server refused as too stale to be trained (SET_STATE steps_refused_stale, §13.2).
        self.steps_refused_stale = 0
        #: The run's summary once the server said training is done (ERROR TRAINING_DONE, §6.6), else None.
        self.training_done: dict[str, Any] | None = None
        #: Batches discarded because training was done before they were sent or answered.
        self.batches_unsent_at_end = 0
        #: The share of new training episodes to record (SET_STATE record_share, §13.2).
        self.record_share = 1.0
        #: **[1.7]** The seq of the environment parameter set this connection was last sent (§19.2; 0: none).
        self._env_params_seq = 0
        self._ignored_seq: Any = None
        #: Steps played per batch the server asked for (SET_STATE steps_per_batch, §13.2); None: env_steps_per_sample.
        self.steps_per_batch: int | None = None
        #: Episodes whose steps were dropped (none of their later steps is sent).
        self.episodes_dropped = 0
        #: PINGs sent as heartbeats.
        self.heartbeats_sent = 0
        #: Why the last connection ended (with the server's code when it sent one).
        self.last_disconnect: str | None = None
        self.fatal: BaseException | None = None
        self._outbox: deque[Batch] = deque()
        #: Episodes of refused batches: none of their later records is sent. An id
        #: leaves once the engine took the refusal (a reused id is a new episode);
        #: at most _MAX_REFUSED_EPISODES are kept, oldest out first (dict: ordered set).
        self._refused_episodes: dict[str, None] = {}
        self._queued_steps = 0
        self._requests: deque[_Request] = deque()
        self._in_flight: Batch | None = None
        self._current_request: _Request | None = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._closing = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._last_send = time.monotonic()
        self._connected_once = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tether-link-{host}:{port}", daemon=True)

    # -- engine thread ---------------------------------------------------------------

    @property
    def address(self) -> str:
        return self._transport.address

    def start(self) -> None:
        """Start the I/O thread and wait for the first connection (and models).

        Raises what ended the first attempt: ``TetherConnectionError`` after
        ``reconnect_timeout_s`` (code TRAINING_DONE when the server's run is already done),
        ``AuthenticationError``, ``TetherTimeoutError``...
        """
        self._thread.start()
        self._connected_once.wait()
        if self.fatal is not None:
            raise self.fatal
        if self.training_done is not None and not self.server_config:
            raise self._done_error()

    @property
    def busy(self) -> bool:
        """Whether a batch is queued or in flight."""
        return self._in_flight is not None or bool(self._outbox)

    def queue_limit_steps(self) -> int:
        """Agent steps allowed to wait behind the batch in flight (see ``max_queued_steps``)."""
        if self.max_queued_steps is not None:
            return self.max_queued_steps
        config = self.server_config
        batch, staleness = config.get("train_batch_size"), config.get("max_staleness")
        if isinstance(batch, int) and isinstance(staleness, int) and batch > 0 and staleness >= 0:
            return (staleness + 1) * batch
        return 2 * max(1, int(config.get("env_steps_per_sample", 500)))

    def has_room(self, agent_steps: int) -> bool:
        """Whether a batch of ``agent_steps`` would be queued without dropping one."""
        return not self._outbox or (len(self._outbox) < self.max_queued_batches
                                    and self._queued_steps + agent_steps <= self.queue_limit_steps())

    def submit(self, batch: Batch) -> set[str]:
        """Queue a batch for sending (never blocks).

        When the waiting batches would exceed the queue's bound, the oldest
        are dropped and counted, and so is everything else of the episodes
        they carried (their chunks in the waiting batches): the server never
        sees a fragment of an episode as if it were whole. Returns the ids of
        the episodes dropped, whose later steps the client must not send either.
        """
        limit = self.queue_limit_steps()
        dropped_now = 0
        gone: set[str] = set()
        with self._lock:
            if self.training_done is not None:  # nobody to send to (§6.6)
                self.batches_unsent_at_end += 1
                return gone
        # A batch cut empty (its episodes held back, §13.2) goes too: its answer brings the share.
        batch.empty = batch.empty or not batch.episodes
        with self._lock:
            outbox = self._outbox
            while outbox and (len(outbox) >= self.max_queued_batches
                              or self._queued_steps + batch.agent_steps > limit):
                dropped = outbox.popleft()
                self._count_dropped(dropped)
                gone.update(str(r.get("episode_id")) for r in dropped.episodes)
                dropped_now += 1
            if gone:
                for waiting in [*outbox, batch]:
                    self._drop_episodes(waiting, gone)
                kept = [b for b in outbox if b.episodes or b.empty]
                outbox.clear()
                outbox.extend(kept)
                self._queued_steps = sum(b.agent_steps for b in outbox)
                self.episodes_dropped += len(gone)
            if self._refused_episodes:
                self._drop_episodes(batch, self._refused_episodes)
            if batch.episodes or batch.empty:
                outbox.append(batch)
                self._queued_steps += batch.agent_steps
        if dropped_now and self.batches_dropped == dropped_now:
            logger.warning("the server at %s takes batches slower than the engine makes them: the oldest unsent "
                           "batches (and the rest of their episodes) are dropped beyond %d waiting agent steps "
                           "(counted in batches_dropped)", self.address, limit)
        self._wake()
        return gone

    def take_events(self) -> list[tuple[Any, ...]]:
        """The events reported since the last call, in order (engine thread).

        A fatal event stays in the link (every later call sees it) and comes
        last. Taking a refused batch's event ends the link's memory of its
        episodes: the engine stops recording them, and an id it uses again is
        a new episode.
        """
        taken: list[tuple[Any, ...]] = []
        with self._lock:
            events = self.events
            while events:
                if events[0][0] == "fatal":
                    taken.append(events[0])
                    break
                event = events.popleft()
                if event[0] == "batch" and event[1].error is not None:
                    for episode in event[1].episodes:
                        self._refused_episodes.pop(str(episode.get("episode_id")), None)
                taken.append(event)
        return taken

    def put_back_errors(self, errors: list[BaseException]) -> None:
        """Return errors the engine took but has not raised yet to the front, in order."""
        with self._lock:
            self.events.extendleft(("error", error) for error in reversed(errors))

    def _count_dropped(self, batch: Batch) -> None:
        self.batches_dropped += 1
        self.env_steps_dropped += batch.env_steps
        self.agent_steps_dropped += batch.agent_steps

    def _drop_episodes(self, batch: Batch, gone: Container[str]) -> None:
        """Remove the records of ``gone`` episodes from a waiting batch (caller holds the lock)."""
        kept = [r for r in batch.episodes if str(r.get("episode_id")) not in gone]
        if len(kept) == len(batch.episodes):
            return
        agent_steps = sum(_agent_steps(r) for r in kept)
        env_steps = round(batch.env_steps * agent_steps / batch.agent_steps) if batch.agent_steps else 0
        self.env_steps_dropped += batch.env_steps - env_steps
        self.agent_steps_dropped += batch.agent_steps - agent_steps
        batch.episodes, batch.env_steps, batch.agent_steps = kept, env_steps, agent_steps

    def _forget_refused(self, batch: Batch) -> None:
        """The server refused ``batch``: the rest of its episodes (waiting
        batches, and batches submitted later) is never sent, so the server does
        not take a fragment for a whole episode (caller holds the lock)."""
        refused = {str(r.get("episode_id")) for r in batch.episodes}
        for episode_id in refused:
            self._refused_episodes[episode_id] = None
        while len(self._refused_episodes) > _MAX_REFUSED_EPISODES:
            del self._refused_episodes[next(iter(self._refused_episodes))]
        for waiting in self._outbox:
            self._drop_episodes(waiting, refused)
        kept = [b for b in self._outbox if b.episodes]
        self._outbox.clear()
        self._outbox.extend(kept)
        self._queued_steps = sum(b.agent_steps for b in kept)

    def request(self, message: dict[str, Any] | Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Send a request through the I/O thread and wait for its answer.

        Survives reconnects: a request whose connection was lost is sent again on the next one
        (§6.5). Waits at most ``response_timeout_s`` in all, reconnects included, as the C++ and C#
        links do; raises the server's ERROR as ``ServerError``, a timeout as ``TetherTimeoutError``.
        """
        req = _Request(message)
        deadline = time.monotonic() + self.response_timeout_s
        with self._lock:
            if self.training_done is not None:
                raise self._done_error()
            self._requests.append(req)
        self._wake()
        while not req.done.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
            if self.fatal is not None or not self._thread.is_alive():
                if self.training_done is not None and not req.done.is_set():
                    raise self._done_error()
                raise self.fatal or TetherConnectionError("the connection thread stopped", self.address)
            if time.monotonic() >= deadline:
                with self._lock:
                    req.abandoned = not req.done.is_set()
                if req.abandoned:
                    kind = "GET_STATE" if callable(message) else str(message.get("type"))  # (a callable builds a GET_STATE)
                    raise TetherTimeoutError(self.address, kind, self.response_timeout_s, "response_timeout_s")
        if req.error is not None:
            raise req.error
        assert req.answer is not None
        return req.answer

    def _done_error(self) -> TetherConnectionError:
        return TetherConnectionError(f"training is done on {self.address}: the server takes no more requests",
                                     self.address, ErrorCode.TRAINING_DONE.value)

    def wait_for(self, predicate: Callable[[], bool], until_error: bool = True) -> None:
        """Block until ``predicate()`` holds, the link fails for good, or (with
        ``until_error``) an error event arrives (the I/O thread enforces the
        timeouts, so this cannot wait forever)."""
        with self._changed:
            while (not predicate() and not (until_error and self._has_error_event()) and self.fatal is None
                   and self.training_done is None):
                if not self._thread.is_alive():
                    break
                self._changed.wait(0.5)

    def idle(self) -> bool:
        """No batch queued or in flight and no request pending."""
        return self._in_flight is None and not self._outbox and not self._requests

    def close(self) -> None:
        """Stop the I/O thread and close the connection; queued batches are dropped."""
        self._closing.set()
        self._wake()
        self._transport.close()  # unblocks a send or a wait in the I/O thread
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        self._transport.close()
        for s in (self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass

    def _has_error_event(self) -> bool:
        return any(e[0] in ("error", "fatal") for e in self.events)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # already woken (buffer full) or closed

    # -- I/O thread: lifecycle -----------------------------------------------------

    def _post(self, *event: Any) -> None:
        with self._changed:
            self._post_locked(event)
            self._changed.notify_all()

    def _post_locked(self, event: tuple[Any, ...]) -> None:
        """Append an event (caller holds the lock). An engine that does not read
        its events loses the oldest error first; connections, models and batches
        are bounded by what the engine itself does."""
        events = self.events
        if len(events) >= self.max_queued_events:
            oldest_error = next((i for i, e in enumerate(events) if e[0] == "error"), None)
            if oldest_error is not None:
                del events[oldest_error]
            elif event[0] == "error":
                return
        events.append(event)

    def _run(self) -> None:
        try:
            down_since = time.monotonic()
            while not self._closing.is_set():
                if not self._transport.connected:
                    try:
                        self._connect(down_since)
                    except ConnectionLost as exc:  # (only TRAINING_DONE gets out of _connect)
                        self._training_done(exc)
                        break
                    self._connected_once.set()
                try:
                    self._serve()
                except ConnectionLost as exc:
                    if self._closing.is_set():
                        break
                    if exc.code == ErrorCode.TRAINING_DONE.value:
                        self._training_done(exc)
                        break
                    if exc.code in _FRAMING_CODES:
                        self._refuse_in_flight(exc)
                    else:
                        self._give_up_in_flight_if_exhausted(exc)
                    self._lost(str(exc), exc.code)
                    down_since = time.monotonic()
                except ServerError as exc:
                    # An ERROR answering a heartbeat PING (a request's goes to its waiter):
                    # the engine hears of it; the link goes on.
                    self._post("error", exc)
                except TetherTimeoutError as exc:
                    if self._closing.is_set():
                        break
                    self._fail_current_request(exc)
                    self._post("error", exc)
                    self._give_up_in_flight_if_exhausted(exc)
                    self._lost(str(exc), None)
                    down_since = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - whatever ends the thread reaches the engine
            if not self._closing.is_set():
                self.fatal = exc
                self._fail_all_requests(exc)
                self._post("fatal", exc)
        finally:
            self._transport.close()
            self._connected_once.set()
            with self._changed:
                self._changed.notify_all()

    def _training_done(self, exc: ConnectionLost) -> None:
        """The server's run is done (TRAINING_DONE, §6.6): nothing is resent or reconnected; unsent and
        unanswered batches are discarded and counted; requests waiting fail with the reason."""
        self._transport.close()
        summary = (exc.body or {}).get("summary")
        with self._changed:
            self.training_done = summary if isinstance(summary, dict) else {}
            unsent = [b for b in (self._in_flight, *self._outbox) if b is not None]
            self._in_flight = None
            self._outbox.clear()
            self._queued_steps = 0
            self.batches_unsent_at_end += len(unsent)
            self._post_locked(("done", self.training_done))
            self._changed.notify_all()
        self._fail_all_requests(self._done_error())
        logger.info("the Tether server at %s ended training: %s", self.address, self.training_done)

    def _refuse_in_flight(self, exc: ConnectionLost) -> None:
        """A framing error answers what was just sent (e.g. a batch over the
        server's frame limit): sending it again would fail again, so it is refused."""
        with self._changed:
            batch, self._in_flight = self._in_flight, None
            if batch is not None:
                batch.error = ServerError(str(exc.code), str(exc), "EPISODES")
                batch.done = True
                self._forget_refused(batch)
                self._post_locked(("batch", batch))
                self._changed.notify_all()
        if batch is None:
            self._fail_current_request(ServerError(str(exc.code), str(exc)))

    def _give_up_in_flight_if_exhausted(self, exc: BaseException) -> None:
        """The batch in flight lost its connection: it goes again after the
        reconnect, unless it was sent on ``max_batch_attempts`` connections
        already (a batch that takes every server down with it is not resent forever)."""
        with self._changed:
            batch = self._in_flight
            if batch is None or batch.attempts < self.max_batch_attempts:
                return
            self._in_flight = None
            batch.error = TetherConnectionError(
                f"batch {batch.seq} was sent on {batch.attempts} connections to {self.address}, each lost before "
                f"its answer ({exc}); given up (max_batch_attempts)", self.address, getattr(exc, "code", None))
            batch.done = True
            self._forget_refused(batch)
            self._post_locked(("batch", batch))
            self._changed.notify_all()

    def _lost(self, reason: str, code: str | None) -> None:
        self._transport.close()
        self._current_request = None  # a request cut off by a lost connection is sent again
        self.last_disconnect = reason
        self.reconnects += 1
        logger.warning("lost the connection to the Tether server: %s; reconnecting", reason)

    def _connect(self, down_since: float) -> None:
        """Connect and handshake, retrying with capped exponential backoff until
        ``reconnect_timeout_s`` after ``down_since``; a last attempt is made at the deadline.
        **[1.9]** Attempt k goes to the k-th address of the group's reconnect order from the
        address last connected to (§6.7): the first retries it."""
        deadline = down_since + self.reconnect_timeout_s
        delay = 0.05
        last_code: str | None = None
        first = not self._connected_once.is_set()
        order = self._reconnect_order()
        attempt = 0
        while True:
            if self._closing.is_set():
                raise ConnectionLost("client closed")
            try:
                self._connect_to(order[attempt % len(order)])
                return
            except (AuthenticationError, VersionMismatchError):
                self._transport.close()
                raise
            except TetherTimeoutError as exc:
                self._transport.close()
                if first:
                    raise
                self._post("error", exc)
                last: BaseException = exc
            except ConnectionLost as exc:
                self._transport.close()
                if exc.code == ErrorCode.TRAINING_DONE.value:
                    raise  # the run is done: no more attempts (§6.6)
                last, last_code = exc, exc.code or last_code
            except OSError as exc:
                self._transport.close()
                last = exc
            # A server at its connection limit, or refusing this address for a while, asks for at
            # least 1 s between attempts (§6.6).
            too_many = isinstance(last, ConnectionLost) and last.code in ("TOO_MANY_CONNECTIONS", "AUTH_THROTTLED")
            pause = max(delay, 1.0) if too_many else delay
            now = time.monotonic()
            if now >= deadline:
                tried = order[:attempt + 1] if self._given is not None else []
                where = (" or ".join(dict.fromkeys(format_address(a) for a in tried if a is not None))
                         if len(tried) > 1 else self.address)
                raise TetherConnectionError(
                    f"could not reach a Tether server at {where} within {self.reconnect_timeout_s:g} s "
                    f"(reconnect_timeout_s): {last}", self.address, last_code) from last
            if self.verbose:
                print(f"[tether-client] server {self.address} unreachable ({last}); retrying in "
                      f"{min(pause, deadline - now):.2f} s", file=sys.stderr)
            self._closing.wait(min(pause, deadline - now))
            delay = min(delay * 2, 1.0)
            attempt += 1

    def _reconnect_order(self) -> list[Address | None]:
        if self._given is None:
            return [None]
        return list(reconnect_order(self._given, self.ranks, (self._transport.host, self._transport.port)))

    def _aim(self, address: Address | None) -> None:
        if address is not None:
            self._transport.host, self._transport.port = address

    def _connect_to(self, address: Address | None) -> None:
        """One attempt: connect to ``address`` and handshake; **[1.9]** follow the PONG's redirect, or,
        if the rank it names cannot be reached, come back here saying the client was redirected (§6.7)."""
        self._aim(address)
        self._redirected = False
        self._transport.connect()
        target = self._handshake()
        if target is None:
            return
        self._transport.close()  # nothing but PING was sent on it
        self._redirected = True
        here = (self._transport.host, self._transport.port)
        try:
            self._aim(target)
            self._transport.connect()
            self._handshake()
            self.redirects += 1
            return
        except ConnectionLost as exc:
            if exc.code == ErrorCode.TRAINING_DONE.value:
                raise
            failure: BaseException = exc
        except (OSError, TetherTimeoutError) as exc:
            failure = exc
        self._transport.close()
        logger.warning("could not follow the redirect to %s (%s); staying on %s", format_address(target),
                       failure, format_address(here))
        self._aim(here)
        self._transport.connect()
        self._handshake()

    def _handshake(self) -> Address | None:
        """PING, GET_CONFIG and GET_STATE on a new connection; **[1.9]** stops after PONG and returns the
        rank it redirects to, when it does (§6.7). Returns None once the connection is ready."""
        ping: dict[str, Any] = {
            "type": MessageType.PING.value,
            "protocol_version": PROTOCOL_VERSION,
            "client_name": self.client_name,
            "sdk": SDK_NAME,
        }
        if self.auth_token is not None:
            ping["auth_token"] = self.auth_token
        if self._redirected:
            ping["redirected"] = True
        info = self._exchange(ping, self.response_timeout_s, "response_timeout_s")
        check_server_version(info)
        if self._given is not None:  # [1.9] a group's ranks, and a redirect to follow before anything else (§6.7)
            ranks = rank_addresses(info)
            if ranks:
                self.ranks = ranks
            target = redirect_of(info, (self._transport.host, self._transport.port), self._redirected)
            if target is not None:
                return target
        config = self._exchange({"type": MessageType.GET_CONFIG.value}, self.response_timeout_s, "response_timeout_s")
        self.server_info, self.server_config = info, config
        self._env_params_seq = 0  # a new connection was sent no parameter set (a restarted server reuses seqs)
        state = self._exchange(self._state_request(True), self.response_timeout_s, "response_timeout_s")
        prepared = self._prepare_state(config, state)
        self._run_ids.append(run_id_of(info))
        self.connected_address = self._transport.address
        self.connections += 1
        self._post("connected", info, config, prepared)
        return None

    def run_of(self, connection: int | None) -> str | None:
        """**[1.8]** The run that connection ``connection`` (1, 2, ...) reached, if its PONG named one."""
        if connection is None or not 1 <= connection <= len(self._run_ids):
            return None
        return self._run_ids[connection - 1]

    def _drop_other_run(self, batch: Batch) -> None:
        """**[1.8]** ``batch`` was cut under another server run than this connection's: its versions
        name other weights here and its action_logp no model of this run explains (§6.5). It is
        let go, counted, and answered to the engine as not sent; its episodes go on."""
        with self._changed:
            self._in_flight = None
            batch.other_run = True
            batch.done = True
            self.other_run_steps_dropped += batch.agent_steps
            self._post_locked(("batch", batch))
            self._changed.notify_all()
        logger.warning("tether: %d agent steps not sent: they were acted with the weights of another server run "
                       "(the server restarted without resuming)", batch.agent_steps)

    def observation_forms(self) -> dict[str | None, Space]:
        """The modules (None: the single-agent space) whose observations are not sent as plain JSON
        numbers: byte boxes and **[1.4]** Dict and Tuple spaces. Parsed once per SET_CONFIG."""
        config = self.server_config
        if self._forms_of is not config:
            forms: dict[str | None, Space] = {}
            for module_id, spec in [(None, config), *((config.get("modules") or {}).items())]:
                raw = spec.get("observation_space") if isinstance(spec, dict) else None
                if isinstance(raw, dict) and (raw.get("type") in ("Dict", "Tuple")
                                              or (raw.get("type") == "Box" and raw.get("dtype") == "uint8")):
                    forms[module_id] = space_from_json(raw)
            self._forms, self._forms_of = forms, config
        return self._forms

    def _wire_observations(self, records: list[dict[str, Any]],
                           forms: dict[str | None, Any] | None = None) -> tuple[list[dict[str, Any]], bytes | None]:
        """The records as sent: a byte-box module's observations (§8.1) go to a server of 1.4 or
        later as one uint8 tensor per record or agent entry, its bytes in the body's attachment
        (§10.9, §4.3); to an older server, as JSON numbers. **[1.4]** A Dict or Tuple module's go as
        an object of its leaves (§8.6), each one tensor in the attachment. The batch's own records
        are left as they are (a resend to another server is written for that one)."""
        forms = self.observation_forms() if forms is None else forms
        if not forms:
            return records, None
        binary = self.speaks(1, 4)
        parts: list[bytes] = []
        size = 0

        def tensor(data: np.ndarray) -> Any:
            nonlocal size
            if not binary:
                return data.tolist()
            data = np.ascontiguousarray(data)
            out = encode_tensor_at(data, size)
            parts.append(data.tobytes())
            size += data.nbytes
            return out

        def wire(obs: list[Any], space: Space) -> Any:
            if is_composite(space):
                rows = np.stack([np.asarray(o, dtype=np.float32).reshape(-1) for o in obs])
                if rows.shape[1] != space.flat_dim:  # (recorded under other spaces: the server says so)
                    return [row.tolist() for row in rows]
                return {path: tensor(values) for path, values in leaf_arrays(space, rows).items()}
            if not binary:
                return obs
            # (each observation to the space's shape: an engine may hand an image flat or as rows)
            return tensor(np.stack([np.asarray(o).reshape(space.shape) for o in obs]).astype(np.uint8))

        out = []
        for record in records:
            agents = record.get("agents")
            if isinstance(agents, dict):
                entries = {agent: dict(entry, obs=wire(entry["obs"], forms[entry.get("module")]))
                           if entry.get("module") in forms and entry.get("obs") else entry
                           for agent, entry in agents.items()}
                out.append(dict(record, agents=entries))
            elif None in forms and record.get("obs"):
                out.append(dict(record, obs=wire(record["obs"], forms[None])))
            else:
                out.append(record)
        return out, (b"".join(parts) if parts else None)

    # -- I/O thread: what the server said of itself ----------------------------------

    def speaks(self, major: int, minor: int) -> bool:
        """Whether the server's PONG claims protocol ``major.minor`` or later."""
        version = self.server_info.get("protocol_version")
        try:
            return version is not None and parse_version(str(version)) >= (major, minor)
        except ValueError:
            return False

    @property
    def speaks_1_3(self) -> bool:
        """Whether the server's PONG claims protocol 1.3 or later (then 1.3 fields are sent)."""
        return self.speaks(1, 3)

    @property
    def force_on_policy(self) -> bool:
        return bool(self.server_config.get("force_on_policy", True))

    @property
    def heartbeat_interval_s(self) -> float | None:
        value = self.server_config.get("heartbeat_interval_s")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
        return None

    # -- I/O thread: serving one connection ------------------------------------------

    def _serve(self) -> None:
        while not self._closing.is_set():
            with self._changed:
                batch, request = self._in_flight, None  # a batch sent before a reconnect goes again first
                if batch is None:
                    while self._requests and self._requests[0].abandoned:
                        self._requests.popleft()
                    if self._requests:
                        request = self._requests[0]
                    elif self._outbox:
                        batch = self._in_flight = self._outbox.popleft()
                        self._queued_steps -= batch.agent_steps
                        self._changed.notify_all()  # room in the queue
            if batch is not None:
                self._send_batch(batch)
            elif request is not None:
                self._send_request(request)
            else:
                self._idle()

    def _send_request(self, request: _Request) -> None:
        message = request.message() if callable(request.message) else request.message
        self._current_request = request
        try:
            answer = self._exchange(message, self.response_timeout_s, "response_timeout_s")
            if answer.get("type") == MessageType.SET_STATE.value:
                self._post("state", self._prepare_state(self.server_config, answer))
            request.answer = answer
        except ServerError as exc:
            request.error = exc
        # (a timeout or a lost connection propagates: _run fails the request, or it is sent again)
        self._current_request = None
        with self._lock:
            self._requests.popleft()
        request.done.set()

    def _drop_logged(self, batch: Batch) -> None:
        """**[1.6]** A server older than 1.6 would train on logged steps as its policy's samples (§15): a
        record (or agent entry) holding any is let go, not sent without its ``logged_runs``; its steps
        count in ``logged_steps_dropped``."""
        kept, dropped = [], 0
        for record in batch.episodes:
            agents = record.get("agents")
            if isinstance(agents, dict):
                for agent_id in [a for a, e in agents.items() if e.get("logged_runs")]:
                    steps = len(agents.pop(agent_id)["actions"])
                    batch.agent_steps -= steps
                    dropped += steps
                kept.append(record)
            elif record.get("logged_runs"):
                steps = len(record["actions"])
                batch.env_steps -= steps
                batch.agent_steps -= steps
                dropped += steps
            else:
                kept.append(record)
        if dropped:
            self.logged_steps_dropped += dropped
            logger.warning("tether: %d logged steps not sent: the server is older than protocol 1.6", dropped)
        batch.episodes = kept

    def _send_batch(self, batch: Batch) -> None:
        if from_another_run(self.run_of(batch.connection), self.run_of(self.connections)):
            self._drop_other_run(batch)
            return
        if batch.seq is None:
            batch.seq = self._next_seq
            self._next_seq += 1
            batch.sent_at = time.monotonic()
        batch.attempts += 1
        if batch.connection != self.connections or "protocol_version" not in self.server_info:
            # Versions learned on another connection may be another server run's, and a plain v1
            # server is sent no 1.3 record fields (§10.1): each step then has the message's claim.
            for record in batch.episodes:
                record.pop("weights_seq_no_runs", None)
                for entry in record.get("agents", {}).values() if isinstance(record.get("agents"), dict) else ():
                    entry.pop("weights_seq_no_runs", None)
        if not self.speaks(1, 6):
            self._drop_logged(batch)
        episodes, attachment = self._wire_observations(batch.episodes, batch.forms)
        message: dict[str, Any] = {"episodes": episodes, "env_steps": batch.env_steps, **batch.weights}
        if self.speaks_1_3:
            message["agent_steps"] = batch.agent_steps
            message["client_session"] = self.client_session
            message["batch_seq"] = batch.seq
        if self.force_on_policy:
            message["type"] = MessageType.EPISODES_AND_GET_STATE.value
            try:
                answer = self._exchange(message, self.update_timeout_s, "update_timeout_s", attachment=attachment)
            except ServerError as exc:
                batch.error = exc
                answer = None
        else:
            message["type"] = MessageType.EPISODES.value
            self._send(message, attachment)
            # GET_STATE right behind: its answer acknowledges the EPISODES (and brings new weights).
            # The server answers it only once the EPISODES got room in its pool, which
            # may take a learner update: update_timeout_s bounds it.
            try:
                answer = self._exchange(self._state_request(False), self.update_timeout_s, "update_timeout_s",
                                        batch=batch)
            except ServerError as exc:
                # Refuses the GET_STATE, not the EPISODES before it (a refusal of that
                # came first and went to the batch): the batch was delivered.
                self._post("error", exc)
                answer = None
        batch.round_trip_s = time.monotonic() - (batch.sent_at or time.monotonic())
        prepared = self._prepare_state(self.server_config, answer) if answer is not None else None
        with self._changed:
            self._in_flight = None
            batch.done = True
            if batch.error is not None:
                self._forget_refused(batch)
            if prepared is not None:
                self._post_locked(("state", prepared))
            self._post_locked(("batch", batch))
            self._changed.notify_all()

    def _idle(self) -> None:
        """Wait for work, watching the socket (a closed connection or an
        unsolicited ERROR is noticed at once) and sending heartbeats."""
        interval = self.heartbeat_interval_s
        timeout = None if interval is None else max(0.0, self._last_send + interval - time.monotonic())
        readable, _, _ = select.select([self._transport.sock, self._wake_r], [], [], timeout)
        if self._wake_r in readable:
            self._drain_wake()
        if self._transport.sock in readable:
            for _, message in self._transport.read_available():
                self._unsolicited(message)
        if interval is not None and not readable and time.monotonic() - self._last_send >= interval:
            self.heartbeats_sent += 1
            self._exchange({"type": MessageType.PING.value}, self.response_timeout_s, "response_timeout_s")

    def _unsolicited(self, message: dict[str, Any]) -> None:
        if message.get("type") == MessageType.ERROR.value:
            self._post("error", server_error_from_message(message))
        else:
            raise ConnectionLost(f"server {self.address} sent an unrequested {message.get('type')}")

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    # -- I/O thread: one request, one answer -----------------------------------------

    def _send(self, message: dict[str, Any], attachment: bytes | None = None) -> None:
        try:
            self._transport.send(message, attachment)
        except socket.timeout:
            raise TetherTimeoutError(self.address, str(message.get("type")), self._transport.send_timeout_s,
                                     "response_timeout_s", "the server stopped reading") from None
        except ConnectionLost:
            raise  # (one the server announced, TRAINING_DONE say, keeps its code)
        except OSError as exc:
            self._transport.close()
            raise ConnectionLost(f"connection to {self.address} failed: {exc}") from exc
        self._last_send = time.monotonic()

    def _exchange(self, message: dict[str, Any], timeout_s: float, setting: str,
                  batch: Batch | None = None, attachment: bytes | None = None) -> dict[str, Any]:
        """Send a request (with its binary attachment, §4.3) and wait for its answer; an ERROR answer
        is raised as ``ServerError``; an ERROR refusing the EPISODES before it goes to ``batch``."""
        if message["type"] in _STATE_REQUESTS and self.speaks(1, 7):
            message["env_params_seq"] = self._env_params_seq  # (§19.2)
        self._send(message, attachment)
        request_type = str(message["type"])
        deadline = time.monotonic() + timeout_s
        while True:
            if self._closing.is_set():
                raise ConnectionLost("client closed")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TetherTimeoutError(self.address, request_type, timeout_s, setting)
            readable, _, _ = select.select([self._transport.sock, self._wake_r], [], [], remaining)
            if self._wake_r in readable:
                self._drain_wake()
            if self._transport.sock not in readable:
                continue
            for answers, body in self._transport.read_available():
                if answers is None:  # an ERROR for an EPISODES (no response of its own)
                    error = server_error_from_message(body)
                    if batch is not None and batch.error is None:
                        batch.error = error
                    else:
                        self._post("error", error)
                    continue
                if body.get("type") == MessageType.ERROR.value:
                    raise server_error_from_message(body)
                if body.get("type") == MessageType.SET_STATE.value:
                    refused = body.get("steps_refused_stale")
                    if type(refused) is int and refused >= 1:  # anything else is ignored (§7.6)
                        self.steps_refused_stale += refused
                    share = body.get("record_share", 1.0)  # absent: record every episode
                    if type(share) in (int, float) and 0 < share <= 1:  # (not a bool, not NaN)
                        self.record_share = float(share)
                    if "steps_per_batch" not in body:  # absent: env_steps_per_sample
                        self.steps_per_batch = None
                    elif type(body["steps_per_batch"]) is int and body["steps_per_batch"] >= 1:  # else ignored (null too)
                        self.steps_per_batch = body["steps_per_batch"]
                    if "env_params" in body and self.speaks(1, 7):  # (never asked of an older server)
                        self._take_env_params(body["env_params"])
                    elif message.get("env_params_seq") == 0 and self.speaks(1, 7):
                        self._post("env_params", None)  # asked with 0, sent nothing: the server has no parameters (§19.2)
                return body

    def _take_env_params(self, body: Any) -> None:
        """**[1.7]** A parameter set (§19.2) for the engine thread; one that breaks §19.1 is ignored
        (the client keeps the set it holds, and says so once per seq)."""
        try:
            params = parse_env_params(body)
        except EnvParamsError as exc:
            seq = body.get("seq") if isinstance(body, dict) else None
            if seq != self._ignored_seq:  # (once per seq: it is sent again with every answer)
                logger.warning("ignoring the server's env_params: %s", exc)
                self._ignored_seq = seq
            return
        self._env_params_seq = params.seq
        self._post("env_params", params)

    def _fail_current_request(self, exc: BaseException) -> None:
        """A request whose answer timed out fails for its waiter (a batch is resent instead)."""
        request, self._current_request = self._current_request, None
        if request is None:
            return
        with self._lock:
            if self._requests and self._requests[0] is request:
                self._requests.popleft()
        request.error = exc
        request.done.set()

    def _fail_all_requests(self, exc: BaseException) -> None:
        with self._lock:
            requests, self._requests = list(self._requests), deque()
        for request in requests:
            request.error = exc
            request.done.set()
