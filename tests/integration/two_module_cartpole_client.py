"""A multi-agent client process for the scale-out tests: CartPole episodes played by agent ``a_0``
(module ``m``) and, with ``--both``, by ``b_0`` (module ``n``) in turn, until the server says
training is done. Prints one JSON line at the end: the steps it played per agent."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gymnasium as gym  # noqa: E402

from tether.sdk import MultiAgentClient, TetherConnectionError  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--both", action="store_true", help="play b_0 (module n) too")
    args = parser.parse_args()
    env = gym.make("CartPole-v1")
    env.reset(seed=args.seed)
    client = MultiAgentClient("127.0.0.1", args.port, seed=args.seed, reconnect_timeout_s=10,
                              client_name=f"two-module-{args.seed}")
    played = {"a_0": 0, "b_0": 0}
    agents = ["a_0", "b_0"] if args.both else ["a_0"]
    episode = 0
    try:
        while client.training_done is None:
            agent = agents[episode % len(agents)]
            episode += 1
            obs, _ = env.reset()
            eid = client.start_episode()
            done = False
            while not done and client.training_done is None:
                action = client.get_action(eid, {agent: obs})[agent]
                obs, reward, terminated, truncated, _ = env.step(action)
                client.log_returns(eid, {agent: float(reward)})
                played[agent] += 1
                done = terminated or truncated
            client.end_episode(eid, {agent: obs}, truncated=not terminated)
    except TetherConnectionError:
        pass
    finally:
        print(json.dumps({"played": played, "done": client.training_done is not None}), flush=True)
        client.close()


if __name__ == "__main__":
    main()
