"""Tic-tac-toe with action masks: PettingZoo's tictactoe_v3 against a random legal opponent played by
this client (multiagent/versus_random.py), learned by a module whose observation is the game's Dict.

Start a server with the game's spaces (its ``action_mask`` leaf masks the moves, §11.6), then this
client::

    tether serve --observation-space "$(python examples/tictactoe_client.py --print-space)" \\
        --action-space '{"type": "Discrete", "n": 9}'
    python examples/tictactoe_client.py --port 5555

The model applies the mask inside its graph, so the client only ever samples legal moves. At the end
it plays ``--eval-games`` greedy games and prints one JSON line: win rate and illegal moves.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multiagent.versus_random import VersusRandom  # noqa: E402
from tether.protocol.spaces import from_gymnasium  # noqa: E402
from tether.sdk import TetherClient, run_env  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="server address")
    parser.add_argument("--port", type=int, default=5555, help="server port")
    parser.add_argument("--seed", type=int, default=0, help="game and sampling seed")
    parser.add_argument("--game", default="tictactoe_v3", help="a two-player PettingZoo classic game with masks")
    parser.add_argument("--eval-games", type=int, default=1000, help="greedy games played after training")
    parser.add_argument("--print-space", action="store_true", help="print the observation space's JSON and exit")
    args = parser.parse_args()
    env = VersusRandom(args.game, seed=args.seed)
    if args.print_space:
        print(json.dumps(from_gymnasium(env.observation_space).to_json()))
        return
    client = TetherClient(args.host, args.port, client_name=f"{args.game}-{args.seed}", seed=args.seed)
    run_env(client, env)
    trained = {"games": env.games, "illegal_moves": env.illegal_moves, "win_rate": env.wins / max(1, env.games)}
    env.illegal_moves = env.wins = env.losses = env.draws = 0
    if client.policy is not None:
        run_env(client, env, max_episodes=args.eval_games, deterministic=True)
    print(json.dumps({"training_done": client.training_done is not None, "training": trained,
                      "greedy": {"games": env.games, "illegal_moves": env.illegal_moves,
                                 "win_rate": env.wins / max(1, env.games), "draw_rate": env.draws / max(1, env.games)}}),
          flush=True)
    client.close()


if __name__ == "__main__":
    main()
