"""Server ingest benchmark: env steps per second the server decodes, validates
and stores, with the learner off.

A server subprocess runs with a train batch so large it never updates
(``--train-batch-size 10**12``) and ``--force-on-policy`` (so ``action_logp``
is required and validated). Each of ``--clients`` worker processes builds ONE
CartPole-shaped message (obs of 4 floats from real CartPole-v1 dynamics,
Discrete(2) actions, rewards, action_logp, 2 action_dist_inputs per step;
whole episodes adding up to ``--chunk-steps`` env steps), encodes it once with
``tether.protocol.encode_frame`` and then sends those same bytes again and
again, so the figure measures the server and not the client.

Only steps the server has acknowledged count. In the default mode
(``episodes_and_get_state``) every message is an EPISODES_AND_GET_STATE whose
``weights_seq_no`` equals the server's current one, so the server answers each
with a small SET_STATE after it has validated and stored the message; a
worker has one message in flight at a time. In ``episodes`` mode workers send
``--pipeline`` EPISODES messages back to back, then one GET_STATE round trip;
the SET_STATE answer (the server handles a connection's requests in order)
acknowledges them all. ``env_steps_per_s`` is the steps acknowledged inside
the measurement window divided by its length, after a warm-up. At the end the
server is stopped and its ``--summary-file`` "env_steps" must equal every
acknowledged step (``verified``).

With ``--ping-probe`` one more connection PINGs every 10 ms during the window
and the result gains "ping_p50_ms", "ping_p99_ms" and "ping_max_ms": how long
another client waits while the server ingests (for 16 MiB frames:
``--ping-probe --clients 1 --chunk-steps 160000``; target p99 <= 50 ms).

With ``--obs-shape 84,84,4 --obs-dtype uint8`` the observations are images (a byte box, protocol
1.4): random episodes of 100 steps whose observations are random images, sent as one uint8 tensor
per record with its bytes in the body's binary attachment (§4.3, §10.9). The same run is repeated
with the tensors inline as base64 and with the same images written as JSON numbers; the result gains
``b64_env_steps_per_s`` and ``json_env_steps_per_s``, ``bytes_per_env_step`` (and ``b64_`` and
``json_`` ones: frame bytes per step of each encoding) and ``binary_vs_json`` (the ratio of the rates).
``--chunk-steps`` defaults to 200 there (a 7.5 MB frame as tensors, 22 MB as numbers).

Prints one JSON object on stdout, e.g.::

    {"env_steps_per_s": 123456.0, "clients": 8, "chunk_steps": 4000, "seconds": 5.0, "messages": 154, ...}
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (REPO_ROOT, HostLoad, add_quiet_argument, free_port, install_cleanup, log, spawn,  # noqa: E402
                     stop, wait_for_port, wait_until_quiet)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8, help="client processes (default: 8)")
    parser.add_argument("--chunk-steps", type=int, default=4000, help="env steps per message (default: 4000)")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the measurement window (default: 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of sending before the window (default: 1)")
    parser.add_argument("--mode", choices=("episodes_and_get_state", "episodes"), default="episodes_and_get_state",
                        help="how steps are acknowledged (default: episodes_and_get_state)")
    parser.add_argument("--pipeline", type=int, default=4,
                        help="in 'episodes' mode: EPISODES messages per GET_STATE round trip (default: 4)")
    parser.add_argument("--port", type=int, default=None, help="server port (default: a free port)")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds (default: 120)")
    parser.add_argument("--profile", metavar="FILE", default=None,
                        help="run the server under cProfile and write its stats to FILE")
    parser.add_argument("--agents", type=int, default=0,
                        help="multi-agent case: agents per episode record (e.g. 16); prints agent_steps_per_s "
                             "(--chunk-steps then counts agent steps per message) (default: 0, single-agent)")
    parser.add_argument("--ping-probe", action="store_true",
                        help="one more connection PINGs every 10 ms during the window and the result gains "
                             "ping_p50_ms, ping_p99_ms and ping_max_ms (how long other clients wait while the "
                             "server ingests; try with --clients 1 --chunk-steps 160000 for 16 MiB frames)")
    parser.add_argument("--no-pool-journal", action="store_true",
                        help="run the server without its pool journal (to measure what the journal costs)")
    parser.add_argument("--obs-shape", default=None,
                        help="image observations of this shape, e.g. 84,84,4 (HWC), instead of CartPole's")
    parser.add_argument("--obs-dtype", choices=("uint8", "float32"), default="uint8",
                        help="with --obs-shape: the observation space's dtype (default: uint8)")
    parser.add_argument("--obs-encoding", choices=("tensor", "b64", "json"), default="tensor", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-seed", type=int, default=0, help=argparse.SUPPRESS)
    add_quiet_argument(parser)
    args = parser.parse_args(argv)
    if args.obs_shape is not None:
        args.obs_shape = tuple(int(d) for d in args.obs_shape.split(","))
        if "--chunk-steps" not in (argv if argv is not None else sys.argv):
            args.chunk_steps = 200
    return args


def observation_space(args: argparse.Namespace) -> dict:
    """The server's observation space in image mode."""
    return {"type": "Box", "shape": list(args.obs_shape), "dtype": args.obs_dtype, "low": 0, "high": 255}


