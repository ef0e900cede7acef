"""Fuzz a real server with mutated and random frames while a real client trains.

A ``tether serve`` subprocess runs with its stderr captured; a real CartPole
SDK client process (tests/integration/stoppable_client.py) trains against it.
``--connections`` fuzzing threads each open a raw socket and send seeded
frames: valid requests mutated at the JSON level (a value replaced by a wrong
type, a huge or non-finite number, a lone surrogate, deep nesting; keys
dropped or added; lists cut or extended), protocol 1.4 tensors inline and in a
binary attachment (the attachment cut, extended or flipped), records of a Dict observation with an
action mask (a second module, "board"), protocol 1.5 records of a module with memory ("memory": their
state_in), protocol 1.6 logged steps (logged_runs), mutated at the byte level (flipped,
cut, inserted bytes under a correct header), random bodies, and now and then
a broken header (which must close the connection: the thread reconnects).

After every fuzz frame a thread sends a sentinel request that no fuzz frame
can produce (MAP_AGENTS for an agent id numbered per round); responses come
in order, so the fuzz frame's answer (if any) arrives before the sentinel's,
and an ERROR before it means the frame was refused. A round with neither the
sentinel's answer nor a closed connection within ``--hang-s`` is a hang.

At the end the client flushes and reports the env steps it delivered; the
server is stopped with SIGTERM and its summary's "env_steps" must equal the
client's steps plus the steps of the fuzz messages the server accepted.

Prints one JSON object::

    {"frames": 20000, "crashes": 0, "hangs": 0, "tracebacks": 0, "lost_steps": 0, ...}

crashes: the server exited on its own, answered INTERNAL, or a connection
handler failed ("connection from ... failed" on stderr); tracebacks:
"Traceback" or "Unhandled exception" in the server's stderr; lost_steps:
stored steps missing (positive) or unexplained extra steps (negative).
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import REPO_ROOT, free_port, install_cleanup, log, spawn, stop, wait_for_port  # noqa: E402

GOOD_EPISODE = {
    "obs": [[0.0, 0.1, 0.0, -0.1], [0.01, 0.2, 0.0, -0.2], [0.02, 0.3, 0.01, -0.3]],
    "actions": [0, 1],
    "rewards": [1.0, 1.0],
    "action_logp": [-0.7, -0.69],
    "action_dist_inputs": [[0.0, 0.01], [0.02, 0.0]],
    "is_terminated": True,
    "is_truncated": False,
}

CORPUS: list[dict[str, Any]] = [
    {"type": "PING"},
    {"type": "PING", "protocol_version": "1.3", "client_name": "fuzz"},
    {"type": "GET_CONFIG"},
    {"type": "GET_STATE"},
    {"type": "GET_STATE", "weights_seq_no": 0},
    {"type": "GET_STATE", "weights_seq_nos": {"default_policy": 0}},
    {"type": "EPISODES", "episodes": [GOOD_EPISODE]},
    {"type": "EPISODES_AND_GET_STATE", "episodes": [GOOD_EPISODE, dict(GOOD_EPISODE, episode_id="e2")]},
    {"type": "EPISODES_AND_GET_STATE", "weights_seq_no": 0,
     "episodes": [{"episode_id": "m1", "is_terminated": True, "is_truncated": False,
                   "agents": {"default_agent": dict(GOOD_EPISODE, module="default_policy", start_step=0)}}]},
    {"type": "MAP_AGENTS", "episode_id": "e", "agent_ids": ["a", "b"]},
    # Protocol 1.4: observations as a float32 tensor inline (base64, §10.9).
    {"type": "EPISODES", "episodes": [dict(GOOD_EPISODE, obs={
        "dtype": "float32", "shape": [3, 4],
        "b64": base64.b64encode(struct.pack("<12f", *sum(GOOD_EPISODE["obs"], []))).decode()})]},
]

#: Protocol 1.4: messages whose tensors lie in the body's binary attachment (§4.3), with that attachment.
ATTACHED: list[tuple[dict[str, Any], bytes]] = [
    ({"type": "EPISODES_AND_GET_STATE", "episodes": [dict(GOOD_EPISODE, episode_id="t1", obs={
        "dtype": "float32", "shape": [3, 4], "offset": 4})]},
     b"\xff\xfe\x00{" + struct.pack("<12f", *sum(GOOD_EPISODE["obs"], []))),
    ({"type": "EPISODES", "episodes": [{"episode_id": "t2", "is_terminated": True, "is_truncated": False, "agents": {
        "default_agent": dict(GOOD_EPISODE, module="default_policy", start_step=0,
                              obs={"dtype": "float32", "shape": [3, 4], "offset": 0})}}]},
     struct.pack("<12f", *sum(GOOD_EPISODE["obs"], []))),
]

#: Protocol 1.4: a module "board" whose observation is a Dict with an action mask (§8.6, §11.6), beside
#: the CartPole module the good client trains; its records carry an object of leaves. Each step's mask
#: allows one action, so its masked log-probability is 0 under any model (the server checks it).
BOARD_SPACE = {"type": "Dict", "spaces": {"action_mask": {"type": "Box", "shape": [3], "low": 0, "high": 1},
                                          "cells": {"type": "Box", "shape": [2, 2], "dtype": "uint8", "low": 0,
                                                    "high": 255}}}
BOARD_ENTRY = {"module": "board", "start_step": 0, "actions": [2, 0], "rewards": [0.0, 1.0],
               "action_logp": [0.0, 0.0], "is_terminated": True, "is_truncated": False,
               "obs": {"action_mask": [[0, 0, 1], [1, 0, 0], [0, 0, 0]], "cells": [[[1, 2], [3, 4]]] * 3}}
MODULES = {"default_policy": {"observation_space": {"type": "Box", "shape": [4], "low": "-inf", "high": "inf"},
                              "action_space": {"type": "Discrete", "n": 2}},
           "board": {"observation_space": BOARD_SPACE, "action_space": {"type": "Discrete", "n": 3}}}
#: Protocol 1.5: a module "memory" with a GRU of 4 units (§9.1, §12.1): its records carry state_in (§10.1).
MODULES["memory"] = {"observation_space": {"type": "Box", "shape": [2], "low": -1, "high": 1},
                     "action_space": {"type": "Discrete", "n": 2},
                     "model": {"recurrent": {"type": "gru", "size": 4, "seq_len": 2}}}
MEMORY_ENTRY = {"module": "memory", "start_step": 0, "obs": [[0.5, -0.5], [0.0, 1.0], [1.0, 0.0]], "actions": [1, 0],
                "rewards": [0.0, 1.0], "action_logp": [-0.7, -0.7], "is_terminated": True, "is_truncated": False,
                "state_in": {"state_in_h": [0.0, 0.25, -0.5, 1.0]}}
RULES = [{"agent_id": "default_agent", "module": "default_policy"}, {"pattern": "mem*", "module": "memory"},
         {"pattern": "*", "module": "board"}]
CORPUS += [
    {"type": "EPISODES_AND_GET_STATE", "episodes": [{"episode_id": "b1", "is_terminated": True, "is_truncated": False,
                                                     "agents": {"p1": BOARD_ENTRY}}]},
    {"type": "EPISODES", "episodes": [{"episode_id": "b2", "is_terminated": True, "is_truncated": False, "agents": {
        "p2": dict(BOARD_ENTRY, obs={"action_mask": BOARD_ENTRY["obs"]["action_mask"],
                                     "cells": {"dtype": "uint8", "shape": [3, 2, 2],
                                               "b64": base64.b64encode(bytes(range(12))).decode()}})}}]},
]
CORPUS += [  # (a recurrent module's behaviour logps are not rechecked at ingest, §13.6: the learner guards them)
    {"type": "EPISODES", "episodes": [{"episode_id": "r1", "is_terminated": True, "is_truncated": False,
                                       "agents": {"mem_1": MEMORY_ENTRY}}]},
    {"type": "EPISODES_AND_GET_STATE", "episodes": [{"episode_id": "r2", "is_terminated": False, "is_truncated": False,
                                                     "agents": {"mem_2": dict(MEMORY_ENTRY, is_terminated=False)}}]},
]
CORPUS += [  # protocol 1.6: logged steps (§10.1), in a memory entry and a masked board entry
    {"type": "EPISODES", "episodes": [  # (one agent per record: accepted_steps counts agent steps)
        {"episode_id": "l1", "is_terminated": True, "is_truncated": False,
         "agents": {"mem_3": dict(MEMORY_ENTRY, logged_runs=[[0, 1]])}},
        {"episode_id": "l2", "is_terminated": True, "is_truncated": False,
         "agents": {"p4": dict(BOARD_ENTRY, logged_runs=[[0, 2]])}}]},
]
ATTACHED += [
    ({"type": "EPISODES", "episodes": [{"episode_id": "b3", "is_terminated": True, "is_truncated": False, "agents": {
        "p3": dict(BOARD_ENTRY, obs={"action_mask": {"dtype": "float32", "shape": [3, 3], "offset": 12},
                                     "cells": {"dtype": "uint8", "shape": [3, 2, 2], "offset": 0}})}}]},
     bytes(range(12)) + struct.pack("<9f", 0, 0, 1, 1, 0, 0, 0, 0, 0)),
]

#: Raw JSON texts substituted for a value: wrong types, extremes, bad strings, nesting.
ODD_VALUES = [
    b"null", b"true", b"false", b"-1", b"0", b"1", b"2", b"1e308", b"-1e308", b"1e400", b"NaN", b"Infinity",
    b"-Infinity", b"1" * 401, b"-" + b"9" * 30, b"1.5", b'""', b'"x"', b'"\\ud800"', b'"\\u0000"', b"[]", b"{}",
    b"[[]]", b"[null]", b'{"a": 1}', b"[" * 1000 + b"]" * 1000, b'{"a":' * 500 + b"1" + b"}" * 500,
    b"[1,2,3,4,5,6,7,8,9]", b"[[0.0, 0.0, 0.0, 0.0]]", b'"' + b"y" * 5000 + b'"', b"[" + b"0," * 3000 + b"0]",
]
MARK = "\x00MARK\x00"


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, prefix + (i,))
    return out


def _get(value: Any, path: tuple) -> Any:
    for p in path:
        value = value[p]
    return value


def _set(root: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    _get(root, path[:-1])[path[-1]] = new
    return root


def mutate_json(rng: random.Random, message: dict) -> bytes:
    msg = json.loads(json.dumps(message))
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        paths = _paths(msg)
        path = rng.choice(paths[1:] or paths)
        parent = _get(msg, path[:-1]) if path else None
        op = rng.random()
        if op < 0.55:
            msg = _set(msg, path, MARK)
            break  # the marker is replaced by raw text below
        if op < 0.7 and isinstance(parent, dict):
            del parent[path[-1]]
        elif op < 0.8 and isinstance(parent, dict):
            parent[rng.choice(["type", "episodes", "extra", "weights_seq_no", "auth_token", "agents", "module"])] = \
                rng.choice([1, "EPISODES", None, [], {}, "PING", -5])
        elif op < 0.9:
            target = _get(msg, path)
            if isinstance(target, list) and target:
                if rng.random() < 0.5:
                    del target[rng.randrange(len(target)):]
                else:
                    target.extend(target[: rng.randint(1, len(target))])
        else:
            msg = _set(msg, path, rng.choice([0, -1, 1.5, "x", None, True, [], {}]))
    body = json.dumps(msg).encode()
    marker = json.dumps(MARK).encode()
    if marker in body:
        body = body.replace(marker, rng.choice(ODD_VALUES), 1)
    return body


def mutate_bytes(rng: random.Random, body: bytes) -> bytes:
    data = bytearray(body)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        pos = rng.randrange(len(data) + 1)
        if op < 0.4 and data:
            data[min(pos, len(data) - 1)] = rng.randrange(256)
        elif op < 0.7:
            del data[pos : pos + rng.randint(1, 8)]
        else:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return bytes(data)


def random_body(rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    return json.dumps({"type": rng.choice(["PING", "GET_STATE", "EPISODES", "X", 1]),
                       rng.choice(["episodes", "a"]): rng.choice([[], [1], {"b": [None]}, "s"])}).encode()


def next_frame(rng: random.Random) -> tuple[bytes, bool]:
    """(frame, whether its header is broken on purpose)."""
    r = rng.random()
    if r < 0.01:
        return rng.choice([b"0000001x{}", b"99999999{", b"{\"type\":\"PING\"}", b"-0000001{}"]), True
    if r < 0.15:  # a JSON text mutated or not, then its attachment mutated or not
        message, attachment = rng.choice(ATTACHED)
        text = mutate_json(rng, message) if rng.random() < 0.5 else json.dumps(message).encode()
        body = text + b"\0" + (mutate_bytes(rng, attachment) if rng.random() < 0.5 else attachment)
    elif r < 0.65:
        body = mutate_json(rng, rng.choice(CORPUS))
    elif r < 0.9:
        body = mutate_bytes(rng, json.dumps(rng.choice(CORPUS)).encode())
    else:
        body = random_body(rng)
    return b"%08d" % len(body) + body, False


def parse_like_server(body: bytes) -> tuple[str | None, Any]:
    """(type, message) as the server parses the body (its own decoder), or (None, None)."""
    from tether.protocol.messages import decode_message

    try:
        kind, message = decode_message(body)
        return kind.value, message
    except Exception:
        return None, None


def accepted_steps(message: Any) -> int:
    """Steps the server counts for an accepted EPISODES message (one per action of every record/agent)."""
    try:
        steps = 0
        for record in message["episodes"]:
            agents = record["agents"].values() if "agents" in record else [record]
            steps += sum(len(a["actions"]) for a in agents)
        return steps
    except Exception:
        return 0


class _Conn:
    def __init__(self, port: int, timeout: float) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = bytearray()

    def frames_until(self, sentinel: str) -> tuple[list[dict], bool]:
        """Responses up to the sentinel's answer; (responses before it, closed)."""
        got: list[dict] = []
        while True:
            while len(self.buf) >= 8:
                length = int(self.buf[:8])
                if len(self.buf) < 8 + length:
                    break
                body = bytes(self.buf[8 : 8 + length])
                del self.buf[: 8 + length]
                message = json.loads(body)
                if message.get("type") == "AGENT_MODULES" and sentinel in message.get("modules", {}):
                    return got, False
                got.append(message)
            try:
                data = self.sock.recv(1 << 16)
            except (ConnectionResetError, BrokenPipeError):
                return got, True
            if not data:
                return got, True
            self.buf += data


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.frames = self.hangs = self.internal = self.accepted_steps = self.refused = self.closed = 0


