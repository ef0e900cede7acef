"""A scripted RLlink server on a raw socket, for testing what the SDK sends.

Each accepted connection runs ``handler(conn)`` on its own thread; ``conn``
reads whole messages and writes answers, and every message received is kept in
``ScriptedServer.received`` (in order, with the connection's number), so a test
can assert exactly what the client sent: session ids, batch sequence numbers,
resends, heartbeats.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from tether.protocol import FrameDecoder, decode_message, encode_frame
from tether.protocol.onnx_codec import encode_onnx


def constant_model(obs_dim: int, outputs: list[float], input_name: str = "obs",
                   output_name: str = "action_dist_inputs") -> bytes:
    """An ONNX model whose output row is ``outputs`` for any observation batch:
    obs @ zeros(obs_dim, k) + outputs."""
    k = len(outputs)
    weight = helper.make_tensor("W", TensorProto.FLOAT, [obs_dim, k], np.zeros(obs_dim * k, np.float32).tolist())
    bias = helper.make_tensor("B", TensorProto.FLOAT, [k], [float(v) for v in outputs])
    graph = helper.make_graph(
        [helper.make_node("MatMul", [input_name, "W"], ["XW"]), helper.make_node("Add", ["XW", "B"], [output_name])],
        "constant",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", obs_dim])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", k])],
        initializer=[weight, bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def single_agent_config(obs_dim: int, action_space: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "SET_CONFIG", "env_steps_per_sample": extra.pop("env_steps_per_sample", 10),
            "force_on_policy": extra.pop("force_on_policy", True),
            "observation_space": {"type": "Box", "shape": [obs_dim], "low": -10.0, "high": 10.0},
            "action_space": action_space, "onnx_input_names": ["obs"],
            "onnx_output_names": ["action_dist_inputs"], **extra}


class ScriptedConnection:
    """One accepted connection: whole messages in, messages out."""

    def __init__(self, server: "ScriptedServer", sock: socket.socket, index: int) -> None:
        self.server = server
        self.sock = sock
        self.index = index
        self._decoder = FrameDecoder()
        self._pending: list[dict[str, Any]] = []

    def receive(self, timeout: float | None = 10.0) -> dict[str, Any] | None:
        """The next message, or None when the client closed the connection (or on timeout)."""
        self.sock.settimeout(timeout)
        while not self._pending:
            try:
                data = self.sock.recv(1 << 20)
            except (socket.timeout, OSError):
                return None
            if not data:
                return None
            self._pending.extend(decode_message(body)[1] for body in self._decoder.feed(data))
        message = self._pending.pop(0)
        with self.server.lock:
            self.server.received.append((self.index, time.monotonic(), message))
        return message

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(encode_frame(message))

    def handshake(self, config: dict[str, Any], state: dict[str, Any], version: str | None = "1.3") -> None:
        """Answer PING, GET_CONFIG and GET_STATE as a server would."""
        for _ in range(3):
            message = self.receive()
            assert message is not None, "client closed during the handshake"
            kind = message["type"]
            if kind == "PING":
                self.send({"type": "PONG", **({"protocol_version": version} if version else {})})
            elif kind == "GET_CONFIG":
                self.send(config)
            elif kind == "GET_STATE":
                self.send(state)
            else:
                raise AssertionError(f"unexpected {kind} during the handshake")

    def read_until_closed(self) -> None:
        """Read (and record) everything the client sends, answering nothing: a hung server or a
        half-open connection, as the client sees it."""
        while self.receive(timeout=None) is not None:
            pass

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class ScriptedServer:
    """Listens on a free loopback port; runs ``handler`` for each connection."""

    def __init__(self, handler: Callable[[ScriptedConnection], None]) -> None:
        self.handler = handler
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.received: list[tuple[int, float, dict[str, Any]]] = []
        self.connections: list[ScriptedConnection] = []
        self.errors: list[BaseException] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            conn = ScriptedConnection(self, sock, len(self.connections))
            self.connections.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: ScriptedConnection) -> None:
        try:
            self.handler(conn)
        except OSError as exc:
            if not self._closed:  # (a socket the test's own close() shut under the handler is no error)
                self.errors.append(exc)
        except BaseException as exc:  # noqa: BLE001 - reported by the test through .errors
            self.errors.append(exc)
        finally:
            conn.close()

    def messages(self, kind: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [m for _, _, m in self.received if kind is None or m["type"] == kind]

    def close(self) -> None:
        self._closed = True
        try:  # (wakes the accepting thread: a bare close leaves the port listening until accept returns)
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for conn in self.connections:
            conn.close()

    def __enter__(self) -> "ScriptedServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def state(seq: int, model: bytes | None) -> dict[str, Any]:
    message: dict[str, Any] = {"type": "SET_STATE", "weights_seq_no": seq}
    if model is not None:
        message["onnx_file"] = encode_onnx(model)
    return message


def silent_after_handshake(config: dict[str, Any], set_state: dict[str, Any],
                           version: str | None = "1.3") -> Callable[[ScriptedConnection], None]:
    """A handler that completes the handshake, then never answers again."""

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(config, set_state, version=version)
        conn.read_until_closed()

    return handler


def answering_server(config_for: Callable[[int], dict[str, Any]], state_for: Callable[[int, int], dict[str, Any]],
                     version_for: Callable[[int], str | None], drop_first_batch: bool = False) -> ScriptedServer:
    """A server whose connection ``i`` (0 the first) sends ``config_for(i)``, claims protocol ``version_for(i)``
    and answers every batch and GET_STATE, its ``n``-th SET_STATE being ``state_for(i, n)`` (0: the
    handshake's). ``drop_first_batch``: the first connection closes at its first batch, unanswered."""

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(config_for(conn.index), state_for(conn.index, 0), version=version_for(conn.index))
        answers = 0
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "PING":
                conn.send({"type": "PONG"})
            elif message["type"] in ("EPISODES_AND_GET_STATE", "GET_STATE"):
                if drop_first_batch and conn.index == 0 and message["type"] == "EPISODES_AND_GET_STATE":
                    return
                answers += 1
                conn.send(state_for(conn.index, answers))

    return ScriptedServer(handler)


def sent_records(server: ScriptedServer) -> list[dict[str, Any]]:
    """Every record the server was sent, in order, a batch sent again counted once."""
    seen, out = set(), []
    for batch in server.messages("EPISODES_AND_GET_STATE"):
        if batch.get("batch_seq") not in seen:
            seen.add(batch.get("batch_seq"))
            out.extend(batch["episodes"])
    return out


def play_steps(client: Any, episode_id: str, steps: range, width: int = 3) -> None:
    """A single-agent client plays one step per t in ``steps``: an observation of ``width`` values t, reward 1."""
    for t in steps:
        client.get_action(episode_id, np.full(width, t, np.float32))
        client.log_returns(episode_id, 1.0)