def build_image_message(args: argparse.Namespace, seed: int, weights_seq_no: int, kind: str,
                        policy) -> tuple[bytes, int, int]:
    """One frame of random episodes (100 steps each) of random images; obs as tensors or JSON numbers."""
    import numpy as np

    from tether.protocol import encode_episode, encode_frame
    from tether.protocol.tensors import encode_tensor, encode_tensor_at

    rng = np.random.default_rng(seed)
    parts: list[bytes] = []
    offset = 0
    dtype = np.uint8 if args.obs_dtype == "uint8" else np.float32
    records, steps = [], 0
    while steps < args.chunk_steps:
        length = min(100, args.chunk_steps - steps)
        obs = rng.integers(0, 256, (length + 1, *args.obs_shape)).astype(dtype)
        logits = policy.dist_inputs(obs[:-1]).astype(np.float64)
        actions = rng.integers(0, 2, length)
        top = logits.max(axis=1, keepdims=True)
        logp = logits[np.arange(length), actions] - (top[:, 0] + np.log(np.exp(logits - top).sum(axis=1)))
        record = encode_episode(
            obs=[], actions=actions.tolist(), rewards=[0.0] * length, action_logp=logp.tolist(),
            action_dist_inputs=logits.tolist(), is_terminated=True, is_truncated=False,
            episode_id=f"bench-{seed}-{len(records)}")
        if args.obs_encoding == "tensor":  # in the body's binary attachment (§4.3)
            record["obs"] = encode_tensor_at(obs, offset)
            parts.append(obs.tobytes())
            offset += obs.nbytes
        elif args.obs_encoding == "b64":
            record["obs"] = encode_tensor(obs)
        else:
            record["obs"] = obs.tolist()
        records.append(record)
        steps += length
    message = {"type": kind, "episodes": records, "env_steps": steps, "weights_seq_no": weights_seq_no}
    return encode_frame(message, b"".join(parts) if parts else None), steps, len(records)


# -- the message ------------------------------------------------------------------


