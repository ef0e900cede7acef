"""The console's page and websocket feed, against a real training server with a
real client (the Python SDK playing gymnasium's CartPole in a thread), read
with a real websocket client (docs/console.md)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import gymnasium as gym
import pytest
from websockets.asyncio.client import connect

from tether.protocol.messages import PROTOCOL_VERSION
from tether.sdk import TetherClient, run_env

from ..integration.server_process import RawClient, ServerProcess

CONSOLE = re.compile(r"\[tether\] console: http://([\d.]+):(\d+)/\?token=(\S+)")


def console_address(server: ServerProcess, timeout: float = 10.0) -> tuple[int, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(server.lines):
            match = CONSOLE.search(line)
            if match:
                return int(match.group(2)), match.group(3)
        time.sleep(0.05)
    raise AssertionError("no console line:\n" + "\n".join(server.lines))


def play(port: int, stop: threading.Event, seen: dict | None = None) -> None:
    """A real client training on CartPole until told to stop; ``seen["env_params"]`` is the parameter
    set it holds (protocol §19), updated every 500 steps."""
    client = TetherClient("127.0.0.1", port, client_name="console-test-cartpole", seed=0)
    env = gym.make("CartPole-v1")
    try:
        while not stop.is_set():
            run_env(client, env, max_steps=500)
            if seen is not None:
                seen["env_params"] = client.env_params
    finally:
        client.close()


async def receive(ws, kind: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), max(0.1, deadline - time.monotonic())))
        if message["type"] == kind:
            return message


async def until(ws, predicate, timeout: float = 30.0) -> dict:
    """Ticks until one satisfies ``predicate``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tick = await receive(ws, "tick", timeout=deadline - time.monotonic())
        if predicate(tick):
            return tick
    raise AssertionError("no tick satisfied the condition")


@pytest.fixture()
def training(tmp_path: Path):
    server = ServerProcess(tmp_path, "--env", "CartPole-v1", "--console-port", "0", "--seed", "0",
                           "--env-steps-per-sample", "200", "--train-batch-size", "1000", "--checkpoint-every", "0",
                           "--tensorboard").start()
    stop = threading.Event()
    player = threading.Thread(target=play, args=(server.port, stop), daemon=True)
    player.start()
    try:
        yield server
    finally:
        stop.set()
        player.join(timeout=30)
        server.kill()


def test_the_feed_shows_the_run_its_client_and_a_bad_request_live(training: ServerProcess) -> None:
    port, token = console_address(training)

    async def scenario() -> None:
        async with connect(f"ws://127.0.0.1:{port}/feed?token={token}") as ws:
            hello = await receive(ws, "hello")
            assert hello["version"] == 1 and set(hello["run"]["modules"]) == {"default_policy"}
            assert hello["run"]["modules"]["default_policy"]["action_space"]["type"] == "Discrete"
            # Ticks come once a second.
            first = await receive(ws, "tick")
            started = time.monotonic()
            for _ in range(3):
                await receive(ws, "tick")
            assert 1.5 < time.monotonic() - started < 4.5
            # The client is in the table, with the weights version it acted with, once it has sent batches.
            tick = await until(ws, lambda t: any(c["client_name"] == "console-test-cartpole" and c["batches"] > 0
                                                 for c in t["clients"]))
            row = next(c for c in tick["clients"] if c["client_name"] == "console-test-cartpole")
            assert row["connected"] and row["protocol_version"] == PROTOCOL_VERSION and "default_policy" in row["weights"]
            assert row["sdk"] == "tether-python/0.1.0"
            assert row["env_steps"] > 0 and row["staleness"]["default_policy"] >= 0
            # Learning metrics arrive: episodes, updates, the learner's losses.
            tick = await until(ws, lambda t: (t["values"].get("charts/updates") or 0) >= 1
                               and t["values"].get("module/default_policy/entropy") is not None)
            assert tick["values"]["episode/return_mean"] > 0 and tick["episodes"]["default_policy"]
            # A finished episode, asked for, step by step: CartPole's rewards are 1 a step; its actions 0 or 1.
            last = tick["episodes"]["default_policy"][0]
            assert last["agents"] == last["agents_shown"] == 1 and "rewards" not in json.dumps(tick["episodes"])
            await ws.send(json.dumps({"type": "episode", "module": "default_policy", "id": last["id"]}))
            answer = await receive(ws, "episode")
            assert answer["id"] == last["id"] and answer["return"] == last["return"]
            steps = next(iter(answer["agent_steps"].values()))
            assert last["length"] == steps["steps"] == len(steps["rewards"]) == len(steps["actions"]) > 0
            assert sum(steps["rewards"]) == last["return"] and set(steps["actions"]) <= {0, 1}
            assert tick["actions"]["default_policy"]["type"] == "Discrete" and set(tick["actions"]["default_policy"]["counts"]) <= {"0", "1"}
            assert tick["values"]["health/loop_lag_ms"] is not None and tick["values"]["health/rss_mb"] > 0
            assert tick["values"]["module/default_policy/update_s"] > 0 and tick["values"]["module/default_policy/export_s"] > 0
            assert tick["values"]["module/default_policy/return_min"] <= tick["values"]["module/default_policy/return_max"]
            assert first["t"] < tick["t"]
            # A bad request from another client appears in the error log with its code.
            bad = RawClient(training.port)
            bad.request({"type": "PING", "protocol_version": "1.3", "client_name": "bad-one"})
            answer = bad.request({"type": "EPISODES", "episodes": "not a list"})
            assert answer["type"] == "ERROR"
            tick = await until(ws, lambda t: any(e["kind"] == "error" and e["code"] == answer["code"] for e in t["errors"]),
                               timeout=10)
            entry = next(e for e in tick["errors"] if e["kind"] == "error")
            assert entry["client"]["name"] == "bad-one" and entry["request"] == "EPISODES" and entry["message"]
            bad.sock.close()

        # A browser that reconnects gets the whole history again.
        async with connect(f"ws://127.0.0.1:{port}/feed?token={token}") as ws:
            hello = await receive(ws, "hello")
            returns = hello["history"]["episode/return_mean"]
            assert len(returns["t"]) >= 3 and len(returns["t"]) == len(returns["v"])
            assert any(e["kind"] == "error" for e in hello["errors"])

    asyncio.run(scenario())


