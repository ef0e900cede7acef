"""A multi-agent frame with logged and policy agents: N CartPoles played side by side as the agents
``cart_0 … cart_{N-1}`` of one episode. The even carts are played by a scripted expert whose actions
are reported with ``log_action`` in the same frame in which the odd carts ask the policy; one module
(the server's default, ``*``) serves them all, so the policy learns both from its own samples and by
cloning the expert's logged steps (``bc_coef``, protocol §13.7).

    python examples/scripted_team_client.py --port 5555 --agents 2 --max-steps 20000

Prints one JSON line when it stops: the mean return of the policy's carts over their last
``--last`` episodes, the expert's, and the counts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

from tether.sdk import MultiAgentClient  # noqa: E402

from experts import cartpole_expert  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--agents", type=int, default=2, help="carts (the even ones scripted)")
    parser.add_argument("--max-steps", type=int, default=20_000, help="env steps (frames) to play")
    parser.add_argument("--last", type=int, default=20, help="policy episodes averaged in the report")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    names = [f"cart_{i}" for i in range(args.agents)]
    envs = {name: gym.make("CartPole-v1") for name in names}
    client = MultiAgentClient(args.host, args.port, client_name=f"scripted-team-{args.seed}", seed=args.seed,
                              wait_for_weights=True)
    returns: dict[str, list[float]] = {"expert": [], "policy": []}
    frames = episode = 0
    try:
        while frames < args.max_steps:
            obs = {n: envs[n].reset(seed=args.seed * 100_000 + episode * args.agents + i)[0]
                   for i, n in enumerate(names)}
            totals = dict.fromkeys(names, 0.0)
            eid = client.start_episode()
            while obs and frames < args.max_steps:
                logged = {n: cartpole_expert(o) for n, o in obs.items() if int(n.split("_")[1]) % 2 == 0}
                actions = client.log_action(eid, obs, logged)
                rewards, ended, truncated = {}, {}, {}
                for name in list(obs):
                    obs[name], reward, term, trunc, _ = envs[name].step(actions[name])
                    rewards[name] = float(reward)
                    totals[name] += float(reward)
                    if term or trunc:
                        ended[name], truncated[name] = obs.pop(name), trunc and not term
                client.log_returns(eid, rewards)
                if ended:
                    client.end_agents(eid, ended, truncated)
                frames += 1
            client.end_episode(eid, obs)
            for name, total in totals.items():
                returns["expert" if int(name.split("_")[1]) % 2 == 0 else "policy"].append(total)
            episode += 1
        client.flush()
    finally:
        client.close()
    print(json.dumps({"episodes": episode, "frames": frames,
                      "policy_return_last": float(np.mean(returns["policy"][-args.last:])) if returns["policy"] else None,
                      "expert_return_mean": float(np.mean(returns["expert"])) if returns["expert"] else None,
                      "policy_returns": returns["policy"][-args.last:]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
