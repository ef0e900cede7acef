"""Runs any PettingZoo game as an external Tether client.

``run_parallel_env`` drives a ParallelEnv and ``run_aec_env`` an AECEnv
through a ``MultiAgentClient``: the env stays on this side, actions come from
the client's local ONNX models, experience goes to the server.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tether.protocol.multi_agent import group_spaces
from tether.protocol.spaces import Box, from_gymnasium
from tether.sdk.episode_recorder import same_space
from tether.sdk.multi_agent_client import MultiAgentClient


def check_group_spaces(client: MultiAgentClient, env: Any) -> None:
    """Raises ``ValueError`` when a group of the server's config whose members are this env's agents
    is served by a module whose spaces are not the members' spaces joined (docs/protocol.md §9.6,
    ``group_spaces``): the server only declares a group module's spaces, and a mismatch would
    otherwise show only as refused observations or actions that split wrongly, steps later.

    Checked where the client maps agents by rules (every module a group's rule can choose); with a
    server-side mapping function the module is known only once the server answers, and an env
    without ``possible_agents`` names no members: nothing is checked then. Bounds are compared at
    float32, as the wire carries them; a group of byte-box members (§8.1) may be served by a byte
    box of the joined bounds."""
    agents = set(getattr(env, "possible_agents", ()))
    if client.mapping is None or not agents:
        return
    for group in client.groups.values():
        if not set(group.members) <= agents:
            continue
        rule = next((r for r in client.mapping.rules if r.matches(group.group_id)), None)
        if rule is None:
            continue  # (an unmapped group is refused by the client when it acts, naming it)
        member_obs = [from_gymnasium(env.observation_space(m)) for m in group.members]
        try:
            obs, act = group_spaces(member_obs, [from_gymnasium(env.action_space(m)) for m in group.members])
        except ValueError as exc:
            raise ValueError(f"group {group.group_id!r}: its members' spaces cannot be joined: {exc}") from None
        all_bytes = all(isinstance(s, Box) and s.is_bytes for s in member_obs)
        for module_id in (rule.module,) if rule.module is not None else rule.choose_from:
            spec = client.modules.get(module_id)
            if spec is None:
                continue
            for what, joined, declared in (("observation", obs, spec.observation_space),
                                           ("action", act, spec.action_space)):
                if not _serves(declared, joined, what == "observation" and all_bytes):
                    raise ValueError(f"group {group.group_id!r}: module {module_id!r} has the {what} space "
                                     f"{declared.to_json()}, but the members' {what} spaces joined are "
                                     f"{joined.to_json()} (docs/protocol.md, groups)")


def _serves(declared: Any, joined: Any, bytes_allowed: bool) -> bool:
    """Whether a module's ``declared`` space is the ``joined`` one: the same kind and shape, bounds equal
    at float32; a byte box only where every member's observation is one (``bytes_allowed``)."""
    if isinstance(joined, Box):
        if not isinstance(declared, Box) or declared.shape != joined.shape:
            return False
        if declared.is_bytes and not bytes_allowed:
            return False
        return all(bool(np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32)))
                   for a, b in ((declared.low, joined.low), (declared.high, joined.high)))
    return same_space(declared, joined)


def _reset(env: Any, client: MultiAgentClient, episode_id: str, seed: int | None, map_ahead: bool = False) -> Any:
    """``env.reset`` for an episode just started: with its seed and, when the server sends environment
    parameters (protocol §19), ``options={"env_params": values}``, as the SDK's ``run_env`` does.
    ``map_ahead`` (agents acting in turn): the episode's agents are then mapped in one go (``map_agents``:
    one MAP_AGENTS for all of them when the server maps with a function, not one per agent at its first
    turn; a parallel env's first frame asks for all of its acting agents at once anyway). An env whose
    reset (or that mapping) fails leaves no episode open in the client (unless ending it fails too: that
    is told in a note on the reset's error, which is the one raised)."""
    values = client.episode_params(episode_id)
    try:
        reset = env.reset(seed=seed, **({"options": {"env_params": values}} if values else {}))
        if map_ahead:
            client.map_agents(episode_id, list(env.agents))
        return reset
    except BaseException as failure:
        try:
            client.end_episode(episode_id, {})  # (nothing was played: nothing is sent)
        except Exception as cleanup:  # (the reset's failure is the one to report, whatever else fails then)
            failure.add_note(f"ending the episode {episode_id!r} afterwards failed too: {cleanup!r}")
        raise


def run_parallel_env(
    client: MultiAgentClient,
    env: Any,
    max_episodes: int | None = None,
    max_steps: int | None = None,
    training_enabled: bool = True,
    seed: int | None = None,
    on_episode_end: Callable[[dict[str, float]], bool | None] | None = None,
) -> list[dict[str, float]]:
    """Play episodes of a PettingZoo ParallelEnv; returns each episode's returns per actor. An
    episode with environment parameters resets the env with ``options={"env_params": values}``.

    An env with an ``acting_agents()`` method (agents acting at their own rates,
    e.g. the levels of a hierarchy) has only those agents' actions computed;
    the others' observations still arrive, and their rewards still accumulate.

    Stops after ``max_episodes`` episodes or ``max_steps`` env steps, or when
    ``on_episode_end(returns)`` returns True.
    """
    check_group_spaces(client, env)
    results: list[dict[str, float]] = []
    steps = 0
    episode = 0
    while (max_episodes is None or episode < max_episodes) and (max_steps is None or steps < max_steps):
        eid = client.start_episode(training_enabled=training_enabled)
        obs, _ = _reset(env, client, eid, None if seed is None else seed + episode)
        episode += 1
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
    """Play episodes of a PettingZoo AECEnv (agents act in turn); returns per-actor returns. An
    episode with environment parameters resets the env with ``options={"env_params": values}``.

    ``env.last()`` gives the acting agent's reward accumulated since its
    previous turn, which is exactly what ``log_returns`` attributes to that
    agent's last action.
    """
    check_group_spaces(client, env)
    results = []
    for episode in range(max_episodes):
        eid = client.start_episode(training_enabled=training_enabled)
        _reset(env, client, eid, None if seed is None else seed + episode, map_ahead=True)
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
