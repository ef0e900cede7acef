"""Stateless CartPole: CartPole-v1 without its velocities (position and angle only, as RLlib's
stateless CartPole example), learned by a policy with memory (an LSTM) and by an MLP on the same
budget. Without memory the velocities cannot be inferred, so the MLP plateaus far below 450.

Each network runs as e2e_cartpole.py runs: the clock starts before the server starts, one
``examples/cartpole_client.py --no-velocities`` process plays, the server stops at a mean return of
450 over the last 100 episodes (``--stop-at-return``) or at the ``--max-env-steps`` budget. Prints one
JSON object with both::

    {"lstm_env_steps_to_450": 180000, "lstm_time_to_450_s": 400.2, "lstm_return_mean_final": 455.0,
     "mlp_env_steps_to_450": null, "mlp_time_to_450_s": null, "mlp_return_mean_final": 80.1, ...}

``*_to_450`` are null when the target was not reached; ``*_return_mean_final`` is then the mean return
of the last 100 episodes when the budget ran out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO_ROOT, add_run_arguments, begin, emit, log, run_server_with_clients, target_reached  # noqa: E402

TARGET = 450.0
#: CartPole's bounds for position and angle (the velocities' are infinite and left out).
SPACE = {"type": "Box", "shape": [2], "low": [-4.8, -0.41887903], "high": [4.8, 0.41887903]}
LSTM = {"recurrent": {"type": "lstm", "size": 64, "seq_len": 16, "burn_in": 4}}
MLP = {"encoder": "mlp"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-env-steps", type=int, default=300_000,
                        help="env-step budget of each run (default: 300000)")
    parser.add_argument("--only", choices=("lstm", "mlp"), default=None, help="run one network only")
    add_run_arguments(parser, timeout_s=1800.0)
    return parser.parse_args(argv)


def run_one(args: argparse.Namespace, port: int, model: dict) -> dict:
    client = [sys.executable, str(REPO_ROOT / "examples" / "cartpole_client.py"), "--port", str(port), "--seed",
              str(args.seed), "--reconnect-timeout", "2", "--no-velocities"]
    run_ = run_server_with_clients(
        ["--stop-at-return", str(TARGET), "--seed", str(args.seed), "--max-env-steps", str(args.max_env_steps),
         "--observation-space", json.dumps(SPACE), "--action-space", '{"type": "Discrete", "n": 2}',
         "--model", json.dumps(model), *args.server_arg],
        [client], port, args.timeout, args.show_server_output)
    seconds, env_steps = target_reached(run_)
    summary = run_["summary"]
    return {"env_steps_to_450": env_steps, "time_to_450_s": seconds, "return_mean_final": summary.get("return_mean"),
            "env_steps_total": summary.get("env_steps"), "wall_s": round(run_["wall_s"], 3)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    port = begin(args)
    result: dict = {"seed": args.seed, "max_env_steps": args.max_env_steps, "lstm_model": LSTM}
    for name, model in (("lstm", LSTM), ("mlp", MLP)):
        if args.only in (None, name):
            one = run_one(args, port, model)
            log(f"{name}: {one}")
            result.update({f"{name}_{key}": value for key, value in one.items()})
    emit(result, echo=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
