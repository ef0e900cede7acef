"""Runs a PettingZoo game as an external multi-agent Tether client.

    tether serve --config examples/configs/simple_spread.toml --port 5557
    python examples/pettingzoo_client.py --game simple_spread --port 5557

Games: simple_spread (mpe2, N=3, 25 cycles, discrete), simple_tag (mpe2, 3
adversaries, 1 good agent, 2 obstacles, discrete), two_step (the grouped
two-step game), memory_cue (two agents, each remembering its own cue: a
module with memory), rooms_hierarchical and rooms_flat (the maze of 4 x 4 rooms
with a two-level hierarchy, or one flat agent), rooms_flat_2x2 (one flat agent
in 2 x 2 rooms). Each runs through multiagent.pettingzoo_adapter with the
multi-agent SDK; the server's config decides modules, mapping and groups.

Without a server, ``--evaluate`` plays trained or random policies against each
other and prints every module's mean per-agent episode return as JSON::

    python examples/pettingzoo_client.py --game simple_tag --config examples/configs/simple_tag.toml \
        --evaluate chaser=runs/tether/policy-chaser.onnx --evaluate runner=random --episodes 100

Each ``MODULE=POLICY`` names a policy.onnx file or ``random`` (uniform over the
agent's action space); the config's policy_mapping maps agents to modules.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tether.multiagent.pettingzoo_adapter import run_parallel_env  # noqa: E402
from tether.sdk import MultiAgentClient, TetherConnectionError  # noqa: E402


def _simple_spread() -> Any:
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=False)


def _simple_tag() -> Any:
    from mpe2 import simple_tag_v3

    return simple_tag_v3.parallel_env(num_good=1, num_adversaries=3, num_obstacles=2, max_cycles=25,
                                      continuous_actions=False)


def _two_step() -> Any:
    from tether.multiagent.envs.two_step_game import TwoStepGame

    return TwoStepGame()


def _memory_cue() -> Any:
    from tether.multiagent.envs.memory_cue import MemoryCueParallel

    return MemoryCueParallel(agents=2)


def _rooms(mode: str, rooms: int = 4) -> Callable[[], Any]:
    def make() -> Any:
        from tether.multiagent.envs.rooms_maze import RoomsMaze

        return RoomsMaze(mode=mode, rooms=rooms)

    return make


GAMES: dict[str, Callable[[], Any]] = {
    "simple_spread": _simple_spread,
    "simple_tag": _simple_tag,
    "two_step": _two_step,
    "memory_cue": _memory_cue,
    "rooms_hierarchical": _rooms("hierarchical"),
    "rooms_flat": _rooms("flat"),
    # 2 x 2 rooms: easy enough for flat PPO, which shows the flat baseline learns.
    "rooms_flat_2x2": _rooms("flat", rooms=2),
}


def evaluate(game: str, config_path: str, policies: dict[str, str], episodes: int, seed: int) -> dict[str, float]:
    """Mean per-agent episode return of each module, its agents played by the
    given policy.onnx (sampled, as in training) or uniformly at random."""
    import numpy as np

    from tether.sdk import OnnxPolicy
    from tether.protocol.distributions import to_env_action
    from tether.protocol.policy_mapping import PolicyMapping
    from tether.protocol.spaces import space_from_json

    with open(config_path, "rb") as f:
        config = tomllib.load(f)
    mapping = PolicyMapping.from_json(config["policy_mapping"])
    models = {
        module: None if path == "random" else OnnxPolicy(
            Path(path).read_bytes(), space_from_json(config["modules"][module]["action_space"]), seed=seed)
        for module, path in policies.items()
    }
    env = GAMES[game]()
    returns: dict[str, list[float]] = {}
    for episode in range(episodes):
        observations, _ = env.reset(seed=seed + episode)
        module_of = {agent: mapping.module_for(agent, str(episode)) for agent in env.possible_agents}
        for i, agent in enumerate(env.possible_agents):
            env.action_space(agent).seed(seed + 1000 * episode + i)
        totals = {agent: 0.0 for agent in env.agents}
        while env.agents:
            actions = {}
            # An env whose agents act at their own rates ignores the others' actions.
            acting = set(env.acting_agents()) if hasattr(env, "acting_agents") else set(observations)
            for agent, obs in observations.items():
                model = models[module_of[agent]]
                if model is None or agent not in acting:
                    actions[agent] = env.action_space(agent).sample()
                else:
                    action = model.sample(np.asarray(obs, np.float32).ravel())[0]
                    actions[agent] = to_env_action(model.action_space, action)
            observations, rewards, _, _, _ = env.step(actions)
            for agent, reward in rewards.items():
                totals[agent] = totals.get(agent, 0.0) + float(reward)
        for agent, total in totals.items():
            returns.setdefault(module_of[agent], []).append(total)
    return {module: float(np.mean(values)) for module, values in sorted(returns.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", choices=sorted(GAMES), required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5555)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-episodes", type=int, default=None)
    parser.add_argument("--evaluate", action="append", default=[], metavar="MODULE=POLICY",
                        help="no server: play MODULE with POLICY (a policy.onnx or 'random'); repeat per module")
    parser.add_argument("--config", help="the server's TOML config (its policy_mapping and modules), for --evaluate")
    parser.add_argument("--episodes", type=int, default=100, help="episodes for --evaluate")
    parser.add_argument("--no-wait-for-weights", dest="wait_for_weights", action="store_false",
                        help="keep playing while a batch is in flight, as a real-time engine must (default: a "
                             "simulator waits for the weights that answer each batch: synchronous PPO, the most "
                             "learning per env step)")
    args = parser.parse_args()
    if args.evaluate:
        if not args.config:
            parser.error("--evaluate needs --config")
        policies = dict(item.split("=", 1) for item in args.evaluate)
        print(json.dumps(evaluate(args.game, args.config, policies, args.episodes, args.seed)))
        return
    env = GAMES[args.game]()
    try:
        client = MultiAgentClient(args.host, args.port, client_name=f"{args.game}-{args.seed}", seed=args.seed,
                                  reconnect_timeout_s=5, wait_for_weights=args.wait_for_weights)
        run_parallel_env(client, env, max_episodes=args.max_episodes, seed=args.seed * 1_000_000)
        client.flush()
    except (TetherConnectionError, KeyboardInterrupt):
        pass  # training finished and the server went away


if __name__ == "__main__":
    main()
