"""A CartPole SDK client that runs until a stop file appears, then flushes and
prints what it delivered as one JSON line. Used by integration tests."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gymnasium as gym  # noqa: E402

from tether.sdk import TetherClient, run_env  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    stop = Path(args.stop_file)
    client = TetherClient("127.0.0.1", args.port, client_name="stoppable", seed=args.seed, reconnect_timeout_s=30)
    env = gym.make("CartPole-v1")
    env.reset(seed=args.seed)
    first_seq = client.weights_seq_no
    run_env(client, env, on_episode_end=lambda ret, length: stop.exists())
    client.flush()
    print(json.dumps({"env_steps_sent": client.env_steps_sent, "first_weights_seq_no": first_seq,
                      "weights_seq_no": client.weights_seq_no, "reconnects": client.reconnects}), flush=True)
    client.close()


if __name__ == "__main__":
    main()
