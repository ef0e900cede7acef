"""End-to-end benchmark: PettingZoo's connect_four_v3 with action masks, against a random legal opponent.

The learner's seat sees the game's Dict observation (``observation``: the 6x7x2 board, ``action_mask``:
the 7 columns still open); the mask is applied inside the served model (§11.6), so the client samples
only legal moves. The opponent plays uniformly among its legal moves, inside the client
(multiagent/versus_random.py), so every game the learner plays is one env episode. A real server and
one client process (examples/tictactoe_client.py --game connect_four_v3) train for ``--max-env-steps``
env steps; then the client plays ``--eval-games`` greedy games. A random legal player's win rate is
measured in the same run, over as many games.

Prints one JSON object: ``greedy_win_rate``, ``random_win_rate``, ``greedy_illegal_moves`` and
``training_illegal_moves`` (both must be 0), ``training_games``, ``eval_games``, ``env_steps``,
``wall_s``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO_ROOT, add_run_arguments, begin, emit, log, spawn, stop, wait_for_port  # noqa: E402

CLIENT = REPO_ROOT / "examples" / "tictactoe_client.py"


def main(argv: list[str] | None = None) -> int:
    import json
    import time

    from multiagent.versus_random import random_win_rate

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-env-steps", type=int, default=200_000, help="training budget (default: 200000)")
    parser.add_argument("--eval-games", type=int, default=1000, help="greedy games after training (default: 1000)")
    add_run_arguments(parser, timeout_s=1800.0)
    args = parser.parse_args(argv)
    port = begin(args)
    random_rate = random_win_rate("connect_four_v3", games=args.eval_games, seed=args.seed + 100)
    space = subprocess.run([sys.executable, str(CLIENT), "--game", "connect_four_v3", "--print-space"],
                           capture_output=True, text=True, check=True).stdout.strip()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        server = spawn([sys.executable, "-m", "tether.server.cli", "serve", "--port", str(port), "--seed", str(args.seed),
                        "--observation-space", space, "--action-space", '{"type": "Discrete", "n": 7}',
                        "--max-env-steps", str(args.max_env_steps), "--logdir", str(Path(tmp) / "run"),
                        "--no-tensorboard", *args.server_arg, *([] if args.show_server_output else ["--quiet"])],
                       stdout=sys.stderr if args.show_server_output else subprocess.DEVNULL)
        try:
            wait_for_port(port, server, timeout_s=60)
            played = subprocess.run([sys.executable, str(CLIENT), "--game", "connect_four_v3", "--port", str(port),
                                     "--seed", str(args.seed + 1), "--eval-games", str(args.eval_games)],
                                    capture_output=True, text=True, timeout=args.timeout)
        finally:
            stop(server, grace_s=10.0)
    if played.returncode != 0:
        log(played.stderr[-3000:])
        return 1
    out = json.loads(played.stdout.strip().splitlines()[-1])
    result = {
        "greedy_win_rate": round(out["greedy"]["win_rate"], 3),
        "random_win_rate": round(random_rate, 3),
        "greedy_draw_rate": round(out["greedy"]["draw_rate"], 3),
        "greedy_illegal_moves": out["greedy"]["illegal_moves"],
        "training_illegal_moves": out["training"]["illegal_moves"],
        "training_games": out["training"]["games"],
        "eval_games": out["greedy"]["games"],
        "env_steps": args.max_env_steps,
        "training_done": out["training_done"],
        "wall_s": round(time.monotonic() - started, 1),
        "seed": args.seed,
    }
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
