"""A client for multiagent/envs/reach.py whose difficulty follows the server's curriculum.

The target's distance is an environment parameter (protocol §19): the server sends it, the SDK
draws each episode's value, the game reads it when the episode starts. Start the server with the
curriculum of examples/configs/reach_curriculum.toml, then this client::

    tether serve --config examples/configs/reach_curriculum.toml --port 5555
    python examples/curriculum_client.py --port 5555

It prints one JSON line when training is done: each parameter set it received with the env steps
it had played by then, and the greedy policy's reach rate at the final lesson's distance.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gymnasium import Wrapper  # noqa: E402

from multiagent.envs.reach import Reach  # noqa: E402
from tether.sdk import TetherClient, run_env  # noqa: E402


class CountSteps(Wrapper):
    """Counts the env steps played, so that a parameter change can be placed in time."""

    def __init__(self, env: Reach) -> None:
        super().__init__(env)
        self.steps = 0

    def step(self, action):  # type: ignore[no-untyped-def]
        self.steps += 1
        return self.env.step(action)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="server address")
    parser.add_argument("--port", type=int, default=5555, help="server port")
    parser.add_argument("--seed", type=int, default=0, help="env and sampling seed")
    parser.add_argument("--max-steps", type=int, default=None, help="env steps to play (default: until training is done)")
    parser.add_argument("--eval-episodes", type=int, default=200, help="greedy episodes at the last distance played")
    args = parser.parse_args()
    env = CountSteps(Reach())
    env.reset(seed=args.seed)
    # Waiting for each batch's answer delivers every step played and brings a change with the answer
    # to the batch that made it: the steps played by then say how soon the client saw it.
    client = TetherClient(args.host, args.port, client_name=f"reach-{args.seed}", seed=args.seed,
                          wait_for_weights=True)
    received: list[dict] = []
    client.on_env_params_changed(lambda params: received.append(
        {"seq": params.seq, "lesson": params.lesson, "values": params.values, "env_steps": env.steps}))
    distances: dict[int, int] = {}

    def count(_return: float, _length: int) -> None:
        distances[env.unwrapped.distance] = distances.get(env.unwrapped.distance, 0) + 1

    returns = run_env(client, env, max_steps=args.max_steps, on_episode_end=count)
    greedy = run_env(client, env, max_episodes=args.eval_episodes, deterministic=True) if client.policy else []
    print(json.dumps({"episodes": len(returns), "training_done": client.training_done is not None,
                      "env_steps": env.steps, "received": received, "distances": distances,
                      "final_distance": env.unwrapped.distance,
                      "greedy_reach_rate": sum(r > 0 for r in greedy) / max(1, len(greedy))}), flush=True)
    client.close()


if __name__ == "__main__":
    main()
