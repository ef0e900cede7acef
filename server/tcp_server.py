"""The asyncio TCP transport: moves bytes between sockets and the Sans-I/O
``ServerConnection``, and routes requests to the ``Trainer``."""

from __future__ import annotations

import asyncio
import itertools
import sys
from typing import Any

from sdk_python.protocol.connection import Refusal, ServerConnection
from sdk_python.protocol.episodes import decode_episodes
from sdk_python.protocol.errors import ErrorCode, FramingError, MessageError
from sdk_python.protocol.framing import encode_frame
from sdk_python.protocol.messages import MessageType, error_message

from .trainer import Trainer

_READ_SIZE = 1 << 20


class ClientSession:
    """What the server remembers about one connected client."""

    _ids = itertools.count(1)

    def __init__(self, peer: Any) -> None:
        self.id = next(self._ids)
        self.peer = peer
        #: weights_seq_no last sent to this client; used when a v1 client omits it.
        self.last_sent_seq_no = 0


class TetherServer:
    """Accepts any number of clients on one port and serves them concurrently."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.config = trainer.config
        self._server: asyncio.base_events.Server | None = None
        self._config_frame = encode_frame(trainer.config_message())
        self._handlers: set[asyncio.Task] = set()

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle_client, self.config.host, self.config.port, limit=_READ_SIZE)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        session = ClientSession(writer.get_extra_info("peername"))
        connection = ServerConnection(self.config.max_frame_bytes, self.config.auth_token)
        metrics = self.trainer.metrics
        metrics.clients_connected += 1
        try:
            while True:
                data = await reader.read(_READ_SIZE)
                if not data:
                    break  # EOF; a partial frame in the decoder is discarded, nothing stored
                try:
                    events = connection.receive_data(data)
                except FramingError as exc:
                    writer.write(connection.framing_error_frame(exc))
                    await writer.drain()
                    break
                for event in events:
                    if isinstance(event, Refusal):
                        writer.write(encode_frame(event.to_message()))
                        continue
                    response = await self._respond(session, connection, event.kind, event.message)
                    if response is not None:
                        writer.write(response)
                if connection.framing_error is not None:  # frames before a bad header were answered
                    writer.write(connection.framing_error_frame(connection.framing_error))
                    await writer.drain()
                    break
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            metrics.clients_connected -= 1
            self.trainer.episodes.forget(session.id)
            self._handlers.discard(task)
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, asyncio.CancelledError):
                pass

    async def _respond(
        self, session: ClientSession, connection: ServerConnection, kind: MessageType, message: dict
    ) -> bytes | None:
        trainer = self.trainer
        try:
            if kind is MessageType.PING:
                return encode_frame(connection.pong())
            if kind is MessageType.GET_CONFIG:
                return self._config_frame
            if kind is MessageType.GET_STATE:
                return self._send_state(session, connection, message.get("weights_seq_no"))
            # EPISODES or EPISODES_AND_GET_STATE
            on_policy = self.config.force_on_policy
            chunks = decode_episodes(message, trainer.observation_space, trainer.action_space, require_logp=on_policy)
            seq = message.get("weights_seq_no")
            if not isinstance(seq, int) or isinstance(seq, bool):
                seq = session.last_sent_seq_no
            wants_state = kind is MessageType.EPISODES_AND_GET_STATE
            await trainer.submit(session.id, chunks, seq, wait_for_update=wants_state and on_policy)
            return self._send_state(session, connection, message.get("weights_seq_no")) if wants_state else None
        except MessageError as exc:
            return encode_frame(error_message(exc.code, exc.message, kind.value))
        except Exception as exc:  # never let one bad request take the server down
            print(f"[tether] internal error on {kind.value} from {session.peer}: {exc!r}", file=sys.stderr)
            return encode_frame(error_message(ErrorCode.INTERNAL, "internal server error", kind.value))

    def _send_state(self, session: ClientSession, connection: ServerConnection, client_holds: Any) -> bytes:
        session.last_sent_seq_no = self.trainer.weights_seq_no
        # Only a client that announced protocol 1.1 may get SET_STATE without the
        # model: RLlib's v1 documentation lets a plain client send weights_seq_no too.
        if connection.client_version is None:
            client_holds = None
        return self.trainer.state_frame(client_holds)
