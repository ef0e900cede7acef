"""End-to-end benchmark: PettingZoo's connect_four_v3 (or, with ``--game``, tictactoe_v3) learned by
self-play alone (docs/self_play.md).

A real server with examples/configs/connect_four_selfplay.toml (one module on both seats, snapshots in
a window, prioritized opponents; tictactoe_selfplay.toml for tic-tac-toe) and ``--clients`` client processes (examples/selfplay_client.py: each
plays both seats; the server draws who learns and which snapshot plays the other side) train for
``--max-env-steps`` env steps. The final policy then plays ``--eval-games`` greedy games in both
seats, half each, against a random legal player and against a one-step lookahead (wins at once when it
can, blocks the other side's immediate win, else random); a random player is measured the same way in
the same run.

Prints one JSON object: ``win_rate_vs_random``, ``loss_rate_vs_random``, ``win_rate_vs_lookahead``,
``loss_rate_vs_lookahead``, ``random_win_rate_vs_random``, ``random_win_rate_vs_lookahead``,
``rating`` (the learning module's Elo), ``latest_snapshot_rating``, ``first_snapshot_rating`` (the
oldest snapshot still in the window), ``games_rated``, ``env_steps``, ``wall_s`` and
``train_s``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO_ROOT, add_run_arguments, begin, emit, log, spawn, stop, wait_for_port  # noqa: E402

CLIENT = REPO_ROOT / "examples" / "selfplay_client.py"
CONFIGS = {"connect_four_v3": REPO_ROOT / "examples" / "configs" / "connect_four_selfplay.toml",
           "tictactoe_v3": REPO_ROOT / "examples" / "configs" / "tictactoe_selfplay.toml"}


def evaluate(game: str, policy: str, opponent: str, games: int, seed: int) -> dict:
    out = subprocess.run([sys.executable, str(CLIENT), "--game", game, "--evaluate", policy,
                          "--opponent", opponent, "--games", str(games), "--seed", str(seed)],
                         capture_output=True, text=True, check=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", choices=sorted(CONFIGS), default="connect_four_v3",
                        help="the game, with its examples/configs/<game>_selfplay.toml (default: connect_four_v3)")
    parser.add_argument("--max-env-steps", type=int, default=300_000, help="training budget (default: 300000)")
    parser.add_argument("--clients", type=int, default=2, help="client processes (default: 2)")
    parser.add_argument("--eval-games", type=int, default=1000, help="games per evaluation (default: 1000)")
    add_run_arguments(parser, timeout_s=3600.0)
    args = parser.parse_args(argv)
    port = begin(args)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tether-bench-selfplay-") as tmp:
        run = Path(tmp) / "run"
        server = spawn([sys.executable, "-m", "tether.server.cli", "serve", "--config", str(CONFIGS[args.game]), "--port", str(port),
                        "--seed", str(args.seed), "--max-env-steps", str(args.max_env_steps), "--logdir", str(run),
                        "--summary-file", str(run / "summary.json"), "--no-tensorboard", *args.server_arg,
                        *([] if args.show_server_output else ["--quiet"])],
                       stdout=sys.stderr if args.show_server_output else subprocess.DEVNULL)
        clients = []
        try:
            wait_for_port(port, server, timeout_s=60)
            clients = [spawn([sys.executable, str(CLIENT), "--game", args.game, "--port", str(port),
                              "--seed", str(args.seed + 1 + i)], stdout=subprocess.DEVNULL)
                       for i in range(args.clients)]
            server.wait(timeout=args.timeout)
        finally:
            stop(server, grace_s=10.0)
            for client in clients:
                stop(client, grace_s=5.0)
        train_s = time.monotonic() - started
        summary_file = run / "summary.json"
        if not summary_file.exists():
            log("the server wrote no summary (see --show-server-output)")
            return 1
        summary = json.loads(summary_file.read_text())
        policy = str(run / "policy-player.onnx")
        results = {(who, opponent): evaluate(args.game, who, opponent, args.eval_games, args.seed + 7)
                   for who in (policy, "random") for opponent in ("random", "lookahead")}
    module = summary["self_play"]["modules"]["player"]
    snapshots = sorted(module["snapshots"], key=lambda s: s["version"])
    result = {
        "win_rate_vs_random": results[(policy, "random")]["win_rate"],
        "loss_rate_vs_random": results[(policy, "random")]["losses"] / args.eval_games,
        "win_rate_vs_lookahead": results[(policy, "lookahead")]["win_rate"],
        "loss_rate_vs_lookahead": results[(policy, "lookahead")]["losses"] / args.eval_games,
        "random_win_rate_vs_random": results[("random", "random")]["win_rate"],
        "random_win_rate_vs_lookahead": results[("random", "lookahead")]["win_rate"],
        "illegal_moves": results[(policy, "random")]["illegal_moves"] + results[(policy, "lookahead")]["illegal_moves"],
        "rating": module["rating"],
        "latest_snapshot_rating": round(snapshots[-1]["rating"], 2),
        "first_snapshot_rating": round(snapshots[0]["rating"], 2),
        "games_rated": summary["self_play"]["games_rated"],
        "game": args.game,
        "env_steps": summary["env_steps"],
        "clients": args.clients,
        "eval_games": args.eval_games,
        "train_s": round(train_s, 1),
        "wall_s": round(time.monotonic() - started, 1),
        "seed": args.seed,
    }
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
