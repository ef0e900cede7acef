"""The client program ``tether check-client`` runs against, written with the Python SDK.

It plays the checker's "echo env" (docs/check-client.md) through a
TetherClient: the spaces come from SET_CONFIG, the env executes exactly the
action the SDK returns, and every server refusal the SDK reports is printed
and survived. After ``--steps`` env steps it stays idle for ``--idle-s``
seconds (the SDK keeps the connection alive with heartbeats), then closes.

    tether check-client --port 5556 &
    python examples/check_client_python.py --port 5556
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from tether.sdk import ServerError, TetherClient  # noqa: E402

EPISODE_LENGTH = 10


class EchoEnv:
    """obs = [t / 10, the action the env executed last, 1]; reward = that action; 10 steps."""

    def reset(self) -> np.ndarray:
        self.t = 0
        return np.array([0.0, 0.0, 1.0], np.float32)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool]:
        executed = float(np.asarray(action, np.float64).ravel()[0])  # as given: the SDK already clipped it
        self.t += 1
        return np.array([self.t / EPISODE_LENGTH, executed, 1.0], np.float32), executed, self.t == EPISODE_LENGTH


def surviving(call: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """Run an SDK call; a refusal the server sent is reported, and the call is made again."""
    try:
        return call(*args, **kw)
    except ServerError as exc:
        print(f"server refused {exc.request or 'a request'}: {exc.code}: {exc.message}", flush=True)
        return call(*args, **kw)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5556)
    parser.add_argument("--steps", type=int, default=300, help="env steps to play (default: 300)")
    parser.add_argument("--idle-s", type=float, default=3.0, help="idle seconds before closing (default: 3)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    # The checker answers slowly on purpose and must see every batch: wait for room in the
    # send queue instead of dropping the oldest batches (docs/check-client.md, step 2).
    client = TetherClient(args.host, args.port, client_name="check-client-python", seed=args.seed,
                          reconnect_timeout_s=30.0, when_queue_full="wait")
    env = EchoEnv()
    steps = 0
    while steps < args.steps:
        obs = env.reset()
        episode = client.start_episode()
        while True:
            action = surviving(client.get_action, episode, obs)
            obs, reward, done = env.step(action)
            surviving(client.log_returns, episode, reward)
            steps += 1
            if done:
                surviving(client.end_episode, episode, obs)
                break
    time.sleep(args.idle_s)
    client.close()
    print(f"played {steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
