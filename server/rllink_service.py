"""RLlink's requests, answered the same way on every transport.

A transport (transport/tcp.py, transport/websocket.py) moves bytes; each body it
receives goes to :meth:`RLlinkService.answer`, which applies the session rules
of the Sans-I/O ``ServerConnection`` (auth, version, handshake) and answers:

- PING, GET_CONFIG: PONG, and SET_CONFIG (encoded once);
- GET_STATE: SET_STATE (see state_messages: a model goes once per version and connection);
- MAP_AGENTS: AGENT_MODULES from the layout's mapping function;
- EPISODES, EPISODES_AND_GET_STATE: the ingest pipeline (ingest/pipeline.py), then SET_STATE.

A large body of an authenticated peer is parsed and validated in the decode pool,
off the event loop. One request's failure is one ERROR answer, never the server's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tether.protocol.connection import Refusal, ServerConnection, ServerState
from tether.protocol.errors import ErrorCode, MessageError
from tether.protocol.framing import encode_frame
from tether.protocol.messages import MessageType, error_message

from .client_session import ClientSession
from .ingest.decode_pool import DecodePool
from .ingest.pipeline import IngestPipeline
from .state_messages import StateFrames, config_message, env_params_for, state_message
from .trainer import Trainer
from .transport.connection_limits import ConnectionLimits, OpenConnection
from .transport.deadlines import speaks_1_3
from .say import say


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


def _client_holds(message: dict) -> Any:
    """What the client says it holds: per module (1.2) or one number (1.1)."""
    per_module = message.get("weights_seq_nos")
    return per_module if isinstance(per_module, dict) else message.get("weights_seq_no")


class RLlinkService:
    """Answers the bodies every transport receives, for one trainer."""

    def __init__(self, trainer: Trainer, connections: ConnectionLimits) -> None:
        self.trainer = trainer
        self.config = trainer.config
        #: Every open connection, TCP and websocket: a request accepted in READY establishes its connection.
        self.connections = connections
        #: Large bodies are parsed and validated in another process (see decode_pool).
        self.decode_pool = DecodePool(trainer.layout.specs, trainer.layout.default_module(),
                                      trainer.config.force_on_policy)
        self.ingest = IngestPipeline(trainer)
        self._config_frame = encode_frame(config_message(trainer))
        self._state_frames = StateFrames(trainer)
        #: Told of connections, requests, refusals and stored batches (the console's ConsoleState), or None.
        self.observer: Any = None

    def start(self) -> None:
        """Start the decode workers now (see DecodePool.start)."""
        self.decode_pool.start()

    def close(self) -> None:
        self.decode_pool.close()
        self.ingest.close()

    # -- sessions ----------------------------------------------------------------

    def connected(self, session: ClientSession) -> ServerConnection:
        """A transport accepted a connection (within its limits): its protocol state machine."""
        connection = ServerConnection(self.config.max_frame_bytes, self.config.auth_token,
                                      pre_auth_max_frame_bytes=self.config.pre_auth_max_frame_bytes,
                                      run_id=self.trainer.run_id)
        self.trainer.metrics.clients_connected += 1
        if self.observer is not None:
            self.observer.connected(session.id, session.peer)
        return connection

    def disconnected(self, session: ClientSession) -> None:
        """A connection that :meth:`connected` returned has ended: its episode state is freed."""
        self.trainer.metrics.clients_connected -= 1
        if self.trainer.directory is not None:
            self.trainer.directory.left(session.id)
        if self.observer is not None:
            self.observer.disconnected(session.id)
        self.trainer.forget_connection(session.id)

    async def answer(self, session: ClientSession, connection: ServerConnection, body: bytes,
                     conn: OpenConnection | None = None) -> tuple[bytes | None, bool]:
        """One received body, answered the same way on every transport: returns the frame to
        send (None: nothing) and whether the connection closes after it. A large body of an
        authenticated peer is parsed and validated in the decode pool, off the event loop.
        ``conn`` (the connection's slot) is established by its first request accepted in
        READY, and its wrong tokens are counted against its address."""
        limits = self.connections
        if self.trainer.directory is not None:  # [1.9] a client told to move sends nothing more (§6.7)
            self.trainer.directory.heard_from(session.id)
        # A connection still in its handshake: its address may be refused for wrong tokens.
        handshaking = conn if conn is not None and not conn.established else None
        if handshaking is not None:
            refusal = limits.throttled(handshaking)
            if refusal is not None:
                return refusal, True
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
            if handshaking is not None and event.closes_connection and event.error.code is ErrorCode.AUTH_FAILED:
                text += limits.wrong_token(handshaking)
            if observer is not None:
                observer.refused(session.id, event.error.code.value, text, event.request_type)
            return _encode_error(event.error.code, text, event.request_type), event.closes_connection
        if conn is not None and not conn.established and connection.state is ServerState.READY:
            limits.establish(conn)
        if conn is not None and event.kind is MessageType.PING:
            conn.speaks_1_3 = speaks_1_3(connection)
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
        try:
            if kind is MessageType.PING:
                pong = connection.pong()
                directory = self.trainer.directory
                if directory is not None and not session.websocket:  # [1.9] a rank of a group: §6.7
                    pong.update(directory.pong_fields(message, session.id, self.trainer.metrics.clients_connected))
                return encode_frame(pong)
            if kind is MessageType.GET_CONFIG:
                return self._config_frame
            if kind is MessageType.GET_STATE:
                return self._send_state(session, connection, _client_holds(message), message.get("env_params_seq"))
            if kind is MessageType.MAP_AGENTS:
                modules = self.trainer.ingest.assign(session.id, message)
                return _encode_echo({"type": MessageType.AGENT_MODULES.value, "modules": modules})
            # EPISODES or EPISODES_AND_GET_STATE; a duplicate batch (1.3) is answered as if new, not stored.
            wants_state = kind is MessageType.EPISODES_AND_GET_STATE
            await self.ingest.store(session, message, wants_state, predecoded, self.observer)
            return (self._send_state(session, connection, _client_holds(message), message.get("env_params_seq"))
                    if wants_state else None)
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
            say(f"[tether] internal error on {kind.value} from {session.peer}: {exc!r:.300}")
            return encode_frame(error_message(ErrorCode.INTERNAL, "internal server error", kind.value))

    def _send_state(self, session: ClientSession, connection: ServerConnection, client_holds: Any,
                    env_params_seq: Any = None) -> bytes:
        trainer = self.trainer
        # Only a client that announced protocol 1.1+ may get SET_STATE without the
        # model: RLlib's v1 documentation lets a plain client send weights_seq_no too.
        # Such a client is not sent a model again that this connection already got (§7.5).
        message = state_message(trainer, client_holds, may_omit_model=connection.client_version is not None,
                                clients=self.connections.established_connections, sent=session.models_sent)
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
        extra: dict[str, Any] = {}
        if refused and connection.client_version is not None:
            extra["steps_refused_stale"] = refused
        params = env_params_for(trainer.curriculum, env_params_seq)
        if params is not None:
            extra["env_params"] = params
        if extra:  # per connection and answer (rare: a change): not worth a cached frame
            return encode_frame({**message, **extra})
        return self._state_frames.frame(key, message)
