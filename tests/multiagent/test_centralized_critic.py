"""A centralized critic sees the other agents and tells apart the agents of one module.

Here each agent's reward is its own observation minus the other agent's. A critic
that sees only the agent's own observation cannot know the other's (it explains
about half of the variance); one that sees only ``value_obs`` (both observations,
shared by both agents) cannot tell which agent it values, and the rewards of the
two are opposite (it explains nothing). Tether's critic sees ``value_obs`` and then
the agent's own observation (MAPPO's agent-specific global state): it needs both.
"""

from __future__ import annotations

import numpy as np

from tether.protocol import Discrete, EpisodeChunk
from tether.protocol.spaces import box
from tether.server.learner import PPOHyperparams, PPOLearner, build_batch

OBS_DIM = 2
AGENTS = 2


def two_agent_chunks(n: int, rng: np.random.Generator) -> list[EpisodeChunk]:
    """One-step episodes of two agents; each agent's reward is the first entry of its
    own observation minus the other's, and both see the same value_obs (both observations)."""
    chunks = []
    for _ in range(n):
        own = rng.uniform(-1, 1, (AGENTS, 2, OBS_DIM)).astype(np.float32)  # agent, (o_0, o_1), obs
        shared = np.concatenate([own[a] for a in range(AGENTS)], axis=1)  # (2, AGENTS * OBS_DIM)
        for a in range(AGENTS):
            chunks.append(EpisodeChunk(
                obs=own[a], actions=np.array([int(rng.integers(2))]),
                rewards=np.array([own[a, 0, 0] - own[1 - a, 0, 0]], np.float32),
                action_logp=np.array([np.log(0.5)], np.float32), action_dist_inputs=None,
                is_terminated=True, is_truncated=False, value_obs=shared))
    return chunks


def test_batch_rows_are_value_obs_then_own_obs() -> None:
    chunks = two_agent_chunks(3, np.random.default_rng(0))
    batch = build_batch(chunks)
    assert batch.all_value_obs is not None
    assert batch.all_value_obs.shape == (len(chunks) * 2, AGENTS * OBS_DIM + OBS_DIM)
    np.testing.assert_array_equal(batch.all_value_obs[:, : AGENTS * OBS_DIM], np.concatenate([c.value_obs for c in chunks]))
    np.testing.assert_array_equal(batch.all_value_obs[:, AGENTS * OBS_DIM :], batch.all_obs)


def explained_variance_after_training(value_obs_dim: int | None, strip_value_obs: bool = False) -> float:
    rng = np.random.default_rng(0)
    learner = PPOLearner(box(-1, 1, (OBS_DIM,)), Discrete(2),
                         PPOHyperparams(lr=3e-3, num_epochs=10, minibatch_size=128), seed=0,
                         value_obs_dim=value_obs_dim)

    def batch():
        chunks = two_agent_chunks(256, rng)
        if strip_value_obs:
            for chunk in chunks:
                chunk.value_obs = None
        return build_batch(chunks)

    for _ in range(3):
        learner.update(batch())
    # explained_variance is measured with the values before this update's steps.
    return learner.update(batch())["explained_variance"]


def test_critic_learns_each_agents_return_from_the_others_observations() -> None:
    """Explained variance of the value predictions, against a critic that sees only the agent's
    own observation, trained the same way in the same test: that one cannot explain the other
    agent's part of the reward (about half the variance)."""
    centralized = explained_variance_after_training(AGENTS * OBS_DIM)
    own_only = explained_variance_after_training(None, strip_value_obs=True)
    assert own_only < 0.65, own_only
    assert centralized > 0.8 and centralized > own_only + 0.2, (centralized, own_only)


def test_off_policy_steps_without_logp_train_a_centralized_critic_module() -> None:
    """Missing behaviour logp is filled in with the current policy; the critic
    input of that pass must be the centralized one (it crashed on a width mismatch)."""
    rng = np.random.default_rng(1)
    learner = PPOLearner(box(-1, 1, (OBS_DIM,)), Discrete(2), PPOHyperparams(minibatch_size=64), seed=0,
                         value_obs_dim=AGENTS * OBS_DIM)
    chunks = two_agent_chunks(64, rng)
    for chunk in chunks:
        chunk.action_logp = None
    stats = learner.update(build_batch(chunks))
    assert np.isfinite(stats["value_loss"]) and stats["value_loss"] > 0
