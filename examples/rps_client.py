"""Rock-paper-scissors (PettingZoo classic rps_v2): a learned policy against fixed heuristics.

player_0 is trained by Tether (module "learner"); player_1 is played here by
one of two heuristics, picked at random per episode, as in RLlib's
rock-paper-scissors example:

- repeat_last: plays its own previous move again (a random first move);
- beat_last: plays the move that beats player_0's previous move.

The learner observes the last two rounds: both players' moves in each (one-hot,
4 values each: rock, paper, scissors, none). One round would not do for a policy
without memory: after a round it won, "repeat the winning move" is right against
repeat_last and wrong against beat_last, and only the round before tells the two
apart (repeat_last plays the same move twice). Start the server first::

    tether serve --config examples/configs/rps.toml --port 5558
    python examples/rps_client.py --port 5558
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tether.sdk import MultiAgentClient, TetherConnectionError  # noqa: E402

NONE = 3
BEATS = {0: 1, 1: 2, 2: 0}  # the move that beats rock (0) is paper (1), ...


def features(history: list[tuple[int, int]]) -> np.ndarray:
    """One-hot (opponent's move, own move) for the last round, then the one before."""
    x = np.zeros(16, np.float32)
    for i, (opponent, own) in enumerate(history[-1:-3:-1]):
        x[8 * i + opponent] = 1.0
        x[8 * i + 4 + own] = 1.0
    return x


def heuristic_move(kind: str, own_last: int, learner_last: int, rng: random.Random) -> int:
    if kind == "repeat_last":
        return own_last if own_last != NONE else rng.randrange(3)
    return BEATS[learner_last] if learner_last != NONE else rng.randrange(3)


def play(client: MultiAgentClient, episodes: int, rng: random.Random, greedy: bool = False) -> dict[str, list[float]]:
    """Episodes of rps_v2; returns player_0's return per episode, by heuristic."""
    from pettingzoo.classic import rps_v2

    env = rps_v2.parallel_env(max_cycles=30)
    results: dict[str, list[float]] = {"repeat_last": [], "beat_last": []}
    for _ in range(episodes):
        kind = rng.choice(list(results))
        env.reset(seed=rng.randrange(1 << 30))
        eid = client.start_episode(training_enabled=not greedy)
        mine = theirs = NONE
        history = [(NONE, NONE), (NONE, NONE)]
        total = 0.0
        while env.agents:
            obs = {"player_0": features(history)}
            move = client.compute_actions(obs)["player_0"] if greedy else client.get_action(eid, obs)["player_0"]
            their_move = heuristic_move(kind, theirs, mine, rng)
            _, rewards, terminations, truncations, _ = env.step({"player_0": int(move), "player_1": their_move})
            client.log_returns(eid, {"player_0": rewards["player_0"]})
            total += rewards["player_0"]
            mine, theirs = int(move), their_move
            history.append((theirs, mine))
        client.end_episode(eid, {"player_0": features(history)}, truncated=True)
        results[kind].append(total)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5555)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--episodes", type=int, default=600, help="training episodes")
    parser.add_argument("--updates", type=int, default=0,
                        help="go on past --episodes until the model has had this many updates (at most 7x the "
                             "episodes): a loaded machine trains fewer updates on the same episodes")
    parser.add_argument("--eval-episodes", type=int, default=40, help="greedy evaluation episodes afterwards")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    try:
        client = MultiAgentClient(args.host, args.port, client_name="rps", seed=args.seed, reconnect_timeout_s=5)
        play(client, args.episodes, rng)
        for _ in range(6 * args.episodes // 50):
            if client.weights_seq_nos.get("learner", 0) >= args.updates:
                break
            play(client, 50, rng)
        client.flush()
        client.refresh_weights()
        evaluation = play(client, args.eval_episodes, rng, greedy=True)
        print(json.dumps({**{k: float(np.mean(v)) if v else None for k, v in evaluation.items()},
                          "updates": client.weights_seq_nos.get("learner", 0)}), flush=True)
    except (TetherConnectionError, KeyboardInterrupt):
        pass


if __name__ == "__main__":
    main()
