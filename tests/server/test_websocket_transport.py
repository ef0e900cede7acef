"""RLlink over websockets, the transport's own rules (docs/protocol.md §3.4): the
bytes connections hold, counted in max_partial_frame_bytes, deadlines, UTF-8, and
the server's stop. A server in this process (real sockets, the real websockets
server), so a test can read the counts and slow the decode pool down."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import struct
import threading
import time
from pathlib import Path

from websockets.asyncio.client import connect

from tether.server.config import ServerConfig
from tether.server.module_setup import build_layout
from tether.server.trainer import Trainer
from tether.server.transport.connection_limits import ConnectionLimits, OpenConnection
from tether.server.transport.tcp import TetherServer
from tether.server.transport.websocket import _REFUSED_MAX_MESSAGE, WebSocketRLlink, _held_bytes

from ..integration.server_process import read_until_closed


async def _start(tmp_path: Path, **options) -> tuple[Trainer, TetherServer, WebSocketRLlink]:
    config = ServerConfig(logdir=str(tmp_path), tensorboard=False, host="127.0.0.1", port=0, **options)
    trainer = Trainer(config, build_layout(config, None))
    tcp = TetherServer(trainer)
    await tcp.start()
    ws = WebSocketRLlink(tcp, "127.0.0.1", 0)
    await ws.start()
    return trainer, tcp, ws


async def _stop(trainer: Trainer, tcp: TetherServer, ws: WebSocketRLlink) -> None:
    await ws.stop()
    await tcp.stop()
    await trainer.close(checkpoint=False)


def _upgraded_socket(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = base64.b64encode(b"0123456789abcdef").decode()
    sock.sendall((f"GET /rllink HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    reply = b""
    while not reply.endswith(b"\r\n\r\n"):  # byte by byte: frames sent right after stay unread
        byte = sock.recv(1)
        assert byte, reply
        reply += byte
    assert reply.startswith(b"HTTP/1.1 101"), reply[:200]
    return sock


def _frame(payload: bytes, fin: bool = True) -> bytes:
    """A masked client text frame (mask 0: the payload goes as it is)."""
    first = (0x80 if fin else 0) | 0x1
    size = len(payload)
    if size < 126:
        header = bytes([first, 0x80 | size])
    elif size < 1 << 16:
        header = bytes([first, 0x80 | 126]) + struct.pack("!H", size)
    else:
        header = bytes([first, 0x80 | 127]) + struct.pack("!Q", size)
    return header + b"\0\0\0\0" + payload


def _ping(pad: int = 0) -> bytes:
    return json.dumps({"type": "PING", "protocol_version": "1.3", "client_name": "x" * pad}).encode()


def test_the_count_ignores_connections_closed_or_evicted() -> None:
    """What a connection reports after it was evicted or closed is not counted: the
    total is what the open connections hold, and eviction never picks one holding nothing."""
    server = ConnectionLimits(max_connections=10, max_partial_frame_bytes=100)
    evicted: list[int] = []
    first = server.open_connection(lambda frame, current: evicted.append(1))
    second = server.open_connection(lambda frame, current: evicted.append(2))
    server.set_partial(first, 60)
    server.set_partial(second, 50)  # 110 > 100: the largest holder (first) is evicted
    assert evicted == [1] and server.partial_total == 50 and first.partial_bytes == 0
    server.set_partial(first, 80)  # its handler reads on before it ends: not counted again
    assert server.partial_total == 50
    server.close_connection(second)
    assert server.partial_total == 0
    server.set_partial(second, 70)  # closed: not counted
    assert server.partial_total == 0 and evicted == [1]
    server.close_connection(first)
    assert len(server) == 0 and server.partial_total == 0
    stray = OpenConnection(lambda frame, current: None)  # never opened (refused over the limit)
    server.set_partial(stray, 1000)
    assert server.partial_total == 0 and evicted == [1]



def test_bytes_of_handshaking_connections_never_push_out_an_established_one() -> None:
    """Over max_partial_frame_bytes, connections still in their handshake are closed first, largest
    first, even when an established connection holds more (an upload under way): peers without
    the token (or, without one, that never completed a request) cannot push out a client (§6.4)."""
    server = ConnectionLimits(max_connections=10, max_partial_frame_bytes=100)
    evicted: list[str] = []
    client = server.open_connection(lambda frame, current: evicted.append("client"))
    server.establish(client)
    server.set_partial(client, 60)
    small = server.open_connection(lambda frame, current: evicted.append("small"))
    big = server.open_connection(lambda frame, current: evicted.append("big"))
    server.set_partial(small, 10)
    server.set_partial(big, 35)  # 105 > 100
    assert evicted == ["big"] and not client.evicted and server.partial_total == 70

def test_a_websocket_lost_with_messages_queued_leaves_nothing_counted(tmp_path: Path) -> None:
    """A connection reset while a message is being answered and two more wait: the
    handler may still take a queued message after the loss, but once the connection is
    gone it holds nothing, and an honest client may hold up to the whole budget."""

    def lose_a_connection(port: int) -> None:
        sock = _upgraded_socket(port)
        sock.sendall(_frame(_ping(300_000)))  # decoded in the (slowed) pool: the handler waits
        time.sleep(0.1)
        sock.sendall(_frame(_ping()) + _frame(_ping(900_000)))  # queued; reading pauses
        time.sleep(0.3)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # reset: the answer's write fails

    async def main() -> tuple[int, list[int], bytes]:
        trainer, tcp, ws = await _start(tmp_path, max_frame_bytes=1_000_000, max_partial_frame_bytes=1_000_000)
        decode = tcp.service.decode_pool.decode

        async def slow_decode(body: bytes):  # the pool busy with other clients' bodies
            await asyncio.sleep(1.0)
            return await decode(body)

        tcp.service.decode_pool.decode = slow_decode
        thread = threading.Thread(target=lose_a_connection, args=(ws.port,))
        thread.start()
        totals = []
        deadline = time.monotonic() + 30
        while (thread.is_alive() or len(tcp.connections)) and time.monotonic() < deadline:  # (a leaked slot fails below)
            await asyncio.sleep(0.05)
        assert not len(tcp.connections), "the lost connection still holds its slot"
        for _ in range(20):  # the handler's last steps, after the connection is gone
            await asyncio.sleep(0.1)
            totals.append(tcp.connections.partial_total)
        # An honest TCP client now sends a frame of 990 kB in two parts: within the budget, answered.
        tcp.service.decode_pool.decode = decode
        reader, writer = await asyncio.open_connection("127.0.0.1", tcp.port)
        body = _ping(990_000 - 80)
        writer.write(b"%08d" % len(body) + body[:600_000])
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(body[600_000:])
        await writer.drain()
        header = await asyncio.wait_for(reader.readexactly(8), 10)
        answer = await asyncio.wait_for(reader.readexactly(int(header)), 10)
        writer.close()
        await _stop(trainer, tcp, ws)
        return tcp.connections.partial_total, totals, answer

    final, totals, answer = asyncio.run(main())
    assert totals == [0] * len(totals) and final == 0
    assert json.loads(answer)["type"] == "PONG", answer[:200]


def test_a_fragmented_message_is_counted_once(tmp_path: Path) -> None:
    async def main() -> int:
        trainer, tcp, ws = await _start(tmp_path)
        sock = await asyncio.to_thread(_upgraded_socket, ws.port)
        sock.sendall(_frame(b"{" + b" " * 199_999, fin=False) + b"\x00\x80\x00\x00\x00\x00")  # 200 kB + empty CONT
        sock.sendall(b"\x00" + bytes([0x80 | 126]) + struct.pack("!H", 50_000) + b"\0\0\0\0" + b" " * 50_000)
        await asyncio.sleep(0.5)
        held = tcp.connections.partial_total
        sock.close()
        await _stop(trainer, tcp, ws)
        return held

    assert asyncio.run(main()) == 250_000


def test_a_refused_websocket_is_not_read_beyond_a_small_message(tmp_path: Path) -> None:
    """Over max_connections, a websocket is told TOO_MANY_CONNECTIONS; a large message it
    sends then ends the connection (what follows is discarded as it arrives), instead of
    being buffered, uncounted, until the connection ends. Nor is a refused connection's
    upgrade read without bound (128 header lines of 8 KB each would pass the HTTP parser)."""

    def refused(port: int) -> tuple[bytes, int]:
        sock = _upgraded_socket(port)
        sock.settimeout(10)
        sent = 0
        received = b""
        while b"TOO_MANY_CONNECTIONS" not in received:  # sent right after the upgrade
            data = sock.recv(65536)
            if not data:
                break
            received += data
        try:
            sock.sendall(bytes([0x81, 0x80 | 127]) + struct.pack("!Q", 50_000_000) + b"\0\0\0\0")
            chunk = b" " * (1 << 20)
            for _ in range(49):
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        sock.close()
        return received, sent

    async def main() -> tuple[bytes, int, int, int]:
        trainer, tcp, ws = await _start(tmp_path, max_connections=1)
        _, holder = await asyncio.open_connection("127.0.0.1", tcp.port)  # takes the only slot
        holder.write(b'00000015{"type":"PING"}')  # an established client: no newcomer can take its slot
        await asyncio.sleep(0.1)
        sending = asyncio.ensure_future(asyncio.to_thread(refused, ws.port))
        held = 0
        while not sending.done():  # what the refused connection makes the server hold, meanwhile
            held = max([held, *(_held_bytes(c) for c in ws.connections)])
            await asyncio.sleep(0.005)
        received, sent = await sending
        total = tcp.connections.partial_total
        holder.close()
        await _stop(trainer, tcp, ws)
        return received, sent, held, total

    def huge_upgrade(port: int) -> bool:
        """Header lines of 8 KB, as many as the parser takes, never ending the request;
        whether the server cut the connection off (instead of waiting for the rest)."""
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            sock.sendall(f"GET /rllink HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())
            for k in range(120):
                sock.sendall(f"X-Filler-{k}: {'x' * 8000}\r\n".encode())
            sock.settimeout(3)  # well before the handshake deadline
            return sock.recv(1) == b""
        except socket.timeout:
            return False
        except OSError:  # reset
            return True
        finally:
            sock.close()

    async def upgrades() -> bool:
        trainer, tcp, ws = await _start(tmp_path, max_connections=1, handshake_timeout_s=20.0)
        _, holder = await asyncio.open_connection("127.0.0.1", tcp.port)
        holder.write(b'00000015{"type":"PING"}')
        await asyncio.sleep(0.1)
        cut_off = await asyncio.to_thread(huge_upgrade, ws.port)
        holder.close()
        await _stop(trainer, tcp, ws)
        return cut_off

    received, sent, held, total = asyncio.run(main())
    assert b"TOO_MANY_CONNECTIONS" in received, received[:300]
    assert held <= _REFUSED_MAX_MESSAGE + 1024, f"a refused connection made the server hold {held} bytes ({sent} sent)"
    assert total == 0  # (and nothing of it counted against the others)
    assert asyncio.run(upgrades()), "a refused connection's 960 KB upgrade was read on"


def test_stop_returns_while_a_websocket_batch_waits_for_training(tmp_path: Path) -> None:
    """A websocket client's EPISODES waiting for room in a paused trainer's full pool must
    not hold the server's stop (SIGTERM, the console's stop), as a TCP client's does not."""

    def episodes(steps: int, episode_id: str) -> str:
        record = {"obs": [[0.0] * 4] * (steps + 1), "actions": [0] * steps, "rewards": [1.0] * steps,
                  "action_logp": [-0.6931] * steps, "episode_id": episode_id, "is_terminated": True,
                  "is_truncated": False}
        return json.dumps({"type": "EPISODES", "episodes": [record], "env_steps": steps, "weights_seq_no": 0})

    async def main() -> float:
        trainer, tcp, ws = await _start(tmp_path, env="CartPole-v1", train_batch_size=100, force_on_policy=False)
        trainer.pause()
        async with connect(f"ws://127.0.0.1:{ws.port}/rllink") as client:
            await client.send(json.dumps({"type": "PING", "protocol_version": "1.3"}))
            assert json.loads(await client.recv())["type"] == "PONG"
            await client.send(episodes(250, "a"))  # fills the pool
            await asyncio.sleep(0.3)
            await client.send(episodes(10, "b"))  # waits for room
            await asyncio.sleep(0.3)
            assert trainer.pool.steps >= trainer.pool.capacity
            started = time.monotonic()
            await asyncio.wait_for(ws.stop(), 15)
            took = time.monotonic() - started
        await tcp.stop()
        await trainer.close(checkpoint=False)
        return took

    assert asyncio.run(main()) < 5.0


