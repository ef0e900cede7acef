"""Large EPISODES bodies are parsed off the event loop: other clients' PINGs
are answered while the server decodes them, and their data is stored as before."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tether.protocol import decode_message

from .server_process import REPO, RawClient, ServerProcess, wait_until

EPISODE = {
    "obs": [[0.0, 0.1, 0.0, -0.1]] * 101, "actions": [0, 1] * 50, "rewards": [1.0] * 100,
    "action_logp": [-0.7] * 100, "is_terminated": True, "is_truncated": False,
}


def test_large_frames_are_validated_and_stored(tmp_path) -> None:
    """2 MiB messages (decoded in the worker process): a good one is stored, a bad one refused."""
    records = [dict(EPISODE, episode_id=f"e{i}") for i in range(300)]
    good = {"type": "EPISODES_AND_GET_STATE", "episodes": records}
    bad = {"type": "EPISODES_AND_GET_STATE", "episodes": records[:200] + [dict(EPISODE, rewards=[1.0])] + records}
    assert len(json.dumps(good)) > 1 << 20
    with ServerProcess(tmp_path, "--train-batch-size", str(10**9)) as server:
        client = RawClient(server.port)
        assert client.request(good)["type"] == "SET_STATE"
        reply = client.request(bad)
        assert reply["code"] == "EPISODE_LENGTH_MISMATCH" and "episodes[200]" in reply["message"], reply
        assert client.request({"type": "EPISODES", "episodes": "x" * (2 << 20)} )["code"] == "INVALID_FIELD"
        assert client.request({"type": "PING"})["type"] == "PONG"
        client.close()
        summary = server.stop()
    assert summary["env_steps"] == 300 * 100


def test_ping_is_not_held_up_by_another_clients_large_frames() -> None:
    """While one client sends 8 MiB frames, another's PING waits far less than one
    frame takes to ingest (inline decoding made it wait for about all of it).
    A ratio, measured in one run, so a busy machine does not fail it."""
    out = subprocess.run([sys.executable, str(REPO / "bench" / "ingest.py"), "--ping-probe", "--clients", "1",
                          "--chunk-steps", "80000", "--seconds", "3", "--warmup", "0.5"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["verified"] and result["frame_bytes"] > 7 << 20 and result["pings"] > 20
    assert result["ping_p99_ms"] < 0.3 * result["ack_latency_ms_p50"], result


def _children(pid: int) -> set[int]:
    """Live child processes of `pid` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc (Linux)")
def test_decode_workers_exit_when_the_server_is_killed(tmp_path) -> None:
    server = ServerProcess(tmp_path, "--env", "CartPole-v1").start()
    try:
        assert server.proc is not None
        assert wait_until(lambda: len(_children(server.proc.pid)) >= 1, timeout=30), "no decode worker started"
        workers = _children(server.proc.pid)
    finally:
        server.kill()  # SIGKILL: the server cannot shut its pool down
    assert wait_until(lambda: not any(map(_alive, workers)), timeout=10), (
        f"decode workers {sorted(p for p in workers if _alive(p))} outlived the killed server")


def _ping_latencies(port: int, stop: threading.Event, out: list[float]) -> None:
    client = RawClient(port)
    while not stop.is_set():
        start = time.perf_counter()
        assert client.request({"type": "PING"})["type"] == "PONG"
        out.append(time.perf_counter() - start)
        time.sleep(0.002)
    client.close()


def test_deeply_nested_large_body_is_refused_in_the_worker(tmp_path) -> None:
    """A large body with an unknown field nested 900 deep is refused (INVALID_JSON, §4.2)
    before it is parsed, in the worker. Its parsed form could not be sent back from
    the worker, so it used to be parsed again on the event loop: meanwhile another
    client's PING waited about as long as that parse."""
    records = [dict(EPISODE, episode_id=f"e{i}") for i in range(2000)]
    deep = {"type": "EPISODES_AND_GET_STATE", "episodes": records, "x": "@"}
    body = json.dumps(deep).encode().replace(b'"@"', b"[" * 900 + b"]" * 900)
    assert len(body) > 6 << 20  # always decoded in a worker (1 MiB and up)
    start = time.perf_counter()
    decode_message(body.replace(b"[" * 900 + b"]" * 900, b"0"))
    inline_s = time.perf_counter() - start  # what the loop spent per body when it parsed it itself
    latencies: list[float] = []
    with ServerProcess(tmp_path, "--train-batch-size", str(10**9)) as server:
        client = RawClient(server.port, timeout=60)
        assert client.request({"type": "PING"})["type"] == "PONG"
        stop = threading.Event()
        pinger = threading.Thread(target=_ping_latencies, args=(server.port, stop, latencies))
        pinger.start()
        try:
            for _ in range(6):
                reply = _request_raw(client, body)
                assert reply["type"] == "ERROR" and reply["code"] == "INVALID_JSON", reply
                assert "64" in reply["message"] and "request" not in reply
        finally:
            stop.set()
            pinger.join(30)
        client.close()
        summary = server.stop()
    assert summary["env_steps"] == 0
    assert not any("decode worker failed" in line for line in server.lines), "\n".join(server.lines)
    worst = max(latencies)
    print(f"\nPING while deep bodies are refused: {len(latencies)} pings, median "
          f"{1e3 * sorted(latencies)[len(latencies) // 2]:.1f} ms, max {1e3 * worst:.1f} ms; "
          f"inline decode of one body {1e3 * inline_s:.0f} ms")
    assert len(latencies) >= 10 and worst < 0.5 * inline_s, (worst, inline_s)


def _request_raw(client: RawClient, body: bytes) -> dict:
    client.send_bytes(b"%08d" % len(body) + body)
    return client.receive()
