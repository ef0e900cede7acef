"""A client for multiagent/envs/memory_cue.py: a game only a policy with memory can win.

The cue shows at the first step only; the last step's action must name it. Start a server with a
recurrent model, then this client::

    tether serve --observation-space '{"type": "Box", "shape": [3], "dtype": "float32", "low": 0, "high": 1}' \\
        --action-space '{"type": "Discrete", "n": 2}' --model '{"recurrent": {"type": "lstm", "size": 32}}'
    python examples/memory_cue_client.py --port 5555

The client carries the model's state for every episode (protocol 1.5); this code never sees it.
After training it plays greedy episodes and prints their mean return: +1 is always right, 0 is
chance, the best any policy without memory can do.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multiagent.envs.memory_cue import MemoryCue  # noqa: E402
from tether.sdk import TetherClient, run_env  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="server address")
    parser.add_argument("--port", type=int, default=5555, help="server port")
    parser.add_argument("--seed", type=int, default=0, help="env and sampling seed")
    parser.add_argument("--cues", type=int, default=2, help="cues to tell apart")
    parser.add_argument("--length", type=int, default=6, help="steps per episode")
    parser.add_argument("--greedy-episodes", type=int, default=200, help="greedy episodes played after training")
    args = parser.parse_args()
    env = MemoryCue(args.cues, args.length)
    env.reset(seed=args.seed)
    client = TetherClient(args.host, args.port, client_name=f"memory-cue-{args.seed}", seed=args.seed)
    returns = run_env(client, env)
    greedy = run_env(client, env, max_episodes=args.greedy_episodes, deterministic=True)
    print(json.dumps({"episodes": len(returns), "training_done": client.training_done is not None,
                      "greedy_return": sum(greedy) / max(1, len(greedy))}), flush=True)
    client.close()


if __name__ == "__main__":
    main()
