"""End to end, continuous actions: gymnasium Pendulum-v1 until the mean return
of the last 100 episodes reaches -300.

Starts ``tether serve`` with examples/configs/pendulum.toml and
``--stop-at-return -300``, and ``--clients`` processes of
examples/pendulum_client.py as soon as it listens. The clock starts just before
the server is launched and stops at the server's own ``reached_target_at``.
After the run, the final policy.onnx plays ``--eval-episodes`` episodes
(sampled, as in training) and a uniformly random policy plays as many, both
here. Prints one JSON object on stdout::

    {"env_steps_to_-300": 58000, "time_to_-300_s": 41.2, "return_final": -190.5,
     "return_random": -1210.3, "reached": true, ...}

``return_final`` is the final policy's mean return over those episodes;
``env_steps_to_-300`` and ``time_to_-300_s`` are null when the target was not
reached within ``--max-env-steps`` or ``--timeout``. A random policy scores about -1200.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    REPO_ROOT,
    add_run_arguments,
    begin,
    child_env,
    log,
    run_server_with_clients,
)

TARGET = -300.0
CLIENT = REPO_ROOT / "examples" / "pendulum_client.py"


def evaluate(policy: str, episodes: int, seed: int) -> float:
    """Mean return of ``policy`` (a policy.onnx path, or "random") over ``episodes`` episodes."""
    out = subprocess.run([sys.executable, str(CLIENT), "--evaluate", policy, "--episodes", str(episodes),
                          "--seed", str(seed)], capture_output=True, text=True, check=True, env=child_env())
    return json.loads(out.stdout.strip().splitlines()[-1])["return_mean"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO_ROOT / "examples/configs/pendulum.toml"),
                        help="server TOML config (default: examples/configs/pendulum.toml)")
    parser.add_argument("--clients", type=int, default=1, help="client processes (default: 1)")
    parser.add_argument("--max-env-steps", type=int, default=200_000, help="env-step budget (default: 200000)")
    parser.add_argument("--eval-episodes", type=int, default=20, help="episodes for return_final (default: 20)")
    add_run_arguments(parser, timeout_s=300.0)
    args = parser.parse_args(argv)
    port = begin(args)
    with tempfile.TemporaryDirectory(prefix="tether-pendulum-") as tmp:
        # Our own logdir (the later flag wins): the final policy.onnx outlives the run.
        logdir = Path(tmp) / "run"
        run = run_server_with_clients(
            ["--config", args.config, "--stop-at-return", str(TARGET), "--seed", str(args.seed),
             "--max-env-steps", str(args.max_env_steps), "--no-tensorboard", "--logdir", str(logdir),
             *args.server_arg],
            [[sys.executable, str(CLIENT), "--port", str(port), "--seed", str(args.seed + i), "--reconnect-timeout", "2"]
             for i in range(args.clients)],
            port, args.timeout, args.show_server_output,
        )
        summary = run["summary"]
        policy = logdir / "policy.onnx"
        final = evaluate(str(policy), args.eval_episodes, 10_000) if policy.exists() else None
    reached_at = summary.get("reached_target_at")
    reached = reached_at is not None
    result = {
        "env_steps_to_-300": summary.get("env_steps_at_target") if reached else None,
        "time_to_-300_s": round(reached_at - run["t0"], 3) if reached else None,
        "return_final": None if final is None else round(final, 1),
        "return_random": round(evaluate("random", args.eval_episodes, 10_000), 1),
        "reached": reached,
        "return_mean_at_stop": summary.get("return_mean"),
        "env_steps_total": summary.get("env_steps"),
        "updates": summary.get("updates"),
        "wall_s": round(run["wall_s"], 1),
        "clients": args.clients,
        "seed": args.seed,
        "config": Path(args.config).name,
        **run["load"],
    }
    if args.server_arg:
        result["server_args"] = args.server_arg
    log(json.dumps(result))
    print(json.dumps(result), flush=True)
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())
