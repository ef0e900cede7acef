"""A CartPole client whose observations are ``obs * scale + offset`` (an engine reporting raw units):
plays until the server says training is done, then prints its returns' count as one JSON line."""

from __future__ import annotations

import argparse
import json

import gymnasium as gym
import numpy as np

from tether.sdk import TetherClient, run_env

#: Per-dimension offsets: positions and velocities far from zero, and not alike.
OFFSET = np.array([500.0, -300.0, 200.0, 1000.0], np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--offset", action="store_true", help="add OFFSET after scaling")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    offset = OFFSET if args.offset else np.zeros(4, np.float32)
    env = gym.wrappers.TransformObservation(
        gym.make("CartPole-v1"), lambda obs: (obs * args.scale + offset).astype(np.float32),
        gym.spaces.Box(-np.inf, np.inf, (4,), np.float32))
    env.reset(seed=args.seed)
    client = TetherClient("127.0.0.1", args.port, client_name="scaled-cartpole", seed=args.seed)
    returns = run_env(client, env)
    print(json.dumps({"episodes": len(returns), "training_done": client.training_done is not None}), flush=True)
    client.close()


if __name__ == "__main__":
    main()
