"""Runs a PettingZoo game as an external multi-agent Tether client.

    tether serve --config examples/configs/simple_spread.toml --port 5557
    python examples/pettingzoo_client.py --game simple_spread --port 5557

Games: simple_spread (mpe2, N=3, 25 cycles, discrete), simple_tag (mpe2, 3
adversaries, 1 good agent, 2 obstacles, discrete), two_step (the grouped
two-step game), rooms_hierarchical and rooms_flat (the maze of rooms with a
two-level hierarchy, or one flat agent). Each runs through multiagent.pettingzoo_adapter with the
multi-agent SDK; the server's config decides modules, mapping and groups.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tether.multiagent.pettingzoo_adapter import run_parallel_env  # noqa: E402
from tether.sdk import MultiAgentClient, TetherConnectionError  # noqa: E402


def _simple_spread() -> Any:
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=False)


def _simple_tag() -> Any:
    from mpe2 import simple_tag_v3

    return simple_tag_v3.parallel_env(num_good=1, num_adversaries=3, num_obstacles=2, max_cycles=25,
                                      continuous_actions=False)


def _two_step() -> Any:
    from tether.multiagent.envs.two_step_game import TwoStepGame

    return TwoStepGame()


def _rooms(mode: str) -> Callable[[], Any]:
    def make() -> Any:
        from tether.multiagent.envs.rooms_maze import RoomsMaze

        return RoomsMaze(mode=mode)

    return make


GAMES: dict[str, Callable[[], Any]] = {
    "simple_spread": _simple_spread,
    "simple_tag": _simple_tag,
    "two_step": _two_step,
    "rooms_hierarchical": _rooms("hierarchical"),
    "rooms_flat": _rooms("flat"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", choices=sorted(GAMES), required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5555)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-episodes", type=int, default=None)
    args = parser.parse_args()
    env = GAMES[args.game]()
    try:
        client = MultiAgentClient(args.host, args.port, client_name=f"{args.game}-{args.seed}", seed=args.seed,
                                  reconnect_timeout_s=5)
        run_parallel_env(client, env, max_episodes=args.max_episodes, seed=args.seed * 1_000_000)
        client.flush()
    except (TetherConnectionError, KeyboardInterrupt):
        pass  # training finished and the server went away


if __name__ == "__main__":
    main()