def test_controls_need_the_token_and_act(training: ServerProcess) -> None:
    port, token = console_address(training)

    async def scenario() -> None:
        async with connect(f"ws://127.0.0.1:{port}/feed") as ws:  # no auth token on this server: viewing is open
            await receive(ws, "hello")
            await ws.send(json.dumps({"type": "control", "action": "pause"}))
            refused = await receive(ws, "control_result")
            assert refused["ok"] is False and "token" in refused["error"]
            await ws.send(json.dumps({"type": "control", "token": "wrong", "action": "stop"}))
            assert (await receive(ws, "control_result"))["ok"] is False

            await until(ws, lambda t: (t["values"].get("charts/updates") or 0) >= 1)
            await ws.send(json.dumps({"type": "control", "token": token, "action": "pause"}))
            assert (await receive(ws, "control_result"))["ok"] is True
            tick = await until(ws, lambda t: t["paused"])
            updates = tick["values"]["charts/updates"]
            # Paused: no update starts for several seconds though the client keeps sending.
            for _ in range(4):
                tick = await receive(ws, "tick")
            assert tick["values"]["charts/updates"] <= updates + 1  # one already running may finish
            paused_at = tick["values"]["charts/updates"]
            await ws.send(json.dumps({"type": "control", "token": token, "action": "resume"}))
            assert (await receive(ws, "control_result"))["ok"] is True
            await until(ws, lambda t: not t["paused"] and t["values"]["charts/updates"] > paused_at)

            await ws.send(json.dumps({"type": "control", "token": token, "action": "set_lr", "module": "default_policy",
                                      "value": 0.0001}))
            assert (await receive(ws, "control_result"))["value"] == 0.0001
            await until(ws, lambda t: t["values"]["module/default_policy/lr"] == 0.0001)
            await ws.send(json.dumps({"type": "control", "token": token, "action": "set_ent_coef", "module": "nope",
                                      "value": 0.1}))
            assert "no module" in (await receive(ws, "control_result"))["error"]
            await ws.send(json.dumps({"type": "control", "token": token, "action": "checkpoint"}))
            saved = await receive(ws, "control_result", timeout=30)
            assert saved["ok"] and Path(saved["path"]).is_file()
            # Every control is in the event log (a browser connecting now gets it all).
            async with connect(f"ws://127.0.0.1:{port}/feed") as again:
                log = (await receive(again, "hello"))["errors"]
            kinds = [(e["kind"], e.get("action")) for e in log]
            assert ("control_refused", "pause") in kinds and ("control", "pause") in kinds
            assert ("control", "resume") in kinds and ("control", "set_lr") in kinds and ("control", "checkpoint") in kinds

            await ws.send(json.dumps({"type": "control", "token": token, "action": "stop"}))
            assert (await receive(ws, "control_result"))["ok"] is True

    asyncio.run(scenario())
    assert training.proc is not None and training.proc.wait(30) == 0  # the server stopped, cleanly


