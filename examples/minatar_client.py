"""MinAtar Breakout (the ``minatar`` package) as an external Tether client.

MinAtar is a 10x10 miniature of the Atari games (Young & Tian 2019). The observation is the game's
10x10x4 grid of 0/1 channels (paddle, ball, trail, bricks), flattened to 400 floats; the actions are
the game's minimal set (stay, left, right); an episode ends when the ball is lost or, as a
truncation, after ``--max-episode-steps`` steps. Sticky actions are off (``--sticky`` sets them).

    tether serve --observation-space '{"type": "Box", "shape": [400], "low": 0, "high": 1}' \\
        --action-space '{"type": "Discrete", "n": 3}' --hidden-sizes 256,256
    python examples/minatar_client.py --port 5555

``--random N`` plays N episodes with uniformly random actions, without a server, and prints their
mean return as one JSON line (the baseline a trained policy must beat).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

from tether.sdk import TetherClient, TetherConnectionError, run_env  # noqa: E402


class MinAtarEnv(gym.Env):
    """gymnasium's reset/step over ``minatar.Environment`` (minimal action set, flat float observation)."""

    def __init__(self, game: str = "breakout", sticky_action_prob: float = 0.0, max_episode_steps: int = 1000,
                 seed: int | None = None) -> None:
        import logging

        logging.disable(logging.WARNING)  # (minatar warns that it cannot render without matplotlib: not needed)
        try:
            from minatar import Environment
        finally:
            logging.disable(logging.NOTSET)
        self.game = Environment(game, sticky_action_prob=sticky_action_prob)
        self.game.seed(seed)
        self.actions = self.game.minimal_action_set()
        channels = self.game.state_shape()
        self.observation_space = gym.spaces.Box(0.0, 1.0, (int(np.prod(channels)),), np.float32)
        self.action_space = gym.spaces.Discrete(len(self.actions))
        self.max_episode_steps = max_episode_steps
        self._steps = 0

    def _obs(self) -> np.ndarray:
        return self.game.state().astype(np.float32).reshape(-1)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        if seed is not None:
            self.game.seed(seed)
        self.game.reset()
        self._steps = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward, terminated = self.game.act(self.actions[int(action)])
        self._steps += 1
        truncated = not terminated and self._steps >= self.max_episode_steps
        return self._obs(), float(reward), bool(terminated), truncated, {}


def random_return(episodes: int, seed: int, **env_args: Any) -> float:
    """Mean return of uniformly random actions over ``episodes`` episodes."""
    env = MinAtarEnv(seed=seed, **env_args)
    rng = np.random.default_rng(seed)
    returns = []
    for _ in range(episodes):
        env.reset()
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(rng.integers(env.action_space.n))
            total += reward
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="server address")
    parser.add_argument("--port", type=int, default=5555, help="server port")
    parser.add_argument("--game", default="breakout", help="a MinAtar game (default: breakout)")
    parser.add_argument("--seed", type=int, default=0, help="game and sampling seed")
    parser.add_argument("--sticky", type=float, default=0.0, help="sticky-action probability (default: 0)")
    parser.add_argument("--max-episode-steps", type=int, default=1000, help="truncate episodes here (default: 1000)")
    parser.add_argument("--random", type=int, metavar="EPISODES", default=0,
                        help="no server: play this many random episodes and print their mean return")
    args = parser.parse_args()
    env_args = {"game": args.game, "sticky_action_prob": args.sticky, "max_episode_steps": args.max_episode_steps}
    if args.random:
        print(json.dumps({"random_return_mean": random_return(args.random, args.seed, **env_args),
                          "episodes": args.random}), flush=True)
        return
    env = MinAtarEnv(seed=args.seed, **env_args)
    try:
        client = TetherClient(args.host, args.port, client_name=f"minatar-{args.game}-{args.seed}", seed=args.seed,
                              reconnect_timeout_s=5.0)
    except TetherConnectionError as exc:
        sys.exit(f"minatar: {exc}")
    try:
        run_env(client, env)
    except TetherConnectionError:
        pass  # the server stopped (its budget is spent)
    finally:
        client.close()


if __name__ == "__main__":
    main()
