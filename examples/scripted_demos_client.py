"""Demonstrations from a scripted controller: CartPole-v1 or Pendulum-v1 played by a hand-written
expert, its actions reported with ``log_action`` and the episodes written to a demonstration file.

    # no server: only the demonstration file (spaces from the game)
    python examples/scripted_demos_client.py --game cartpole --episodes 10 --demo-file expert.jsonl
    # with a server: the expert's steps are logged steps it learns from (bc_coef), and recorded
    python examples/scripted_demos_client.py --game cartpole --port 5555 --episodes 10 --demo-file expert.jsonl
    # half the episodes by the expert (logged), half by the policy
    python examples/scripted_demos_client.py --game cartpole --port 5555 --max-steps 20000 --expert-share 0.5

Prints one JSON line when it stops: {"episodes", "expert_return_mean", "policy_return_mean", ...}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

from tether.protocol.spaces import from_gymnasium  # noqa: E402
from tether.sdk import TetherClient  # noqa: E402
from tether.sdk.demonstrations import DemoWriter  # noqa: E402

from experts import cartpole_expert, pendulum_expert  # noqa: E402


GAMES: dict[str, tuple[str, Callable[[np.ndarray], Any]]] = {
    "cartpole": ("CartPole-v1", cartpole_expert),
    "pendulum": ("Pendulum-v1", pendulum_expert),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", choices=sorted(GAMES), default="cartpole")
    parser.add_argument("--port", type=int, default=None, help="a server's port (none: write the file only)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--episodes", type=int, default=None, help="stop after this many episodes")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many env steps")
    parser.add_argument("--expert-share", type=float, default=1.0,
                        help="share of episodes the expert plays (logged); the policy plays the rest (needs a server)")
    parser.add_argument("--demo-file", default=None, help="write every episode played to this demonstration file")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.episodes is None and args.max_steps is None:
        parser.error("give --episodes or --max-steps")
    if args.port is None and args.expert_share < 1.0:
        parser.error("--expert-share below 1 needs a server (--port): the policy plays those episodes")
    env_id, expert = GAMES[args.game]
    env = gym.make(env_id)
    rng = np.random.default_rng(args.seed)
    client = None
    writer = None
    if args.port is not None:
        client = TetherClient(args.host, args.port, client_name=f"scripted-{args.game}-{args.seed}", seed=args.seed)
        if args.demo_file:
            writer = client.record_demonstrations(args.demo_file)
    elif args.demo_file:
        writer = DemoWriter(args.demo_file, {"default_policy": (from_gymnasium(env.observation_space),
                                                                from_gymnasium(env.action_space))})
    returns: dict[str, list[float]] = {"expert": [], "policy": []}
    steps = episodes = 0
    try:
        while (args.episodes is None or episodes < args.episodes) and (args.max_steps is None or steps < args.max_steps):
            obs, _ = env.reset(seed=args.seed * 100_000 + episodes)
            by_expert = bool(rng.random() < args.expert_share)
            episode_id = client.start_episode() if client is not None else f"episode-{episodes}"
            total, done, truncated = 0.0, False, False
            while not done:
                if by_expert:
                    action = expert(obs)
                    if client is not None:
                        client.log_action(episode_id, obs, action)
                    elif writer is not None:
                        writer.step(episode_id, "default_agent", "default_policy", obs, action, logged=True)
                else:
                    assert client is not None
                    action = client.get_action(episode_id, obs)
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                steps += 1
                if client is not None:
                    client.log_returns(episode_id, float(reward))
                elif writer is not None:
                    writer.add_reward(episode_id, "default_agent", float(reward))
                done = terminated or truncated
            if client is not None:
                client.end_episode(episode_id, obs, truncated=truncated and not terminated)
            elif writer is not None:
                writer.end(episode_id, "default_agent", obs, terminated=terminated)
            returns["expert" if by_expert else "policy"].append(total)
            episodes += 1
        if client is not None:
            client.flush()
    finally:
        if client is not None:
            client.close()
        elif writer is not None:
            writer.close()
    print(json.dumps({"episodes": episodes, "env_steps": steps,
                      "expert_return_mean": float(np.mean(returns["expert"])) if returns["expert"] else None,
                      "policy_return_mean": float(np.mean(returns["policy"])) if returns["policy"] else None,
                      "policy_returns_last": returns["policy"][-20:]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