def test_the_page_and_its_files_are_served_and_nothing_else(training: ServerProcess) -> None:
    port, _ = console_address(training)
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10)
    html = page.read().decode()
    assert page.headers["Content-Type"].startswith("text/html") and "vendor/uPlot.iife.min.js" in html
    script = urllib.request.urlopen(f"http://127.0.0.1:{port}/vendor/uPlot.iife.min.js", timeout=10)
    assert script.headers["Content-Type"].startswith("text/javascript") and b"uPlot" in script.read()
    for path in ("/../server.py", "/%2e%2e/state.py", "/nope.js", "/vendor/../../history.py", "/" + "a" * 5000 + ".js",
                 "/%00.js"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10)
        assert refused.value.code == 404, path


def test_the_feed_refuses_other_sites_and_more_than_its_browsers(training: ServerProcess) -> None:
    from tether.server.console.server import MAX_BROWSERS  # the limit the server applies

    port, token = console_address(training)

    async def scenario() -> None:
        # A page of another site (or a DNS-rebound name) opening the feed: refused before the handshake.
        for origin in ("http://evil.example", f"http://evil.example:{port}", "http://127.0.0.1:1",
                       f"http://rebound.example:{port}", "null", "http://[", f"http://[::1:{port}"):
            with pytest.raises(Exception) as refused:
                async with connect(f"ws://127.0.0.1:{port}/feed", origin=origin):
                    pass
            assert "403" in str(refused.value), origin
        # A Host that is no address (a bracket left open) is refused too, not an internal error.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET /feed HTTP/1.1\r\nHost: [\r\nOrigin: http://127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                     f"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     f"Sec-WebSocket-Version: 13\r\n\r\n".encode())
        status = await asyncio.wait_for(reader.readline(), 10)
        assert status.startswith(b"HTTP/1.1 403"), status
        writer.close()
        # The console's own page, by either loopback name, is welcome.
        for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
            async with connect(f"ws://127.0.0.1:{port}/feed", origin=origin) as ws:
                assert (await receive(ws, "hello"))["type"] == "hello"
        # A token that is not valid Unicode (a lone surrogate) is a refused control, not a dropped feed.
        async with connect(f"ws://127.0.0.1:{port}/feed") as ws:
            await receive(ws, "hello")
            await ws.send('{"type": "control", "token": "\\ud800", "action": "pause"}')
            result = await receive(ws, "control_result")
            assert result["ok"] is False and "token" in result["error"], result
            # Malformed controls are refused answers, the feed goes on: nesting too deep for the
            # parser (no token needed), an integer too large for a float, a module that is no name.
            await ws.send("[" * 20000 + "]" * 20000)
            assert (await receive(ws, "control_result"))["error"] == "not JSON"
            for bad in ({"action": "set_lr", "module": "default_policy", "value": 10**400},
                        {"action": "set_lr", "module": "default_policy", "value": 5.0},
                        {"action": "set_ent_coef", "module": "default_policy", "value": -0.1},
                        {"action": "set_lr", "module": [], "value": 0.001},
                        {"action": "set_ent_coef", "module": {}, "value": 0.01}):
                await ws.send(json.dumps({"type": "control", "token": token, **bad}))
                refused = await receive(ws, "control_result")
                assert refused["ok"] is False, (bad, refused)
        # Browsers beyond the limit get 503; one leaving makes room.
        watching = [await connect(f"ws://127.0.0.1:{port}/feed") for _ in range(MAX_BROWSERS)]
        try:
            with pytest.raises(Exception) as full:
                async with connect(f"ws://127.0.0.1:{port}/feed"):
                    pass
            assert "503" in str(full.value)
            await watching.pop().close()
            for _ in range(100):
                try:
                    async with connect(f"ws://127.0.0.1:{port}/feed") as ws:
                        assert (await receive(ws, "hello"))["type"] == "hello"
                    break
                except Exception:  # the server may not have seen the close yet
                    await asyncio.sleep(0.05)
            else:
                raise AssertionError("no room after a browser left")
        finally:
            for ws in watching:
                await ws.close()

    asyncio.run(scenario())


