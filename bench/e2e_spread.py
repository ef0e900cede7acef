"""End to end: mpe2 simple_spread_v3 (N=3, 25 cycles, discrete) for a fixed budget.

Starts ``tether serve`` with examples/configs/simple_spread.toml (one module
shared by the three agents; ``--config`` picks another, e.g. the MAPPO one)
and client process(es) running the PettingZoo env through the multi-agent
SDK, for ``--env-steps`` env steps (each env step is one action of each of
the 3 agents, so the server's budget is 3x that in agent steps). Prints::

    {"mean_agent_return_final": ..., "env_steps": ..., "wall_s": ...}

final = mean per-agent episode return over the last 100 episodes. Baselines on
this kind of machine: a uniformly random policy about -27; RLlib 2.60 PPO with
one shared module, same env and budget, -19.2 in 1456 s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO_ROOT, add_run_arguments, begin, emit, pettingzoo_client, run_server_with_clients  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-steps", type=int, default=300_000, help="budget in env steps (default: 300000)")
    parser.add_argument("--config", default=str(REPO_ROOT / "examples/configs/simple_spread.toml"),
                        help="server TOML config (default: examples/configs/simple_spread.toml)")
    parser.add_argument("--clients", type=int, default=1, help="client processes (default: 1)")
    add_run_arguments(parser, timeout_s=900.0)
    args = parser.parse_args(argv)
    port = begin(args)
    run = run_server_with_clients(
        ["--config", args.config, "--max-env-steps", str(args.env_steps), "--seed", str(args.seed),
         *args.server_arg],
        [pettingzoo_client("simple_spread", port, args.seed + i) for i in range(args.clients)],
        port, args.timeout, args.show_server_output,
    )
    summary = run["summary"]
    result = {
        "mean_agent_return_final": round(summary["agent_return_mean"], 3),
        "env_steps": summary["env_steps"],
        "wall_s": round(run["wall_s"], 1),
        "agent_steps": summary["agent_steps"],
        "episodes": summary["episodes"],
        "updates": summary["updates"],
        "config": Path(args.config).name,
        "clients": args.clients,
        "seed": args.seed,
        **run["load"],
    }
    if args.server_arg:
        result["server_args"] = args.server_arg
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