def sentinel_frame(name: str) -> bytes:
    body = json.dumps({"type": "MAP_AGENTS", "episode_id": "sentinel", "agent_ids": [name]}).encode()
    return b"%08d" % len(body) + body


def fuzz_thread(port: int, seed: int, deadline: float, max_frames: int, hang_s: float, stats: Stats) -> None:
    rng = random.Random(seed)
    conn = _Conn(port, hang_s)
    sent = 0
    while sent < max_frames and time.monotonic() < deadline:
        frame, broken = next_frame(rng)
        sent += 1
        try:
            sentinel = f"sentinel-{seed}-{sent}"
            conn.sock.sendall(frame + sentinel_frame(sentinel))
            got, closed = conn.frames_until(sentinel)
        except socket.timeout:
            with stats.lock:
                stats.hangs += 1
            got, closed = [], True
        except OSError:
            got, closed = [], True
        errors = [g for g in got if g.get("type") == "ERROR"]
        steps = 0
        kind, message = parse_like_server(frame[8:])
        if not closed and not errors and kind in ("EPISODES", "EPISODES_AND_GET_STATE"):
            steps = accepted_steps(message)
        with stats.lock:
            stats.frames += 1
            stats.accepted_steps += steps
            stats.internal += sum(1 for e in errors if e.get("code") == "INTERNAL")
            stats.refused += bool(errors)
            stats.closed += closed
        if closed:
            conn.sock.close()
            conn = _Conn(port, hang_s)
    conn.sock.close()