def build_multi_agent_message(chunk_steps: int, agents: int, seed: int, weights_seq_no: int, kind: str,
                              policy=None) -> tuple[bytes, int, int]:
    """One encoded frame of multi-agent records (protocol 1.2): each record is an
    episode in which ``agents`` agents, all mapped to module "m", each play a
    CartPole episode of at most chunk_steps / agents steps. Returns (frame, agent steps, records)."""
    import json as _json

    from tether.protocol import encode_frame

    per_agent = max(1, chunk_steps // agents)
    records, steps, k = [], 0, 0
    while steps < chunk_steps:
        entries = {}
        for j in range(agents):
            frame, agent_steps, _ = build_message(per_agent, seed * 100_003 + k * agents + j, 0, kind, policy)
            single = _json.loads(frame[8:])["episodes"][0]
            single.pop("episode_id", None)
            single.update(module="m", start_step=0)
            entries[f"agent_{j}"] = single
            steps += len(single["actions"])
        records.append({"episode_id": f"bench-ma-{seed}-{k}", "is_terminated": True, "is_truncated": False,
                        "agents": entries})
        k += 1
    message = {"type": kind, "episodes": records, "env_steps": steps, "weights_seq_nos": {"m": weights_seq_no}}
    return encode_frame(message), steps, len(records)


def build_message(chunk_steps: int, seed: int, weights_seq_no: int, kind: str, policy=None) -> tuple[bytes, int, int]:
    """One encoded EPISODES(_AND_GET_STATE) frame of whole CartPole episodes.

    With ``policy`` (the served model) action_logp and action_dist_inputs are
    the model's, as the server's behaviour-logp check requires; actions still
    come from the heuristic.

    Returns (frame bytes, env steps, episodes). Every record is terminated or
    truncated, so re-sending the same ids never leaves episodes open on the server.
    """
    import gymnasium as gym
    import numpy as np

    from tether.protocol import encode_episode, encode_frame

    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    records = []
    steps = 0
    while steps < chunk_steps:
        obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
        ep_obs, actions, rewards, logps, dists = [obs], [], [], [], []
        terminated = truncated = False
        while not (terminated or truncated) and steps < chunk_steps:
            # A balancing heuristic with 10% noise gives long, realistic episodes.
            logits = np.array([-(obs[2] + 0.5 * obs[3]), obs[2] + 0.5 * obs[3]], dtype=np.float32) * 5.0
            action = int(logits[1] > logits[0]) if rng.random() > 0.1 else int(rng.integers(2))
            if policy is not None:
                logits = policy.dist_inputs(np.asarray(obs, np.float32)[None])[0]
            top = float(logits.max())
            logp = float(logits[action]) - top - float(np.log(np.exp(logits - top).sum()))
            obs, reward, terminated, truncated, _ = env.step(action)
            ep_obs.append(obs)
            actions.append(action)
            rewards.append(float(reward))
            logps.append(logp)
            dists.append(logits)
            steps += 1
        cut = not (terminated or truncated)
        records.append(encode_episode(
            obs=ep_obs, actions=actions, rewards=rewards, action_logp=logps, action_dist_inputs=dists,
            is_terminated=bool(terminated), is_truncated=bool(truncated or cut),
            episode_id=f"bench-{seed}-{len(records)}",
        ))
    message = {"type": kind, "episodes": records, "env_steps": steps, "weights_seq_no": weights_seq_no}
    return encode_frame(message), steps, len(records)


# -- worker process ---------------------------------------------------------------


class _Reader:
    """Reads whole frames from a blocking socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def frame(self) -> dict:
        import orjson

        while True:
            if len(self.buf) >= 8:
                length = int(self.buf[:8])
                if len(self.buf) >= 8 + length:
                    body = bytes(self.buf[8 : 8 + length])
                    del self.buf[: 8 + length]
                    return orjson.loads(body)
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("server closed the connection")
            self.buf += data


def _expect(reply: dict, kind: str) -> dict:
    if reply.get("type") != kind:
        raise RuntimeError(f"expected {kind}, server answered {reply}")
    return reply


def worker(args: argparse.Namespace) -> int:
    """One client: build the frame, report ready, send until the window closes."""
    from tether.protocol import PROTOCOL_VERSION, encode_frame

    sock = socket.create_connection(("127.0.0.1", args.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = _Reader(sock)
    # Announcing protocol 1.1 lets the server answer with SET_STATE without the
    # model when weights_seq_no is current (v1 peers always get the model).
    sock.sendall(encode_frame({"type": "PING", "protocol_version": PROTOCOL_VERSION, "client_name": "bench-ingest"}))
    _expect(reader.frame(), "PONG")
    sock.sendall(encode_frame({"type": "GET_STATE"}))
    state = _expect(reader.frame(), "SET_STATE")
    seq = state["weights_seq_no"]
    from tether.sdk.policy import OnnxPolicy
    from tether.protocol.onnx_codec import decode_onnx

    policy = OnnxPolicy(decode_onnx(state["onnx_file"]))  # the logp the server checks is this model's
    kind = "EPISODES_AND_GET_STATE" if args.mode == "episodes_and_get_state" else "EPISODES"
    if args.obs_shape is not None:
        frame, steps, episodes = build_image_message(args, args.worker_seed, seq, kind, policy)
        get_state = encode_frame({"type": "GET_STATE", "weights_seq_no": seq})
    elif args.agents:
        frame, steps, episodes = build_multi_agent_message(args.chunk_steps, args.agents, args.worker_seed, seq, kind,
                                                           policy)
        get_state = encode_frame({"type": "GET_STATE", "weights_seq_nos": {"m": seq}})
    else:
        frame, steps, episodes = build_message(args.chunk_steps, args.worker_seed, seq, kind, policy)
        get_state = encode_frame({"type": "GET_STATE", "weights_seq_no": seq})
    print(json.dumps({"ready": True, "frame_bytes": len(frame), "steps": steps, "episodes": episodes}), flush=True)

    go = json.loads(sys.stdin.readline())
    t_warm, t_start, t_end = go["warm"], go["start"], go["end"]
    time.sleep(max(0.0, t_warm - time.time()))

    acked_msgs = in_window_msgs = 0
    latencies: list[float] = []
    batch = 1 if kind == "EPISODES_AND_GET_STATE" else args.pipeline
    while True:
        now = time.time()
        if now >= t_end:
            break
        sent_at = time.perf_counter()
        if batch == 1:
            sock.sendall(frame)
        else:
            sock.sendall(frame * batch + get_state)
        reply = _expect(reader.frame(), "SET_STATE")
        if "onnx_file" in reply:  # the server sends the model only when weights changed
            raise RuntimeError("weights changed during the benchmark: is the learner really off?")
        done_at = time.time()
        latencies.append(time.perf_counter() - sent_at)
        acked_msgs += batch
        if t_start <= done_at < t_end:
            in_window_msgs += batch
    sock.close()
    latencies.sort()
    print(json.dumps({
        "acked_messages": acked_msgs,
        "window_messages": in_window_msgs,
        "steps_per_message": steps,
        "ack_latency_ms_p50": 1e3 * latencies[len(latencies) // 2] if latencies else None,
        "ack_latency_ms_max": 1e3 * latencies[-1] if latencies else None,
    }), flush=True)
    return 0


# -- driver -----------------------------------------------------------------------


def ping_probe(port: int, t_start: float, t_end: float, out: list[float]) -> None:
    """PING every 10 ms from t_start to t_end (wall clock); append each round trip in ms to ``out``."""
    from tether.protocol import encode_frame

    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = _Reader(sock)
    ping = encode_frame({"type": "PING"})
    time.sleep(max(0.0, t_start - time.time()))
    while time.time() < t_end:
        sent = time.perf_counter()
        sock.sendall(ping)
        _expect(reader.frame(), "PONG")
        out.append((time.perf_counter() - sent) * 1e3)
        time.sleep(max(0.0, 0.010 - (time.perf_counter() - sent)))
    sock.close()


def _proc_cpu_s(pid: int) -> float | None:
    """user+system CPU seconds of a process (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _proc_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def run(args: argparse.Namespace) -> dict:
    """The benchmark; in image mode, twice: tensors, then the same images as JSON numbers."""
    if args.obs_shape is None:
        return run_once(args)
    binary = run_once(args)
    args.obs_encoding = "b64"
    inline = run_once(args)
    args.obs_encoding = "json"
    as_json = run_once(args)
    binary.update(
        obs_shape=list(args.obs_shape), obs_dtype=args.obs_dtype,
        bytes_per_env_step=round(binary["frame_bytes"] / binary["chunk_steps"], 1),
        json_env_steps_per_s=as_json["env_steps_per_s"],
        json_bytes_per_env_step=round(as_json["frame_bytes"] / as_json["chunk_steps"], 1),
        json_verified=as_json["verified"],
        b64_env_steps_per_s=inline["env_steps_per_s"],
        b64_bytes_per_env_step=round(inline["frame_bytes"] / inline["chunk_steps"], 1),
        binary_vs_json=round(binary["env_steps_per_s"] / as_json["env_steps_per_s"], 2)
        if as_json["env_steps_per_s"] else None)
    binary["verified"] = binary["verified"] and as_json["verified"] and inline["verified"]
    return binary


def run_once(args: argparse.Namespace) -> dict:
    port = args.port or free_port()
    with tempfile.TemporaryDirectory(prefix="tether-bench-ingest-") as tmp:
        summary_file = Path(tmp) / "summary.json"
        server_cmd = [sys.executable]
        if args.profile:
            server_cmd += ["-m", "cProfile", "-o", str(Path(args.profile).resolve())]
        server_cmd += [
            "-m", "tether.server.cli", "serve",
            "--port", str(port),
            "--train-batch-size", str(10**12),
            "--force-on-policy",
            "--env-steps-per-sample", str(args.chunk_steps),
            "--no-tensorboard",
            "--checkpoint-every", "0",
            "--logdir", str(Path(tmp) / "run"),
            "--summary-file", str(summary_file),
            "--quiet",
        ]
        if args.no_pool_journal:
            server_cmd.append("--no-pool-journal")
        if args.obs_shape is not None:
            server_cmd += ["--observation-space", json.dumps(observation_space(args)),
                           "--action-space", json.dumps({"type": "Discrete", "n": 2})]
        if args.agents:
            box4 = {"type": "Box", "shape": [4], "low": "-inf", "high": "inf"}
            server_cmd += [
                "--modules", json.dumps({"m": {"observation_space": box4, "action_space": {"type": "Discrete", "n": 2}}}),
                "--policy-mapping", json.dumps([{"pattern": "*", "module": "m"}]),
            ]
        host_load = HostLoad()
        server = spawn(server_cmd, stdout=subprocess.DEVNULL)
        workers: list[subprocess.Popen] = []
        try:
            wait_for_port(port, server, timeout_s=args.timeout)
            me = str(Path(__file__).resolve())
            for i in range(args.clients):
                workers.append(spawn(
                    [sys.executable, me, "--worker", "--worker-seed", str(i), "--agents", str(args.agents),
                     "--port", str(port), "--obs-encoding", args.obs_encoding,
                     *(["--obs-shape", ",".join(map(str, args.obs_shape)), "--obs-dtype", args.obs_dtype]
                       if args.obs_shape is not None else []),
                     "--mode", args.mode, "--pipeline", str(args.pipeline), "--chunk-steps", str(args.chunk_steps)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                ))
            ready = [json.loads(w.stdout.readline() or "{}") for w in workers]  # type: ignore[union-attr]
            if not all(r.get("ready") for r in ready):
                raise RuntimeError(f"a worker failed to start: {ready}")
            log(f"{args.clients} workers ready; frame {ready[0]['frame_bytes']} bytes, "
                f"{ready[0]['steps']} steps in {ready[0]['episodes']} episodes")
            t_warm = time.time() + 0.2
            t_start = t_warm + args.warmup
            t_end = t_start + args.seconds
            go = json.dumps({"warm": t_warm, "start": t_start, "end": t_end}) + "\n"
            for w in workers:
                w.stdin.write(go)  # type: ignore[union-attr]
                w.stdin.flush()  # type: ignore[union-attr]
            pings: list[float] = []
            prober = None
            if args.ping_probe:
                import threading

                prober = threading.Thread(target=ping_probe, args=(port, t_start, t_end, pings), daemon=True)
                prober.start()
            time.sleep(max(0.0, t_start - time.time()))
            cpu0, rss0 = _proc_cpu_s(server.pid), _proc_rss_mb(server.pid)
            time.sleep(max(0.0, t_end - time.time()))
            cpu1, rss1 = _proc_cpu_s(server.pid), _proc_rss_mb(server.pid)
            if prober is not None:
                prober.join(timeout=args.timeout)
            results = []
            for w in workers:
                out, _ = w.communicate(timeout=args.timeout)
                if w.returncode != 0:
                    raise RuntimeError(f"worker exited with {w.returncode}")
                results.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for w in workers:
                stop(w, grace_s=2.0)
            stop(server, grace_s=30.0)  # SIGTERM: the server stops cleanly and writes its summary
        summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
        load = host_load.stop()

    steps_per_msg = results[0]["steps_per_message"]
    window_msgs = sum(r["window_messages"] for r in results)
    acked_steps = sum(r["acked_messages"] * r["steps_per_message"] for r in results)
    # Every message step is one agent step (single-agent: also one env step); the
    # server counts env steps of multi-agent records differently (longest agent).
    server_steps = summary.get("agent_steps", summary.get("env_steps"))
    result = {
        "env_steps_per_s": round(window_msgs * steps_per_msg / args.seconds, 1),
        "clients": args.clients,
        "chunk_steps": steps_per_msg,
        "seconds": args.seconds,
        "messages": window_msgs,
        "mode": args.mode,
        "pool_journal": not args.no_pool_journal,
        "frame_bytes": ready[0]["frame_bytes"],
        "episodes_per_message": ready[0]["episodes"],
        "messages_per_s": round(window_msgs / args.seconds, 2),
        "server_cpu_util": round((cpu1 - cpu0) / args.seconds, 3) if cpu0 is not None and cpu1 is not None else None,
        "server_rss_mb_start": round(rss0, 1) if rss0 else None,
        "server_rss_mb_end": round(rss1, 1) if rss1 else None,
        "ack_latency_ms_p50": round(sorted(r["ack_latency_ms_p50"] for r in results)[len(results) // 2], 2),
        "acked_env_steps": acked_steps,
        "server_env_steps": summary.get("env_steps"),
        "server_agent_steps": server_steps,
        "server_updates": summary.get("updates"),
        "verified": server_steps == acked_steps and summary.get("updates") == 0,
        **load,
    }
    if args.mode == "episodes":
        result["pipeline"] = args.pipeline
    if args.ping_probe:
        pings.sort()
        pick = (lambda q: round(pings[min(len(pings) - 1, int(q * len(pings)))], 2)) if pings else (lambda q: None)
        result.update(ping_p50_ms=pick(0.5), ping_p99_ms=pick(0.99), ping_max_ms=round(pings[-1], 2) if pings else None,
                      pings=len(pings))
    if args.agents:
        # Every agent step is one validated, stored step of one agent.
        result = {"agent_steps_per_s": result["env_steps_per_s"], "agents_per_episode": args.agents, **result}
        del result["env_steps_per_s"]
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    install_cleanup()
    if args.wait_quiet > 0:
        wait_until_quiet(args.wait_quiet)
    result = run(args)
    log(f"{result.get('env_steps_per_s', result.get('agent_steps_per_s')):.0f} steps/s ({result})")
    print(json.dumps(result), flush=True)
    return 0 if result["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
