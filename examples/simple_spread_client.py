"""mpe2 simple_spread_v3 (N=3, 25 cycles, discrete actions) as an external multi-agent client.

Start the server with one of the configs, then this client::

    tether serve --config examples/configs/simple_spread.toml --port 5557          # shared module
    tether serve --config examples/configs/simple_spread_mappo.toml --port 5557    # + centralized critic
    python examples/simple_spread_client.py --port 5557
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mpe2 import simple_spread_v3  # noqa: E402

from multiagent.pettingzoo_adapter import run_parallel_env  # noqa: E402
from sdk_python import MultiAgentClient, TetherConnectionError  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5555)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-episodes", type=int, default=None)
    args = parser.parse_args()
    env = simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=False)
    try:
        client = MultiAgentClient(args.host, args.port, client_name=f"spread-{args.seed}", seed=args.seed,
                                  reconnect_timeout_s=5)
        run_parallel_env(client, env, max_episodes=args.max_episodes, seed=args.seed * 1_000_000)
        client.flush()
    except (TetherConnectionError, KeyboardInterrupt):
        pass


if __name__ == "__main__":
    main()
