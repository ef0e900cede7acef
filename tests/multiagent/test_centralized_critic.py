"""A centralized critic tells apart the agents of one module.

Agents of a module share ``value_obs`` (all agents' observations), so a critic
that sees only ``value_obs`` can learn no more than the average of their
returns. The critic also sees the agent's own observation (MAPPO's
agent-specific global state), so it can learn each agent's own return.
"""

from __future__ import annotations

import numpy as np

from tether.sdk.protocol import Discrete, EpisodeChunk
from tether.sdk.protocol.spaces import box
from tether.server.learner import PPOHyperparams, PPOLearner, build_batch

OBS_DIM = 2
AGENTS = 2


def two_agent_chunks(n: int, rng: np.random.Generator) -> list[EpisodeChunk]:
    """One-step episodes of two agents; each agent's reward is the first entry
    of its own observation, and both see the same value_obs (both observations)."""
    chunks = []
    for _ in range(n):
        own = rng.uniform(-1, 1, (AGENTS, 2, OBS_DIM)).astype(np.float32)  # agent, (o_0, o_1), obs
        shared = np.concatenate([own[a] for a in range(AGENTS)], axis=1)  # (2, AGENTS * OBS_DIM)
        for a in range(AGENTS):
            chunks.append(EpisodeChunk(
                obs=own[a], actions=np.array([int(rng.integers(2))]), rewards=np.array([own[a, 0, 0]], np.float32),
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


def test_critic_learns_each_agents_own_return() -> None:
    """Explained variance of the value predictions: a critic blind to which agent
    it values can explain at most half of the variance here (the residual of the
    best shared prediction, the mean of both rewards, has half the variance);
    one that sees the agent's own observation explains nearly all of it."""
    rng = np.random.default_rng(0)
    learner = PPOLearner(box(-1, 1, (OBS_DIM,)), Discrete(2),
                         PPOHyperparams(lr=3e-3, num_epochs=10, minibatch_size=128), seed=0,
                         value_obs_dim=AGENTS * OBS_DIM)
    for _ in range(3):
        learner.update(build_batch(two_agent_chunks(256, rng)))
    # explained_variance is measured with the values before this update's steps.
    stats = learner.update(build_batch(two_agent_chunks(256, rng)))
    assert stats["explained_variance"] > 0.8, stats


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
