"""A loop-style helper: drive a gymnasium-style env through a TetherClient."""

from __future__ import annotations

from typing import Any, Callable

from .client import TetherClient


def run_env(
    client: TetherClient,
    env: Any,
    max_steps: int | None = None,
    max_episodes: int | None = None,
    training_enabled: bool = True,
    deterministic: bool = False,
    on_episode_end: Callable[[float, int], bool | None] | None = None,
) -> list[float]:
    """Run episodes of ``env`` (reset/step API of gymnasium) with the client's policy. An episode
    with environment parameters (protocol §19) resets the env with ``options={"env_params": values}``.

    Stops after ``max_steps`` env steps or ``max_episodes`` episodes, when
    ``on_episode_end(return, length)`` returns True, or, for training episodes,
    at the end of the episode during which the server said training is done
    (``client.training_done``). Returns episode returns.
    """
    returns: list[float] = []
    steps = 0
    while (max_steps is None or steps < max_steps) and (max_episodes is None or len(returns) < max_episodes):
        eid = client.start_episode(training_enabled=training_enabled and not deterministic)
        values = client.episode_params(eid)
        obs, _ = env.reset(options={"env_params": values}) if values else env.reset()
        length = 0
        while True:
            action = client.compute_action(obs, eid) if deterministic else client.get_action(eid, obs)
            obs, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(eid, reward)
            steps += 1
            length += 1
            if terminated or truncated:
                returns.append(client.end_episode(eid, obs, truncated=truncated and not terminated))
                break
        if on_episode_end is not None and on_episode_end(returns[-1], length):
            break
        if training_enabled and not deterministic and client.training_done is not None:
            break
    return returns
