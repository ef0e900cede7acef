"""Pendulum-v1 (continuous actions) as an external Tether client.

    tether serve --config examples/configs/pendulum.toml --port 5556
    python examples/pendulum_client.py --port 5556 --clients 2

Without a server, ``--evaluate run/policy.onnx`` plays a trained policy and
``--evaluate random`` plays uniformly random torques, for ``--episodes``
episodes, and print ``{"return_mean": ..., "returns": [...]}``; a random
policy averages about -1200 per episode, a good one better than -200.

The policy is a diagonal Gaussian over the torque: the client samples it
locally, records the raw sample and its log-density, and the env gets the
sample clipped into [-2, 2] (protocol 1.3, §11.4).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gymnasium as gym  # noqa: E402

import numpy as np  # noqa: E402

from tether.sdk import OnnxPolicy, TetherClient, TetherConnectionError, run_env  # noqa: E402
from tether.protocol.distributions import to_env_action  # noqa: E402
from tether.protocol.spaces import from_gymnasium  # noqa: E402

ENV_ID = "Pendulum-v1"


def run_client(host: str, port: int, seed: int, max_steps: int | None, reconnect_timeout_s: float) -> None:
    """One client process: Pendulum episodes until the budget is spent or the server goes away."""
    env = gym.make(ENV_ID)
    env.reset(seed=seed)
    try:
        client = TetherClient(host, port, client_name=f"pendulum-{seed}", seed=seed,
                              reconnect_timeout_s=reconnect_timeout_s)
        run_env(client, env, max_steps=max_steps)
    except (TetherConnectionError, KeyboardInterrupt):
        pass  # the server finished training and went away, or we were stopped


def evaluate(policy: str, episodes: int, seed: int) -> list[float]:
    """Episode returns of a policy.onnx (sampled as in training) or of ``"random"`` torques."""
    env = gym.make(ENV_ID)
    env.action_space.seed(seed)
    space = from_gymnasium(env.action_space)
    model = None if policy == "random" else OnnxPolicy(Path(policy).read_bytes(), space, seed=seed)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            if model is None:
                action = env.action_space.sample()
            else:
                action = to_env_action(space, model.sample(np.asarray(obs, np.float32))[0])
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="server address")
    parser.add_argument("--port", type=int, default=5556, help="server port")
    parser.add_argument("--clients", type=int, default=1, help="number of client processes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first client (others count up)")
    parser.add_argument("--max-steps", type=int, default=None, help="env steps per client (default: run until stopped)")
    parser.add_argument("--reconnect-timeout", type=float, default=5.0, help="give up after the server is gone this long")
    parser.add_argument("--evaluate", metavar="POLICY", default=None,
                        help="no server: play a policy.onnx, or 'random', and print the returns as JSON")
    parser.add_argument("--episodes", type=int, default=20, help="episodes for --evaluate")
    args = parser.parse_args()
    if args.evaluate is not None:
        returns = evaluate(args.evaluate, args.episodes, args.seed)
        print(json.dumps({"return_mean": float(np.mean(returns)), "returns": [round(r, 2) for r in returns]}))
        return
    if args.clients == 1:
        run_client(args.host, args.port, args.seed, args.max_steps, args.reconnect_timeout)
        return
    procs = [
        mp.Process(target=run_client, args=(args.host, args.port, args.seed + i, args.max_steps, args.reconnect_timeout))
        for i in range(args.clients)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()


if __name__ == "__main__":
    main()
