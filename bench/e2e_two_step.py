"""End to end: the grouped two-step game to its optimum.

Starts ``tether serve --config examples/configs/two_step_game.toml`` (agent_0
and agent_1 grouped into one agent, one module) and one client process
(examples/pettingzoo_client.py --game two_step, the PettingZoo env through the
multi-agent SDK), and prints one JSON object::

    {"time_to_8_s": ..., "env_steps_to_8": ..., ...}

from server start until the mean return over the last 100 episodes is >= 7.95
(the optimum is 8.0). RLlib 2.60's two_step_game_with_grouped_agents.py needed
60k env steps and 978 s on this kind of machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    REPO_ROOT,
    add_run_arguments,
    begin,
    emit,
    pettingzoo_client,
    run_server_with_clients,
    target_reached,
)

TARGET = 7.95


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-env-steps", type=int, default=100_000, help="budget (default: 100000)")
    add_run_arguments(parser, timeout_s=180.0, server_args=False)
    args = parser.parse_args(argv)
    port = begin(args)
    run = run_server_with_clients(
        ["--config", str(REPO_ROOT / "examples/configs/two_step_game.toml"), "--stop-at-return", str(TARGET),
         "--max-env-steps", str(args.max_env_steps), "--seed", str(args.seed)],
        [pettingzoo_client("two_step", port, args.seed)],
        port, args.timeout, args.show_server_output,
    )
    summary = run["summary"]
    seconds, env_steps = target_reached(run)
    result = {
        "time_to_8_s": seconds,
        "env_steps_to_8": env_steps,
        "reached": seconds is not None,
        "seed": args.seed,
        "return_mean_final": summary.get("return_mean"),
        "server_listening_s": round(run["listening_s"], 3),
        "updates": summary.get("updates"),
        "wall_s": round(run["wall_s"], 3),
        **run["load"],
    }
    emit(result)
    return 0 if result["reached"] else 1


if __name__ == "__main__":
    sys.exit(main())
