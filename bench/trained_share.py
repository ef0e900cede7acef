"""Load benchmark: of the agent steps a training server answered, how many did it train?

For each count in ``--clients`` (default 16,64,256) a real ``tether serve`` runs
on-policy with its defaults (train_batch_size 2000, env_steps_per_sample 500,
max_staleness 1, behaviour-logp check on) and that many clients connect. Each
client behaves like an SDK client in an engine that keeps running: it acts at
``--steps-per-s`` env steps per second with the model it holds (actions sampled
from the served ONNX model, honest ``action_logp``), cuts a batch every 500
steps played (fewer when the server asks, ``steps_per_batch``), sends one batch at a time with EPISODES_AND_GET_STATE (claiming the
oldest weights version among its steps, as every SDK does), keeps acting while
it waits, and swaps in the model an answer brings. Clients run as asyncio tasks
in ``--procs`` processes.

Like the SDKs, a client names each step's version (``weights_seq_no_runs``)
when a record's steps used more than one, keeps at most (max_staleness + 1) *
train_batch_size steps waiting behind the batch in flight (dropping the
oldest), and adds up the steps the server says it refused as stale
(``steps_refused_stale`` in SET_STATE).

After ``--seconds`` the clients stop, the server is stopped with SIGTERM and its
summary read. ``trained_share`` is agent steps trained / (agent steps trained +
agent steps refused on arrival as too stale + agent steps dropped as stale
later): the share of the steps the server answered for that it trained. Steps
still in the pool at the end are neither. ``refused_share`` is the refused
steps' share of the steps received, ``told_share`` the share of them the
clients were told of, ``stored_trained_share`` the share of the stored steps
that were trained. ``--no-hold-back`` makes clients record every episode.

Prints one JSON object: ``trained_share_<n>``, ``trained_steps_per_s_<n>`` and
``refused_share_<n>`` for every client count, and a ``runs`` list with each
run's details.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO_ROOT, HostLoad, free_port, install_cleanup, log, spawn, stop, wait_for_port  # noqa: E402

EPISODE_STEPS = 100
BLOCK_STEPS = 20
#: The SDKs' default bound on steps waiting behind the batch in flight: (max_staleness + 1) * train_batch_size.
QUEUE_LIMIT_STEPS = (1 + 1) * 2000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="16,64,256", help="client counts, comma-separated (default: 16,64,256)")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each run (default: 30)")
    parser.add_argument("--steps-per-s", type=float, default=200.0,
                        help="env steps each client takes per second (default: 200)")
    parser.add_argument("--chunk-steps", type=int, default=500, help="env steps per batch (default: 500)")
    parser.add_argument("--procs", type=int, default=2, help="client processes (default: 2)")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra argument for tether serve (repeatable), e.g. --server-arg=--max-staleness=2")
    parser.add_argument("--no-hold-back", action="store_true",
                        help="clients record every episode, ignoring the server's record_share")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# -- client processes ----------------------------------------------------------------


class Models:
    """The served models by weights version, shared by the clients of one process."""

    def __init__(self) -> None:
        self._by_version: dict[int, object] = {}

    def get(self, version: int, onnx_field: str | None):
        from tether.sdk.policy import OnnxPolicy
        from tether.protocol.onnx_codec import decode_onnx

        if version not in self._by_version and onnx_field is not None:
            self._by_version[version] = OnnxPolicy(decode_onnx(onnx_field))
            for old in sorted(self._by_version)[:-4]:
                del self._by_version[old]
        return self._by_version.get(version)


def _batch_steps(state: dict, args: argparse.Namespace) -> int:
    """Steps played per batch: ``--chunk-steps``, or fewer when SET_STATE says ``steps_per_batch`` (§13.2)."""
    every = state.get("steps_per_batch")
    if args.no_hold_back or type(every) is not int or every < 1:
        return args.chunk_steps
    return min(every, args.chunk_steps)


async def _request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, message: dict) -> dict:
    import orjson

    from tether.protocol import encode_frame

    writer.write(encode_frame(message))
    await writer.drain()
    length = int(await reader.readexactly(8))
    return orjson.loads(await reader.readexactly(length))


async def client(index: int, port: int, args: argparse.Namespace, models: Models, end: float, out: dict) -> None:
    import numpy as np

    rng = np.random.default_rng(index)
    while True:  # a burst of connections may close the oldest still in its handshake: retry, as SDKs do
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
            if (await _request(reader, writer, {"type": "PING", "protocol_version": "1.3"}))["type"] == "PONG":
                break
        except (OSError, asyncio.IncompleteReadError):
            pass
        out["handshake_retries"] += 1
        await asyncio.sleep(0.05 + 0.2 * rng.random())
    state = await _request(reader, writer, {"type": "GET_STATE"})
    version = state["weights_seq_no"]
    asked = state.get("record_share", 1.0)
    policy = models.get(version, state.get("onnx_file"))
    session = f"share-{index}-{rng.integers(1 << 40)}"
    episodes: list[dict] = []  # finished, not yet cut into a batch
    # The server's record_share: the chance that a new episode is recorded.
    share = float(asked) if type(asked) in (int, float) and 0 < asked <= 1 else 1.0
    # The server's steps_per_batch: smaller batches while it holds clients back.
    batch_steps = _batch_steps(state, args)

    def new_episode(first_obs: list) -> dict:
        return {"obs": [first_obs], "actions": [], "rewards": [], "action_logp": [], "versions": [], "t": 0,
                "recorded": args.no_hold_back or rng.random() < share}

    current = new_episode(rng.normal(size=4).astype(np.float32).tolist())
    played = 0
    queue: list[dict] = []
    in_flight: asyncio.Task | None = None
    seq = 0
    period = BLOCK_STEPS / args.steps_per_s
    next_block = time.monotonic()
    while time.monotonic() < end:
        # Act: one block of steps with the model held now.
        # Row t is the observation step t acts on; row BLOCK_STEPS the one after the block.
        fresh = rng.normal(size=(BLOCK_STEPS, 4)).astype(np.float32) * 0.5
        obs = np.concatenate([np.asarray(current["obs"][-1], np.float32)[None], fresh])
        logits = policy.dist_inputs(obs[:BLOCK_STEPS])
        logits = logits - logits.max(-1, keepdims=True)
        logp_all = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        actions = (rng.random(BLOCK_STEPS) < np.exp(logp_all[:, 1])).astype(np.int64)
        for t in range(BLOCK_STEPS):
            current["t"] += 1
            if current["recorded"]:
                current["actions"].append(int(actions[t]))
                current["action_logp"].append(float(logp_all[t, actions[t]]))
                current["rewards"].append(1.0)
                current["versions"].append(version)
                current["obs"].append(obs[t + 1].tolist())
            else:
                out["held_back_steps"] += 1
            if current["t"] == EPISODE_STEPS:
                if current["recorded"]:
                    episodes.append(current)
                current = new_episode(obs[t + 1].tolist())
        played += BLOCK_STEPS
        # A batch every steps_per_batch steps played, as the SDKs do: smaller while episodes are held
        # back, and sent even when empty, since its answer brings the server's current record_share.
        if played >= batch_steps:
            played = 0
            queue.append({"episodes": episodes})
            episodes = []
            while sum(len(e["actions"]) for b in queue for e in b["episodes"]) > QUEUE_LIMIT_STEPS:
                out["dropped_steps"] += sum(len(e["actions"]) for e in queue.pop(0)["episodes"])
        # Send: one batch at a time, oldest first; the engine keeps acting meanwhile.
        if in_flight is not None and in_flight.done():
            reply = in_flight.result()
            in_flight = None
            if reply.get("type") != "SET_STATE":
                out["errors"].append(reply)
                break
            out["answered_steps"] += reply["_steps"]
            refused = reply.get("steps_refused_stale")
            out["told_refused_steps"] += refused if type(refused) is int and refused >= 1 else 0
            asked = reply.get("record_share", 1.0)
            share = float(asked) if type(asked) in (int, float) and 0 < asked <= 1 else 1.0
            batch_steps = _batch_steps(reply, args)
            if reply["weights_seq_no"] != version:
                new = models.get(reply["weights_seq_no"], reply.get("onnx_file"))
                if new is not None:
                    policy, version = new, reply["weights_seq_no"]
        if in_flight is None and queue:
            batch = queue.pop(0)
            seq += 1
            steps = sum(len(e["actions"]) for e in batch["episodes"])
            message = {
                "type": "EPISODES_AND_GET_STATE", "client_session": session, "batch_seq": seq,
                "weights_seq_no": min((v for e in batch["episodes"] for v in e["versions"]), default=version),
                "episodes": [{"obs": e["obs"], "actions": e["actions"], "rewards": e["rewards"],
                              "action_logp": e["action_logp"], "is_terminated": True, "is_truncated": False,
                              "episode_id": f"{session}-{seq}-{i}", **_runs(e["versions"])}
                             for i, e in enumerate(batch["episodes"])],
            }

            async def send(message: dict = message, steps: int = steps) -> dict:
                reply = await _request(reader, writer, message)
                reply["_steps"] = steps
                return reply

            in_flight = asyncio.ensure_future(send())
            out["sent_steps"] += steps
        out["queued_steps_max"] = max(out["queued_steps_max"], sum(
            len(e["actions"]) for b in queue for e in b["episodes"]))
        next_block += period
        await asyncio.sleep(max(0.0, next_block - time.monotonic()))
    if in_flight is not None:
        in_flight.cancel()
    writer.close()


def _runs(versions: list[int]) -> dict:
    """``weights_seq_no_runs`` for a record whose steps used several versions, as the SDKs send it."""
    from tether.protocol.episodes import version_runs

    runs = version_runs(versions)
    return {} if runs is None else {"weights_seq_no_runs": runs}


async def worker_main(args: argparse.Namespace, indices: list[int]) -> dict:
    models = Models()
    out = {"answered_steps": 0, "sent_steps": 0, "queued_steps_max": 0, "errors": [], "handshake_retries": 0,
           "told_refused_steps": 0, "dropped_steps": 0, "held_back_steps": 0}
    end = time.monotonic() + args.seconds
    await asyncio.gather(*(client(i, args.port, args, models, end, out) for i in indices), return_exceptions=False)
    return out


# -- the driver -------------------------------------------------------------------------


def run_once(clients: int, args: argparse.Namespace) -> dict:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="tether-bench-share-") as tmp:
        summary_file = Path(tmp) / "summary.json"
        server = spawn([sys.executable, "-m", "tether.server.cli", "serve", "--port", str(port), "--quiet",
                        "--no-tensorboard", "--checkpoint-every", "0", "--logdir", str(Path(tmp) / "run"),
                        "--summary-file", str(summary_file), "--max-connections", str(clients + 16),
                        *args.server_arg], stdout=subprocess.DEVNULL)
        host_load = HostLoad()
        try:
            wait_for_port(port, server, timeout_s=60)
            me = str(Path(__file__).resolve())
            workers = [spawn([sys.executable, me, "--worker", str(w), "--port", str(port), "--clients", str(clients),
                              "--seconds", str(args.seconds), "--steps-per-s", str(args.steps_per_s),
                              "--chunk-steps", str(args.chunk_steps), "--procs", str(args.procs),
                             *(["--no-hold-back"] if args.no_hold_back else [])],
                             stdout=subprocess.PIPE) for w in range(args.procs)]
            outs = [json.loads(w.communicate(timeout=args.seconds + 120)[0].decode().strip().splitlines()[-1])
                    for w in workers]
        finally:
            stop(server)
        summary = json.loads(summary_file.read_text())
    trained, stale = summary["agent_steps_trained"], summary["samples_dropped_stale"]
    refused, received = summary["samples_refused_stale"], summary["agent_steps"]
    told = sum(o["told_refused_steps"] for o in outs)
    # Steps answered and not trained: refused on arrival, or dropped later. Steps still in the pool
    # when the server stopped (at most its room) are neither.
    lost = refused + stale
    return {
        "clients": clients,
        "trained_share": round(trained / (trained + lost), 4) if trained + lost else None,
        "stored_trained_share": round(trained / (trained + stale), 4) if trained + stale else None,
        "trained_steps_per_s": round(trained / args.seconds, 1),
        "refused_share": round(refused / received, 4) if received else None,
        "told_share": round(told / refused, 4) if refused else None,
        "agent_steps_trained": trained,
        "samples_dropped_stale": stale,
        "samples_refused_stale": refused,
        "client_dropped_steps": sum(o["dropped_steps"] for o in outs),
        "client_held_back_steps": sum(o["held_back_steps"] for o in outs),
        "answered_steps": sum(o["answered_steps"] for o in outs),
        "sent_steps": sum(o["sent_steps"] for o in outs),
        "received_steps": summary["agent_steps"],
        "client_queue_steps_max": max(o["queued_steps_max"] for o in outs),
        "handshake_retries": sum(o["handshake_retries"] for o in outs),
        "updates": summary["updates"],
        "errors": sum(len(o["errors"]) for o in outs),
        "first_error": next((o["errors"][0] for o in outs if o["errors"]), None),
        **host_load.stop(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    counts = [int(c) for c in args.clients.split(",")]
    if args.worker is not None:
        total = counts[0]
        indices = [i for i in range(total) if i % args.procs == args.worker]
        print(json.dumps(asyncio.run(worker_main(args, indices))), flush=True)
        return 0
    install_cleanup()
    runs = []
    for n in counts:
        log(f"{n} clients for {args.seconds:g} s")
        runs.append(run_once(n, args))
        log(json.dumps(runs[-1]))
    result = {"steps_per_s_per_client": args.steps_per_s, "seconds": args.seconds}
    for r in runs:
        result[f"trained_share_{r['clients']}"] = r["trained_share"]
        result[f"trained_steps_per_s_{r['clients']}"] = r["trained_steps_per_s"]
        result[f"refused_share_{r['clients']}"] = r["refused_share"]
    result["runs"] = runs
    print(json.dumps(result))
    return 0 if all(r["errors"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
