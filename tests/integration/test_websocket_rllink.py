"""RLlink over websockets (docs/protocol.md §3.4) against a real server: a
websocket client plays whole sessions with one RLlink body per text message,
gets the same answers and errors as over TCP, and is held to the same limits."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tether.sdk.policy import OnnxPolicy
from tether.protocol import decode_onnx

from .server_process import ServerProcess

WS = re.compile(r"RLlink over websockets: (ws://\S+)")


def ws_url(server: ServerProcess) -> str:
    for _ in range(100):
        for line in list(server.lines):
            match = WS.search(line)
            if match:
                return match.group(1)
        time.sleep(0.05)
    raise AssertionError("no websocket line:\n" + "\n".join(server.lines))


async def request(ws, message: dict) -> dict:
    await ws.send(json.dumps(message))
    answer = await asyncio.wait_for(ws.recv(), 30)
    assert isinstance(answer, str), "the server sends text messages (§3.4)"
    return json.loads(answer)


def test_a_websocket_client_trains_cartpole_with_the_same_protocol(tmp_path: Path) -> None:
    """The handshake, the model, on-policy batches answered with new weights, exactly-once resends: all over ws."""
    with ServerProcess(tmp_path, "--env", "CartPole-v1", "--ws-port", "0", "--seed", "0",
                       "--env-steps-per-sample", "500", "--train-batch-size", "1000") as server:
        url = ws_url(server)

        async def session() -> dict:
            async with connect(url) as ws:
                pong = await request(ws, {"type": "PING", "protocol_version": "1.3", "client_name": "ws-test"})
                assert pong["type"] == "PONG" and pong["protocol_version"] == "1.9"
                config = await request(ws, {"type": "GET_CONFIG"})
                assert config["type"] == "SET_CONFIG" and config["action_space"]["type"] == "Discrete"
                state = await request(ws, {"type": "GET_STATE"})
                policy = OnnxPolicy(decode_onnx(state["onnx_file"]))
                env = gym.make("CartPole-v1")
                rng = np.random.default_rng(0)
                version, seq = state["weights_seq_no"], 0
                obs, _ = env.reset(seed=0)
                for _batch in range(4):
                    episodes, steps = [], 0
                    record = {"obs": [obs.tolist()], "actions": [], "rewards": [], "action_logp": [],
                              "episode_id": f"e{seq}-0"}
                    n = 0
                    while steps < 500:
                        logits = policy.dist_inputs(np.asarray([obs], np.float32))[0].astype(np.float64)
                        p = np.exp(logits - logits.max())
                        p /= p.sum()
                        action = int(rng.choice(2, p=p))
                        obs, reward, terminated, truncated, _ = env.step(action)
                        record["obs"].append(obs.tolist())
                        record["actions"].append(action)
                        record["rewards"].append(float(reward))
                        record["action_logp"].append(float(np.log(p[action])))
                        steps += 1
                        if terminated or truncated:
                            episodes.append({**record, "is_terminated": terminated, "is_truncated": truncated})
                            n += 1
                            obs, _ = env.reset()
                            record = {"obs": [obs.tolist()], "actions": [], "rewards": [], "action_logp": [],
                                      "episode_id": f"e{seq}-{n}"}
                    if record["actions"]:
                        episodes.append({**record, "is_terminated": True, "is_truncated": False})
                        obs, _ = env.reset()
                    seq += 1
                    message = {"type": "EPISODES_AND_GET_STATE", "episodes": episodes, "env_steps": steps,
                               "agent_steps": steps, "weights_seq_no": version, "client_session": "ws-session-1",
                               "batch_seq": seq}
                    answer = await request(ws, message)
                    assert answer["type"] == "SET_STATE", answer
                    if seq == 2:  # the same batch again: answered as if new, stored once (§13.5)
                        again = await request(ws, message)
                        assert again["type"] == "SET_STATE"
                    if "onnx_file" in answer:
                        policy = OnnxPolicy(decode_onnx(answer["onnx_file"]))
                    version = answer["weights_seq_no"]
                return {"version": version}

        result = asyncio.run(session())
        summary = server.stop()
    assert result["version"] >= 1  # the server trained on what came over the websocket and sent new weights
    assert summary["env_steps"] == 4 * 500  # the resent batch was stored once


def test_websocket_errors_and_limits_are_the_tcp_servers(tmp_path: Path) -> None:
    with ServerProcess(tmp_path, "--env", "CartPole-v1", "--ws-port", "0", "--auth-token", "s3cret",
                       "--max-frame-bytes", "200000") as server:
        url = ws_url(server)

        async def scenario() -> None:
            async with connect(url) as ws:
                # Not authenticated: refused as over TCP, and a wrong token ends the connection.
                answer = await request(ws, {"type": "GET_CONFIG"})
                assert answer["type"] == "ERROR" and answer["code"] == "AUTH_FAILED", answer
                wrong_token = await request(ws, {"type": "PING", "protocol_version": "1.3", "auth_token": "nope"})
                assert wrong_token["code"] == "AUTH_FAILED"
                with pytest.raises(ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 10)
            # Before authentication a message over pre_auth_max_frame_bytes (64 KiB) is refused as it
            # arrives (1009), not buffered whole: an unauthenticated peer cannot fill the server's memory.
            async with connect(url, max_size=None) as ws:
                await ws.send(json.dumps({"type": "PING", "protocol_version": "1.3", "pad": "x" * 100_000}))
                with pytest.raises(ConnectionClosed) as early:
                    await asyncio.wait_for(ws.recv(), 10)
                assert early.value.rcvd is not None and early.value.rcvd.code == 1009, early.value
            async with connect(url) as ws:
                assert (await request(ws, {"type": "PING", "protocol_version": "1.3", "auth_token": "s3cret"}))["type"] == "PONG"
                # Authenticated, the limit is max_frame_bytes (200000): a 150 kB message is read and answered.
                padded = await request(ws, {"type": "GET_CONFIG", "pad": "x" * 150_000})
                assert padded["type"] == "SET_CONFIG", padded
                await ws.send("{not json")
                bad = json.loads(await ws.recv())
                assert bad["type"] == "ERROR" and bad["code"] == "INVALID_JSON", bad
                wrong = await request(ws, {"type": "EPISODES", "episodes": [{"obs": [[0, 0, 0, 0]], "actions": [],
                                                                              "rewards": []}]})
                assert wrong["type"] == "ERROR" and wrong["request"] == "EPISODES", wrong
                assert (await request(ws, {"type": "GET_CONFIG"}))["type"] == "SET_CONFIG"  # the connection goes on
                # A message over max_frame_bytes closes the connection, as an oversized frame does on TCP.
                await ws.send(json.dumps({"type": "EPISODES", "episodes": [], "pad": "x" * 300_000}))
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), 10)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
            async with connect(url.replace("/rllink", "/elsewhere")) as ws:
                pass

        with pytest.raises(Exception) as refused:
            asyncio.run(scenario())
        assert "404" in str(refused.value)


def test_a_message_sent_with_the_upgrade_request_is_held_to_the_pre_auth_limit(tmp_path: Path) -> None:
    """A client may send its first message in the same write as the HTTP upgrade: it is read
    before the server's handler runs, and must still be refused at its header (1009), not
    buffered whole."""
    import base64
    import socket
    import struct
    from urllib.parse import urlsplit

    with ServerProcess(tmp_path, "--env", "CartPole-v1", "--ws-port", "0", "--auth-token", "s3cret") as server:
        url = urlsplit(ws_url(server))
        size = 1_000_000  # over pre_auth_max_frame_bytes (64 KiB)
        upgrade = (f"GET {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {base64.b64encode(b'0123456789abcdef').decode()}\r\n"
                   "Sec-WebSocket-Version: 13\r\n\r\n").encode()
        header = bytes([0x81, 0x80 | 127]) + struct.pack("!Q", size) + b"\0\0\0\0"  # text, masked (key 0)
        with socket.create_connection((url.hostname, url.port), timeout=10) as raw:
            # Only the header and 1000 bytes of the body: a server that waited for the whole
            # message (buffering it) would leave this connection open until the timeout.
            raw.sendall(upgrade + header + b" " * 1000)
            received = b""
            while True:
                chunk = raw.recv(4096)  # socket.timeout (a failure) if the server waits for more
                if not chunk:
                    break
                received += chunk
        # Closed at the header: no 101 at all, or a 1009 close right after it; never an RLlink answer.
        assert b"FRAME_TOO_LARGE" not in received and b"AUTH_FAILED" not in received, received[:300]
        if received.startswith(b"HTTP/1.1 101"):
            frame = received[received.index(b"\r\n\r\n") + 4:]
            assert frame[:1] == b"\x88" and struct.unpack("!H", frame[2:4])[0] == 1009, frame[:40]


def test_the_python_sdk_trains_over_a_websocket_address(tmp_path: Path) -> None:
    from tether.sdk import TetherClient, run_env

    with ServerProcess(tmp_path, "--env", "CartPole-v1", "--ws-port", "0", "--seed", "0",
                       "--env-steps-per-sample", "250", "--train-batch-size", "1000") as server:
        url = ws_url(server)
        client = TetherClient(url, client_name="sdk-over-ws", seed=0, wait_for_weights=True)
        try:
            assert client.weights_seq_no == 0
            run_env(client, gym.make("CartPole-v1"), max_steps=3000)
            client.flush()
            assert client.weights_seq_no >= 2  # trained on what went over the websocket, new models came back
            sent = client.env_steps_sent
        finally:
            client.close()
        summary = server.stop()
    assert sent >= 2750 and summary["env_steps"] == sent


def _upgrade(url, key: bytes = b"0123456789abcdef") -> bytes:
    import base64
    return (f"GET {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {base64.b64encode(key).decode()}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()


def _read_until_closed(raw, limit: float = 20.0) -> bytes:
    raw.settimeout(limit)
    received = b""
    while True:
        chunk = raw.recv(65536)  # socket.timeout (a failure) if the server never closes it
        if not chunk:
            return received
        received += chunk


def test_websocket_and_tcp_connections_share_one_limit_from_their_first_byte(tmp_path: Path) -> None:
    """max_connections counts both transports together, and a websocket connection counts
    from its first byte, still in its HTTP upgrade; the upgrade must end within handshake_timeout_s."""
    import socket
    from urllib.parse import urlsplit

    from .server_process import RawClient

    with ServerProcess(tmp_path, "--env", "CartPole-v1", "--ws-port", "0", "--max-connections", "3",
                       "--handshake-timeout-s", "2") as server:
        url = urlsplit(ws_url(server))
        # Three sockets open on the websocket port, never sending their upgrade, take all three slots; none
        # has completed a handshake, so a TCP client that PINGs at once takes the place of the oldest.
        idle = [socket.create_connection((url.hostname, url.port), timeout=10) for _ in range(3)]
        time.sleep(0.3)
        tcp = RawClient(server.port)
        assert tcp.request({"type": "PING", "protocol_version": "1.3"})["type"] == "PONG"
        started = time.monotonic()
        _read_until_closed(idle[0])  # closed in its upgrade: no RLlink ERROR can be sent yet
        assert time.monotonic() - started < 1.0
        tcp.close()
        # An upgrade that does not finish within handshake_timeout_s (2 s) is closed, freeing its slot.
        for raw in idle:
            _read_until_closed(raw)
            raw.close()
        assert time.monotonic() - started < 8
        # The other way: three TCP clients fill the limit; a websocket client is told why it is refused.
        clients = [RawClient(server.port) for _ in range(3)]
        for client in clients:
            assert client.request({"type": "PING", "protocol_version": "1.3"})["type"] == "PONG"

        async def refused_over_ws() -> dict:
            async with connect(ws_url(server)) as ws:
                return json.loads(await asyncio.wait_for(ws.recv(), 10))

        answer = asyncio.run(refused_over_ws())
        assert answer["code"] == "TOO_MANY_CONNECTIONS", answer
        clients.pop().close()
        time.sleep(0.3)

        async def admitted_over_ws() -> dict:
            async with connect(ws_url(server)) as ws:
                return await request(ws, {"type": "PING", "protocol_version": "1.3"})

        assert asyncio.run(admitted_over_ws())["type"] == "PONG"
        for client in clients:
            client.close()


def test_unfinished_websocket_messages_share_the_tcp_servers_memory_budget(tmp_path: Path) -> None:
    """max_partial_frame_bytes bounds the bytes of unfinished messages of all connections,
    websocket ones included: over it, the largest holder is closed with SERVER_OVERLOADED,
    the others go on."""
    import socket
    import struct
    from urllib.parse import urlsplit

    from .server_process import RawClient

    with ServerProcess(tmp_path, "--env", "CartPole-v1", "--ws-port", "0", "--max-frame-bytes", "1000000",
                       "--max-partial-frame-bytes", "1000000") as server:
        url = urlsplit(ws_url(server))
        # A TCP client holds 400 kB of an unfinished frame.
        tcp = RawClient(server.port)
        assert tcp.request({"type": "PING", "protocol_version": "1.3"})["type"] == "PONG"
        tcp.sock.sendall(b"%08d" % 900_000 + b"{" + b" " * 400_000)
        # A websocket client starts a 900 kB message and sends 600 kB of it: 1,000,009 bytes held in all.
        # (No more than that: bytes the server has not read when it closes would reset the connection.)
        raw = socket.create_connection((url.hostname, url.port), timeout=10)
        raw.sendall(_upgrade(url))
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += raw.recv(4096)
        assert reply.startswith(b"HTTP/1.1 101"), reply[:200]
        raw.sendall(bytes([0x81, 0x80 | 127]) + struct.pack("!Q", 900_000) + b"\0\0\0\0" + b" " * 600_000)
        received = _read_until_closed(raw)
        raw.close()
        assert b"SERVER_OVERLOADED" in received and b"max_partial_frame_bytes" in received, received[:300]
        # The TCP client, holding less, was not touched: it finishes its frame and is answered.
        tcp.sock.sendall(b" " * (900_000 - 400_001 - 1) + b"}")
        answer = tcp.receive()
        assert answer["code"] == "INVALID_MESSAGE" or answer["type"] == "ERROR", answer
        assert tcp.request({"type": "PING", "protocol_version": "1.3"})["type"] == "PONG"
        tcp.close()