def test_with_an_auth_token_the_console_needs_it(tmp_path: Path) -> None:
    with ServerProcess(tmp_path, "--env", "CartPole-v1", "--console-port", "0", "--auth-token", "s3cret") as server:
        # The address is printed without the token: the operator's secret stays out of the logs.
        deadline = time.monotonic() + 10
        while not any("[tether] console:" in line for line in server.lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        line = next(line for line in server.lines if "[tether] console:" in line)
        assert "s3cret" not in "\n".join(server.lines) and "?token=" not in line.split()[2], line
        port = int(re.search(r"http://[\d.]+:(\d+)/", line).group(1))
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10)
        assert refused.value.code == 401
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/?token=s3cret", timeout=10).status == 200

        async def scenario() -> None:
            with pytest.raises(Exception) as failed:
                async with connect(f"ws://127.0.0.1:{port}/feed"):
                    pass
            assert "401" in str(failed.value)
            async with connect(f"ws://127.0.0.1:{port}/feed?token=s3cret") as ws:
                assert (await receive(ws, "hello"))["type"] == "hello"

        asyncio.run(scenario())


def test_a_finished_run_is_shown_read_only_from_its_log(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, "--env", "CartPole-v1", "--console-port", "0", "--seed", "0",
                           "--env-steps-per-sample", "200", "--train-batch-size", "1000").start()
    stop = threading.Event()
    player = threading.Thread(target=play, args=(server.port, stop), daemon=True)
    player.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("update    2 " in line for line in server.lines):
            time.sleep(0.2)
        time.sleep(1.5)  # a tick or two after the update
    finally:
        stop.set()
        player.join(timeout=30)
        server.stop()
    saved = server.logdir / "console.json"
    assert saved.is_file()
    viewer = subprocess.Popen([sys.executable, "-m", "tether.server.cli", "console", "--logdir", str(server.logdir),
                               "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert viewer.stdout is not None
        line = viewer.stdout.readline()
        port = int(re.search(r"http://[\d.]+:(\d+)/", line).group(1))
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).status == 200

        async def scenario() -> None:
            async with connect(f"ws://127.0.0.1:{port}/feed") as ws:
                hello = await receive(ws, "hello")
                assert hello["read_only"] is True
                assert max(v for v in hello["history"]["charts/updates"]["v"] if v is not None) >= 2
                assert hello["episodes"]["default_policy"] and any(c["client_name"] == "console-test-cartpole"
                                                                   for c in hello["clients"])
                assert "episode_details" not in hello  # sent when asked for, one episode at a time
                last = hello["episodes"]["default_policy"][0]
                await ws.send(json.dumps({"type": "episode", "module": "default_policy", "id": last["id"]}))
                answer = await receive(ws, "episode")
                steps = next(iter(answer["agent_steps"].values()))
                assert answer["length"] == len(steps["rewards"]) > 0 and sum(steps["rewards"]) == last["return"]
                await ws.send(json.dumps({"type": "episode", "module": "default_policy", "id": -1}))
                assert "no episode" in (await receive(ws, "episode"))["error"]
                await ws.send(json.dumps({"type": "control", "token": "x", "action": "pause"}))
                assert "read-only" in (await receive(ws, "control_result"))["error"]
                with pytest.raises(TimeoutError):  # a finished run has no ticks
                    await receive(ws, "tick", timeout=2.5)

        asyncio.run(scenario())
    finally:
        viewer.kill()
        viewer.wait()


def test_a_self_play_run_shows_its_ratings(tmp_path: Path) -> None:
    """A self-play run (docs/self_play.md): its modules' Elo ratings and the latest snapshot's reach
    the console with the other metrics, and move once games against snapshots are rated."""
    repo = Path(__file__).resolve().parents[2]
    server = ServerProcess(tmp_path, "--config", str(repo / "examples/configs/tictactoe_selfplay.toml"),
                           "--console-port", "0", "--seed", "0", "--checkpoint-every", "0").start()
    client = subprocess.Popen([sys.executable, str(repo / "examples/selfplay_client.py"), "--port", str(server.port)],
                              cwd=repo, stdout=subprocess.DEVNULL)
    try:
        port, token = console_address(server)

        async def scenario() -> None:
            async with connect(f"ws://127.0.0.1:{port}/feed?token={token}") as ws:
                hello = await receive(ws, "hello")
                assert hello["run"]["modules"]["player@0"]["snapshot_of"] == "player"
                tick = await until(ws, lambda t: (t["values"].get("charts/updates") or 0) >= 1
                                   and t["values"].get("self_play/games_rated"), timeout=60)
                values = tick["values"]
                assert values["self_play/player/rating"] != 1200.0  # rated games moved it
                assert values["self_play/player/latest_snapshot_rating"] > 0
                assert values["self_play/player/snapshots"] >= 1

        asyncio.run(scenario())
    finally:
        client.kill()
        server.kill()
