"""End-to-end CartPole benchmark: wall time and env steps until the mean return
of the last 100 episodes reaches 450.

The clock starts just before the server subprocess is launched
(``python -m server.cli serve --stop-at-return 450 ...``) and stops at the
server's own ``reached_target_at`` (unix time, from its ``--summary-file``), so
server start-up, client start-up, connection, sampling and learning are all
inside the figure. N client processes of ``examples/cartpole_client.py`` are
started as soon as the server listens.

Prints one JSON object on stdout, e.g.::

    {"time_to_450_s": 14.2, "env_steps_to_450": 120000, "clients": 1, "seed": 0, "reached": true, ...}

``time_to_450_s`` and ``env_steps_to_450`` are null when the target was not
reached within ``--max-env-steps`` or ``--timeout``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO_ROOT, add_run_arguments, begin, emit, log, run_server_with_clients, target_reached  # noqa: E402

TARGET = 450.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1, help="number of CartPole client processes (default: 1)")
    parser.add_argument("--max-env-steps", type=int, default=300_000,
                        help="env-step budget; the server stops there (default: 300000)")
    add_run_arguments(parser, timeout_s=120.0)
    return parser.parse_args(argv)


def run(args: argparse.Namespace, port: int) -> dict:
    client_script = str(REPO_ROOT / "examples" / "cartpole_client.py")
    run_ = run_server_with_clients(
        ["--stop-at-return", str(TARGET), "--seed", str(args.seed), "--max-env-steps", str(args.max_env_steps),
         *args.server_arg],
        [[sys.executable, client_script, "--port", str(port), "--seed", str(args.seed + i), "--reconnect-timeout", "2"]
         for i in range(args.clients)],
        port, args.timeout, args.show_server_output,
    )
    summary = run_["summary"]
    seconds, env_steps = target_reached(run_)
    reached = seconds is not None
    result = {
        "time_to_450_s": seconds,
        "env_steps_to_450": env_steps,
        "clients": args.clients,
        "seed": args.seed,
        "reached": reached,
        "server_listening_s": round(run_["listening_s"], 3),
        "updates": summary.get("updates"),
        "env_steps_total": summary.get("env_steps"),
        "return_mean_final": summary.get("return_mean"),
        "wall_s": round(run_["wall_s"], 3),
        **run_["load"],
    }
    if args.server_arg:
        result["server_args"] = args.server_arg
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args, begin(args))
    log(f"{'reached' if result['reached'] else 'did NOT reach'} {TARGET:g}: {result}")
    emit(result, echo=False)
    return 0 if result["reached"] else 1


if __name__ == "__main__":
    sys.exit(main())
