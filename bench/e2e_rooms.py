"""Hierarchical vs flat PPO on the maze of rooms, same env-step budget.

Runs ``tether serve`` with examples/configs/rooms_hierarchical.toml (a top
level that picks the next room, low-level agents spawned per decision) and
then with rooms_flat.toml (one agent acting every step), each with one
client process for ``--env-steps`` env steps, and prints::

    {"hierarchical_success": ..., "flat_success": ..., "env_steps": ...}

success = mean return of the top-level agent (high_level / walker) over the
last 100 episodes, which is the fraction of episodes that reached the goal room.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO_ROOT, emit, free_port, install_cleanup, pettingzoo_client, run_server_with_clients  # noqa: E402


def train(mode: str, env_steps: int, seed: int, timeout: float) -> dict:
    port = free_port()
    run = run_server_with_clients(
        ["--config", str(REPO_ROOT / f"examples/configs/rooms_{mode}.toml"), "--max-env-steps", str(env_steps),
         "--seed", str(seed)],
        [pettingzoo_client(f"rooms_{mode}", port, seed)],
        port, timeout,
    )
    return {"summary": run["summary"], "wall_s": run["wall_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-steps", type=int, default=60_000, help="budget per run in env steps (default: 60000)")
    parser.add_argument("--seed", type=int, default=0, help="learner and client seed (default: 0)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run (default: 300)")
    args = parser.parse_args(argv)
    install_cleanup()
    # Each env step is one action of one agent in both modes, so agent steps = env steps.
    hier = train("hierarchical", args.env_steps, args.seed, args.timeout)
    flat = train("flat", args.env_steps, args.seed, args.timeout)
    result = {
        "hierarchical_success": round(hier["summary"]["module_return_mean"]["high"], 3),
        "flat_success": round(flat["summary"]["module_return_mean"]["walker"], 3),
        "env_steps": args.env_steps,
        "low_level_return": round(hier["summary"]["module_return_mean"]["low"], 3),
        "hierarchical_wall_s": round(hier["wall_s"], 1),
        "flat_wall_s": round(flat["wall_s"], 1),
        "seed": args.seed,
    }
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
