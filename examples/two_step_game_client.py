"""The two-step game (QMIX paper) as an external multi-agent client.

The server groups agent_0 and agent_1 into one agent ("team"); this client
speaks of the two agents only. Start the server first::

    tether serve --config examples/configs/two_step_game.toml --port 5556
    python examples/two_step_game_client.py --port 5556
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multiagent.envs.two_step_game import TwoStepGame  # noqa: E402
from multiagent.pettingzoo_adapter import run_parallel_env  # noqa: E402
from sdk_python import MultiAgentClient, TetherConnectionError  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5555)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-episodes", type=int, default=None)
    args = parser.parse_args()
    try:
        client = MultiAgentClient(args.host, args.port, client_name="two-step", seed=args.seed, reconnect_timeout_s=5)
        run_parallel_env(client, TwoStepGame(), max_episodes=args.max_episodes)
        client.flush()
    except (TetherConnectionError, KeyboardInterrupt):
        pass  # training finished and the server went away


if __name__ == "__main__":
    main()
