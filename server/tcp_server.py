"""The asyncio TCP transport: moves bytes between sockets and the Sans-I/O
``ServerConnection``, and routes requests to the ``Trainer``."""

from __future__ import annotations

import asyncio
import itertools
import sys
from typing import Any

from tether.sdk.protocol.connection import Refusal, ServerConnection
from tether.sdk.protocol.errors import ErrorCode, FramingError, MessageError
from tether.sdk.protocol.framing import encode_frame
from tether.sdk.protocol.messages import MessageType, error_message

from .batch_dedup import batch_id
from .ingest import message_env_steps
from .trainer import Trainer

_READ_SIZE = 1 << 20


class ClientSession:
    """What the server remembers about one connected client."""

    _ids = itertools.count(1)

    def __init__(self, peer: Any) -> None:
        self.id = next(self._ids)
        self.peer = peer
        #: weights_seq_no per module last sent to this client; used when a client omits it.
        self.last_sent: dict[str, int] = {}


class TetherServer:
    """Accepts any number of clients on one port and serves them concurrently."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.config = trainer.config
        self._server: asyncio.base_events.Server | None = None
        self._config_frame = encode_frame(trainer.config_message())
        self.ingest = trainer.ingest
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
            self.trainer.forget_connection(session.id)
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
                return self._send_state(session, connection, self._client_holds(message))
            if kind is MessageType.MAP_AGENTS:
                modules = self.ingest.assign(session.id, message)
                return encode_frame({"type": MessageType.AGENT_MODULES.value, "modules": modules})
            # EPISODES or EPISODES_AND_GET_STATE; a duplicate batch (1.3) is answered as if new, not stored.
            wants_state = kind is MessageType.EPISODES_AND_GET_STATE
            batch = batch_id(message)
            async with trainer.dedup.slot(batch) as duplicate:
                if not duplicate:
                    owner, versions = trainer.owner(session.id, batch), self._data_versions(session, message)
                    records = self.ingest.decode(owner, message, versions, via=session.id)
                    await trainer.submit(owner, records, versions, wait_for_update=wants_state and self.config.force_on_policy,
                                         env_steps=message_env_steps(message, records), source=f"#{session.id} {session.peer}")
            return self._send_state(session, connection, self._client_holds(message)) if wants_state else None
        except MessageError as exc:
            return encode_frame(error_message(exc.code, exc.message, kind.value))
        except Exception as exc:  # never let one bad request take the server down
            print(f"[tether] internal error on {kind.value} from {session.peer}: {exc!r}", file=sys.stderr)
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
        elif trainer.default_module is not None:
            session.last_sent[trainer.default_module] = message["weights_seq_no"]
        return encode_frame(message)