def test_the_authentication_deadline_runs_from_the_tcp_connection(tmp_path: Path) -> None:
    """A slow upgrade does not buy an unauthenticated peer more time: it is closed
    handshake_timeout_s after it connected, with HANDSHAKE_TIMEOUT."""

    def slow_peer(port: int) -> tuple[float, bytes]:
        started = time.monotonic()
        sock = _upgraded_socket_after(port, started, 1.5)  # late, within the 2 s an upgrade may take
        sock.settimeout(10)
        received = b""
        while b"HANDSHAKE_TIMEOUT" not in received:
            data = sock.recv(65536)
            if not data:
                break
            received += data
        took = time.monotonic() - started
        sock.close()
        return took, received

    async def main() -> tuple[float, bytes]:
        trainer, tcp, ws = await _start(tmp_path, auth_token="s3cret", handshake_timeout_s=2.0)
        result = await asyncio.to_thread(slow_peer, ws.port)
        await _stop(trainer, tcp, ws)
        return result

    took, received = asyncio.run(main())
    assert b"HANDSHAKE_TIMEOUT" in received, received[:300]
    assert took < 2.9, f"closed {took:.2f} s after it connected (deadline 2 s)"


def _upgraded_socket_after(port: int, started: float, delay_s: float) -> socket.socket:
    """A connection whose upgrade request is sent ``delay_s`` after it opened."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    time.sleep(max(0.0, delay_s - (time.monotonic() - started)))
    key = base64.b64encode(b"0123456789abcdef").decode()
    sock.sendall((f"GET /rllink HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    return sock


def test_invalid_utf8_is_a_websocket_error_in_text_and_an_rllink_error_in_binary(tmp_path: Path) -> None:
    """docs/protocol.md §3.4: a text message that is not UTF-8 closes with 1007; the same
    bytes in a binary message get ERROR INVALID_UTF8 and the connection goes on."""

    def peer(port: int) -> tuple[bytes, bytes]:
        binary = _upgraded_socket(port)
        bad = b'{"type":"PING","client_name":"\xff"}'
        binary.sendall(bytes([0x82, 0x80 | len(bad)]) + b"\0\0\0\0" + bad)
        answer = binary.recv(65536)
        binary.sendall(_frame(_ping()))
        answer += binary.recv(65536)
        binary.close()
        text = _upgraded_socket(port)
        text.sendall(_frame(bad))
        closed = read_until_closed(text)
        text.close()
        return answer, closed

    async def main() -> tuple[bytes, bytes]:
        trainer, tcp, ws = await _start(tmp_path)
        result = await asyncio.to_thread(peer, ws.port)
        await _stop(trainer, tcp, ws)
        return result

    answer, closed = asyncio.run(main())
    assert b"INVALID_UTF8" in answer and b"PONG" in answer, answer[:300]
    assert closed[:1] == b"\x88" and struct.unpack("!H", closed[2:4])[0] == 1007, closed[:40]
