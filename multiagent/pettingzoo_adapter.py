"""Runs any PettingZoo game as an external Tether client.

``run_parallel_env`` drives a ParallelEnv and ``run_aec_env`` an AECEnv
through a ``MultiAgentClient``: the env stays on this side, actions come from
the client's local ONNX models, experience goes to the server.
"""

from __future__ import annotations

from typing import Any, Callable

from tether.sdk.multi_agent_client import MultiAgentClient


def run_parallel_env(
    client: MultiAgentClient,
    env: Any,
    max_episodes: int | None = None,
    max_steps: int | None = None,
    training_enabled: bool = True,
    seed: int | None = None,
    on_episode_end: Callable[[dict[str, float]], bool | None] | None = None,
) -> list[dict[str, float]]:
    """Play episodes of a PettingZoo ParallelEnv; returns each episode's returns per actor.

    An env with an ``acting_agents()`` method (agents acting at their own rates,
    e.g. the levels of a hierarchy) has only those agents' actions computed;
    the others' observations still arrive, and their rewards still accumulate.

    Stops after ``max_episodes`` episodes or ``max_steps`` env steps, or when
    ``on_episode_end(returns)`` returns True.
    """
    results: list[dict[str, float]] = []
    steps = 0
    episode = 0
    while (max_episodes is None or episode < max_episodes) and (max_steps is None or steps < max_steps):
        obs, _ = env.reset(seed=None if seed is None else seed + episode)
        episode += 1
        eid = client.start_episode(training_enabled=training_enabled)
        all_truncated = True
        while env.agents:
            acting = env.acting_agents() if hasattr(env, "acting_agents") else list(env.agents)
            actions = client.get_action(eid, {a: obs[a] for a in acting})
            # Agents that live but do not act now (a hierarchy's upper level) still need an action.
            full = {a: actions[a] if a in actions else env.action_space(a).sample() for a in env.agents}
            obs, rewards, terminations, truncations, _ = env.step(full)
            steps += 1
            client.log_returns(eid, rewards)
            done = [a for a in rewards if terminations.get(a) or truncations.get(a)]
            if done:
                truncated = {a: bool(truncations.get(a)) and not terminations.get(a) for a in done}
                all_truncated = all_truncated and all(truncated.values())
                client.end_agents(eid, {a: obs[a] for a in done}, truncated)
        results.append(client.end_episode(eid, {}, truncated=all_truncated))
        if on_episode_end is not None and on_episode_end(results[-1]):
            break
    return results


def run_aec_env(
    client: MultiAgentClient,
    env: Any,
    max_episodes: int = 1,
    training_enabled: bool = True,
    seed: int | None = None,
) -> list[dict[str, float]]:
    """Play episodes of a PettingZoo AECEnv (agents act in turn); returns per-actor returns.

    ``env.last()`` gives the acting agent's reward accumulated since its
    previous turn, which is exactly what ``log_returns`` attributes to that
    agent's last action.
    """
    results = []
    for episode in range(max_episodes):
        env.reset(seed=None if seed is None else seed + episode)
        eid = client.start_episode(training_enabled=training_enabled)
        for agent in env.agent_iter():
            obs, reward, terminated, truncated, _ = env.last()
            client.log_returns(eid, {agent: reward})
            if terminated or truncated:
                client.end_agents(eid, {agent: obs}, truncated=bool(truncated) and not terminated)
                env.step(None)
            else:
                env.step(client.get_action(eid, {agent: obs})[agent])
        results.append(client.end_episode(eid, {}))
    return results
