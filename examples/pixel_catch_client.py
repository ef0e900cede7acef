"""A client for multiagent/envs/pixel_catch.py: an engine whose agent sees only a camera image.

Start a server whose observation space is the image (a byte box) and whose network is a CNN, then
this client::

    tether serve --observation-space '{"type": "Box", "shape": [8, 8, 1], "dtype": "uint8", "low": 0, "high": 255}' \\
        --action-space '{"type": "Discrete", "n": 3}' --hidden-sizes 64 \\
        --model '{"encoder": "cnn", "image_shape": [8, 8, 1], "conv": [[16, 3, 1], [32, 3, 1]], "dense": 128}'
    python examples/pixel_catch_client.py --port 5555

The images go to the server as bytes (protocol 1.4); the model runs on them as they are.

``--composite`` plays the variant whose observation is a Dict of a camera (the ball only) and a
paddle vector (§8.6); its server is started with that Dict as the observation space (print it with
``--print-space``) and ``--model '{"encoder": "cnn", ...}'`` without ``image_shape`` (a CNN per image
leaf, the vector beside its features).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multiagent.envs.pixel_catch import PixelCatch  # noqa: E402
from tether.protocol.spaces import from_gymnasium  # noqa: E402
from tether.sdk import TetherClient, run_env  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="server address")
    parser.add_argument("--port", type=int, default=5555, help="server port")
    parser.add_argument("--seed", type=int, default=0, help="env and sampling seed")
    parser.add_argument("--max-steps", type=int, default=None, help="env steps to play (default: until training is done)")
    parser.add_argument("--composite", action="store_true", help="observe a Dict of camera and paddle vector")
    parser.add_argument("--print-space", action="store_true", help="print the observation space's JSON and exit")
    args = parser.parse_args()
    env = PixelCatch(composite=args.composite)
    if args.print_space:
        print(json.dumps(from_gymnasium(env.observation_space).to_json()))
        return
    env.reset(seed=args.seed)
    client = TetherClient(args.host, args.port, client_name=f"pixel-catch-{args.seed}", seed=args.seed)
    returns = run_env(client, env, max_steps=args.max_steps)
    # The learned policy, greedy, on fresh balls: its catch rate.
    greedy = run_env(client, env, max_episodes=200, deterministic=True) if client.policy is not None else []
    print(json.dumps({"episodes": len(returns), "training_done": client.training_done is not None,
                      "greedy_catch_rate": sum(r > 0 for r in greedy) / max(1, len(greedy))}), flush=True)
    client.close()


if __name__ == "__main__":
    main()