def run(args: argparse.Namespace) -> dict:
    port = args.port or free_port()
    with tempfile.TemporaryDirectory(prefix="tether-fuzz-") as tmp:
        tmp_path = Path(tmp)
        summary_file, stderr_file, stop_file = tmp_path / "summary.json", tmp_path / "stderr.txt", tmp_path / "stop"
        with open(stderr_file, "w") as err:
            server = spawn([sys.executable, "-m", "tether.server.cli", "serve", "--port", str(port),
                            "--train-batch-size", "1000", "--env-steps-per-sample", "250", "--seed", str(args.seed),
                            "--modules", json.dumps(MODULES), "--policy-mapping", json.dumps(RULES),
                            "--no-tensorboard", "--checkpoint-every", "0", "--logdir", str(tmp_path / "run"),
                            "--summary-file", str(summary_file), "--quiet"],
                           stdout=subprocess.DEVNULL, stderr=err)
        client = None
        try:
            wait_for_port(port, server, timeout_s=120)
            client = spawn([sys.executable, str(REPO_ROOT / "tests/integration/stoppable_client.py"), "--port",
                            str(port), "--stop-file", str(stop_file), "--seed", str(args.seed)],
                           stdout=subprocess.PIPE, text=True)
            stats = Stats()
            deadline = time.monotonic() + (args.seconds if args.seconds else 1e9)
            per_thread = -(-args.frames // args.connections) if args.frames else 1 << 62
            threads = [threading.Thread(target=fuzz_thread, daemon=True,
                                        args=(port, args.seed * 1000 + i, deadline, per_thread, args.hang_s, stats))
                       for i in range(args.connections)]
            started = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            fuzz_s = time.monotonic() - started
            server_died = server.poll() is not None
            stop_file.write_text("stop")
            out, _ = client.communicate(timeout=120)
            report = json.loads(out.strip().splitlines()[-1])
        finally:
            if client is not None:
                stop(client, grace_s=2.0)
            stop(server, grace_s=60.0)
        summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
        stderr_text = stderr_file.read_text()
    stored = summary.get("env_steps")
    expected = report["env_steps_sent"] + stats.accepted_steps
    return {
        "frames": stats.frames,
        "crashes": int(server_died) + stats.internal + stderr_text.count("] connection from "),
        "hangs": stats.hangs,
        "tracebacks": stderr_text.count("Traceback") + stderr_text.count("Unhandled exception"),
        "lost_steps": (expected - stored) if stored is not None else None,
        "seconds": round(fuzz_s, 2),
        "frames_per_s": round(stats.frames / fuzz_s, 1),
        "refused": stats.refused,
        "connections_closed": stats.closed,
        "good_client_steps": report["env_steps_sent"],
        "good_client_reconnects": report["reconnects"],
        "good_client_weights_seq_no": report["weights_seq_no"],
        "fuzz_steps_accepted": stats.accepted_steps,
        "server_env_steps": stored,
        "server_updates": summary.get("updates"),
        "seed": args.seed,
        "internal_errors": sorted({line[:300] for line in stderr_text.splitlines()
                                   if "internal error" in line or "] connection from " in line})[:10],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=None, help="fuzz for this long (default: until --frames)")
    parser.add_argument("--frames", type=int, default=None, help="fuzz frames to send in all (default: 20000 "
                        "when --seconds is not given)")
    parser.add_argument("--connections", type=int, default=4, help="fuzzing connections (default: 4)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the frames and the client (default: 0)")
    parser.add_argument("--hang-s", type=float, default=10.0,
                        help="a request neither answered nor closed within this is a hang (default: 10)")
    parser.add_argument("--port", type=int, default=None, help="server port (default: a free port)")
    args = parser.parse_args(argv)
    if args.seconds is None and args.frames is None:
        args.frames = 20_000
    install_cleanup()
    result = run(args)
    log(f"{result['frames']} frames in {result['seconds']} s")
    print(json.dumps(result), flush=True)
    ok = not (result["crashes"] or result["hangs"] or result["tracebacks"] or result["lost_steps"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
