"""CartPole-v1 as an external Tether client: the env runs here, actions come
from the local ONNX model, experience goes to the server.

    python examples/cartpole_client.py --port 5555            # one client
    python examples/cartpole_client.py --port 5555 --clients 4 # four processes

A client survives a server outage of up to --reconnect-timeout seconds (the
engine keeps playing with its current model meanwhile) and prints one JSON
line when it stops: {"client", "env_steps_sent", "reconnects", "other_run_steps_dropped",
"stopped_by"}. A server restarted without resuming is a new run: the steps played with the old
run's model are not sent (other_run_steps_dropped) and play goes on with the new run's.

``--offline-policy run/offline_policy.json`` plays with a server's offline policy file and no
server (docs/protocol.md §20): nothing is sent; with ``--demo-file play.jsonl`` every episode is
written to a demonstration file (§18). Its JSON line then holds the episodes' ``mean_return``.

``--no-velocities`` plays CartPole with the cart's and the pole's velocities removed from the
observation (position and angle only, as RLlib's stateless CartPole): a policy needs memory to
infer them. Serve it with a 2-value observation space and a recurrent model (docs/models.md).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import signal
import sys
import threading
from typing import Any
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gymnasium as gym  # noqa: E402

from tether.sdk import TetherClient, TetherConnectionError, run_env  # noqa: E402


class NoVelocities(gym.ObservationWrapper):
    """CartPole's observation without its two velocities: (cart position, pole angle)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        low, high = env.observation_space.low, env.observation_space.high
        self.observation_space = gym.spaces.Box(low[[0, 2]], high[[0, 2]], dtype=env.observation_space.dtype)

    def observation(self, observation: Any) -> Any:
        return observation[[0, 2]]


def run_client(host: str, port: int, seed: int, max_steps: int | None, reconnect_timeout_s: float,
               no_velocities: bool = False, offline_policy: str | None = None, demo_file: str | None = None) -> None:
    """One client process: CartPole episodes until the budget is spent or the server goes away."""
    env = gym.make("CartPole-v1")
    if no_velocities:
        env = NoVelocities(env)
    env.reset(seed=seed)
    client = None
    stopped_by = "max_steps"
    returns: list[float] = []
    # The first Ctrl-C ends the run at the next episode's end (an exception raised at an
    # arbitrary point could leave the client's locks held and hang the final report);
    # a second one interrupts at once.
    interrupted = threading.Event()

    def on_interrupt(signum: int, frame: Any) -> None:
        if interrupted.is_set():
            signal.default_int_handler(signum, frame)
        interrupted.set()

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        client = TetherClient(host, port, client_name=f"cartpole-{seed}", seed=seed,
                              reconnect_timeout_s=reconnect_timeout_s, offline_policy=offline_policy)
        if demo_file is not None:
            client.record_demonstrations(demo_file)
        returns = run_env(client, env, max_steps=max_steps, on_episode_end=lambda *_: interrupted.is_set())
        if interrupted.is_set():
            stopped_by = "interrupted"
        elif client.training_done is not None:
            stopped_by = "training_done"  # the server reached its target and said so
    except TetherConnectionError:
        stopped_by = "server_gone"  # the server went away for longer than reconnect_timeout_s
    except KeyboardInterrupt:
        stopped_by = "interrupted"
    finally:
        if client is not None:
            print(json.dumps({"client": seed, "env_steps_sent": client.env_steps_sent, "reconnects": client.reconnects,
                              "other_run_steps_dropped": client.other_run_steps_dropped,
                              "redirects": client.redirects, "server_address": client.server_address,
                              "episodes": len(returns), "mean_return": sum(returns) / max(1, len(returns)),
                              "stopped_by": stopped_by}), flush=True)
            client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="server address")
    parser.add_argument("--port", type=int, default=5555, help="server port")
    parser.add_argument("--clients", type=int, default=1, help="number of client processes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first client (others count up)")
    parser.add_argument("--max-steps", type=int, default=None, help="env steps per client (default: run until stopped)")
    parser.add_argument("--reconnect-timeout", type=float, default=5.0, help="give up once the server has been gone this many seconds (default: 5)")
    parser.add_argument("--no-velocities", action="store_true", help="observe position and angle only (needs memory)")
    parser.add_argument("--offline-policy", default=None, help="play with this offline policy file and no server (§20)")
    parser.add_argument("--demo-file", default=None, help="write every episode to this demonstration file (§18)")
    args = parser.parse_args()
    if args.clients == 1:
        run_client(args.host, args.port, args.seed, args.max_steps, args.reconnect_timeout, args.no_velocities,
                   args.offline_policy, args.demo_file)
        return
    if args.demo_file is not None:
        parser.error("--demo-file takes one client (--clients 1)")
    procs = [
        mp.Process(target=run_client, args=(args.host, args.port, args.seed + i, args.max_steps, args.reconnect_timeout,
                                            args.no_velocities, args.offline_policy))
        for i in range(args.clients)
    ]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join()
    except KeyboardInterrupt:  # Ctrl-C reaches every client too: each stops and reports
        for p in procs:
            p.join()


if __name__ == "__main__":
    main()
