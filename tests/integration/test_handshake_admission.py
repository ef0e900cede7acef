"""Nobody is locked out: connections that have not completed their handshake get a
bounded share of max_connections and a deadline, and wrong auth tokens are throttled
per address (docs/protocol.md §6.2, §6.4, §6.6).

Each test runs a real ``tether serve`` subprocess and real sockets, as an attacker
on the same host would.
"""

from __future__ import annotations

import collections
import socket
import threading
import time

from tether.sdk import TetherClient
from tether.protocol import FrameDecoder, decode_message, encode_frame

from .server_process import RawClient, ServerProcess, read_until_closed

TOKEN = "s3cret-token"


def ping(port: int, timeout: float = 5.0, source: str | None = None, **fields) -> dict | None:
    """One PING on a fresh connection (from ``source``, an address of this host): the reply,
    or None when the connection failed or was closed without one."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                        source_address=(source, 0) if source else None)
    except OSError:
        return None
    decoder = FrameDecoder()
    try:
        sock.sendall(encode_frame({"type": "PING", **fields}))
        while True:
            data = sock.recv(1 << 16)
            if not data:
                return None
            bodies = decoder.feed(data)
            if bodies:
                return decode_message(bodies[0])[1]
    except OSError:
        return None
    finally:
        sock.close()


def _can_bind(address: str) -> bool:
    try:
        with socket.socket() as sock:
            sock.bind((address, 0))
        return True
    except OSError:
        return False


def test_idle_sockets_do_not_lock_out_a_client_without_a_token(tmp_path) -> None:
    """40 silent sockets against max_connections 16: a client still gets PONG at once, and
    the silent ones are closed (oldest first when newer ones arrive, the rest at the
    handshake deadline) instead of holding every slot until client_timeout_s x 10."""
    with ServerProcess(tmp_path, "--max-connections", "16", "--handshake-timeout-s", "1.5") as server:
        opened = time.monotonic()
        idle = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(40)]
        time.sleep(0.3)
        start = time.monotonic()
        client = RawClient(server.port, timeout=5)
        reply = client.request({"type": "PING", "protocol_version": "1.3"})
        assert reply["type"] == "PONG", reply
        assert time.monotonic() - start < 2.0
        received = [read_until_closed(sock, 4.0) for sock in idle]
        closed_by = time.monotonic() - opened
        assert all(b'"HANDSHAKE_TIMEOUT"' in data for data in received), [d for d in received if
                                                                        b"HANDSHAKE_TIMEOUT" not in d][:3]
        assert closed_by < 1.5 + 3.0, f"the last silent socket was closed after {closed_by:.1f} s"
        # The client that completed its handshake is not bound by the deadline.
        assert client.request({"type": "PING"})["type"] == "PONG"
        client.close()
        for sock in idle:
            sock.close()


def test_reopened_silent_sockets_do_not_lock_out_clients_with_the_token(tmp_path) -> None:
    """An attacker without the token keeps reopening silent sockets (it used to get 57 of
    60 PINGs refused). Clients with the token still get PONG, and connections that
    authenticated before the attack are never closed to make room for newcomers."""
    with ServerProcess(tmp_path, "--auth-token", TOKEN, "--max-connections", "16") as server:
        established = [RawClient(server.port) for _ in range(6)]
        for client in established:
            assert client.request({"type": "PING", "auth_token": TOKEN})["type"] == "PONG"
        stop = threading.Event()
        opened = [0]

        def attack() -> None:
            held: collections.deque[socket.socket] = collections.deque()
            while not stop.is_set():
                try:
                    held.append(socket.create_connection(("127.0.0.1", server.port), timeout=2))
                except OSError:
                    continue
                opened[0] += 1
                if len(held) > 40:
                    held.popleft().close()
            for sock in held:
                sock.close()

        attacker = threading.Thread(target=attack, daemon=True)
        attacker.start()
        time.sleep(0.5)
        replies = [ping(server.port, auth_token=TOKEN) for _ in range(20)]
        stop.set()
        attacker.join(10)
        answered = sum(1 for reply in replies if reply is not None and reply["type"] == "PONG")
        assert opened[0] > 16, "the attack must have filled the server"
        assert answered >= 19, (answered, collections.Counter(str(r and r.get("code", r["type"])) for r in replies))
        for client in established:
            assert client.request({"type": "PING"})["type"] == "PONG", "an established connection was closed"
            client.close()


def test_all_established_still_refuses_newcomers(tmp_path) -> None:
    """With every slot held by authenticated clients, a newcomer is refused
    (TOO_MANY_CONNECTIONS) and none of them is closed for it."""
    with ServerProcess(tmp_path, "--auth-token", TOKEN, "--max-connections", "4") as server:
        held = [RawClient(server.port) for _ in range(4)]
        for client in held:
            assert client.request({"type": "PING", "auth_token": TOKEN})["type"] == "PONG"
        for _ in range(5):
            extra = RawClient(server.port)
            reply = extra.receive()
            assert reply["type"] == "ERROR" and reply["code"] == "TOO_MANY_CONNECTIONS", reply
            extra.close()
        for client in held:
            assert client.request({"type": "PING"})["type"] == "PONG"
            client.close()


def test_wrong_token_guesses_are_throttled_per_address(tmp_path) -> None:
    """A tight loop of wrong tokens used to get over a thousand guesses a second. Now an
    address that sent a few is refused (AUTH_THROTTLED) without its tokens being looked
    at; other addresses are not; the right token works again once the refusal ends, and
    the SDK rides a refusal out by reconnecting."""
    # A 3 s refusal: on a loaded machine the check right after the guessing loop must still fall inside it.
    with ServerProcess(tmp_path, "--auth-token", TOKEN, "--auth-backoff-max-s", "3") as server:
        guesses = refused = 0
        start = time.monotonic()
        while time.monotonic() - start < 2.0:
            reply = ping(server.port, auth_token="guess")
            if reply is not None and reply["code"] == "AUTH_FAILED":
                guesses += 1
            else:
                refused += 1
                assert reply is None or reply["code"] == "AUTH_THROTTLED", reply
        rate = guesses / (time.monotonic() - start)
        assert refused > 0 and rate < 10, f"{rate:.0f} guesses/s ({guesses} answered AUTH_FAILED, {refused} refused)"
        # Refused now: the address is blocked, the right token is not even looked at.
        reply = ping(server.port, auth_token=TOKEN)
        assert reply is None or reply["code"] == "AUTH_THROTTLED", reply
        # Another address of this host (Linux answers all of 127.0.0.0/8) is not affected.
        if _can_bind("127.0.0.2"):
            assert ping(server.port, source="127.0.0.2", auth_token=TOKEN)["type"] == "PONG"
        # The SDK treats the refusal like TOO_MANY_CONNECTIONS: it reconnects and gets in when it ends.
        start = time.monotonic()
        client = TetherClient("127.0.0.1", server.port, auth_token=TOKEN, reconnect_timeout_s=10)
        assert client.weights_seq_no == 0 and time.monotonic() - start < 8
        client.close()
        # A right token after the refusal ended works on a fresh connection.
        time.sleep(3.1)
        assert ping(server.port, auth_token=TOKEN)["type"] == "PONG"
