"""End-to-end benchmark: MinAtar Breakout (the ``minatar`` package), learned by PPO through the Python SDK.

``--clients`` processes of examples/minatar_client.py play Breakout-MinAtar (10x10x4 grid flattened
to 400 values, the minimal action set of 3, no sticky actions, episodes truncated at 1000 steps)
against a real server that trains an MLP (256, 256) for ``--max-env-steps`` env steps. A random
policy's mean return is measured in the same run.

A published PPO figure on the same setting (no sticky actions, 3 actions, 1000-step cap, an MLP of
2 x 256 on the flattened grid): gymnax's README (R. T. Lange, github.com/RobertTLange/gymnax, commit
fb7c953, environment table) gives PPO a return of 28 on Breakout-MinAtar after 10M steps; the run's
training log in gymnax-blines (commit 15b76af, agents/Breakout-MinAtar/ppo.pkl, with its ppo.yaml:
10M steps, 64 envs x 128 steps, lr 5e-4, gamma 0.999, clip 0.2) reads about 16 at 1M steps, about
21 at 5M and 28.04 at 9.98M (mean of 164 sampled-action test episodes, one seed). This bench runs
1M steps by default on a 2-core machine; its ``published_ppo_return_at_1m`` and
``published_ppo_return_at_10m`` keys repeat those figures beside ours.

Needs the ``minatar`` package (scripts/install.sh installs it). Prints one JSON object:
``return_mean_final`` (the server's windowed mean episode return at the end), ``random_return_mean``,
``env_steps``, ``episodes``, ``updates``, ``wall_s``, ``env_steps_per_s`` and the published figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO_ROOT, add_run_arguments, begin, emit, ensure_installed, run_server_with_clients  # noqa: E402

CLIENT = REPO_ROOT / "examples" / "minatar_client.py"
PUBLISHED_AT_1M = 16.0
PUBLISHED_AT_10M = 28.0


def main(argv: list[str] | None = None) -> int:
    import json
    import subprocess

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-env-steps", type=int, default=1_000_000, help="training budget (default: 1000000)")
    parser.add_argument("--clients", type=int, default=4, help="client processes (default: 4)")
    parser.add_argument("--random-episodes", type=int, default=500, help="episodes of the random baseline")
    add_run_arguments(parser, timeout_s=3600.0)
    args = parser.parse_args(argv)
    ensure_installed("scripts/install.sh", modules=["minatar"], what="bench/e2e_minatar.py")
    port = begin(args)
    baseline = subprocess.run([sys.executable, str(CLIENT), "--random", str(args.random_episodes), "--seed",
                               str(args.seed + 1000)], capture_output=True, text=True, check=True)
    random_mean = json.loads(baseline.stdout.strip().splitlines()[-1])["random_return_mean"]
    run = run_server_with_clients(
        ["--observation-space", json.dumps({"type": "Box", "shape": [400], "low": 0, "high": 1}),
         "--action-space", json.dumps({"type": "Discrete", "n": 3}), "--hidden-sizes", "256,256",
         "--train-batch-size", "8192", "--minibatch-size", "1024", "--num-epochs", "4", "--lr", "5e-4",
         "--gamma", "0.999", "--gae-lambda", "0.95", "--clip-coef", "0.2", "--ent-coef", "0.01",
         "--max-env-steps", str(args.max_env_steps), "--seed", str(args.seed), "--no-tensorboard", *args.server_arg],
        [[sys.executable, str(CLIENT), "--port", str(port), "--seed", str(args.seed + i)] for i in range(args.clients)],
        port, args.timeout, args.show_server_output,
    )
    summary = run["summary"]
    result = {
        "return_mean_final": summary.get("return_mean"),
        "random_return_mean": round(random_mean, 3),
        "published_ppo_return_at_1m": PUBLISHED_AT_1M,
        "published_ppo_return_at_10m": PUBLISHED_AT_10M,
        "env_steps": summary.get("env_steps"),
        "episodes": summary.get("episodes"),
        "updates": summary.get("updates"),
        "wall_s": round(run["wall_s"], 1),
        "env_steps_per_s": round(summary.get("env_steps", 0) / max(run["wall_s"], 1e-9), 1),
        "clients": args.clients,
        "seed": args.seed,
        **run["load"],
    }
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
