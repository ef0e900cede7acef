"""PPO math on tiny fixed data: the clipped surrogate, and that an update
moves the policy toward advantageous actions."""

from __future__ import annotations

import numpy as np
import torch

from tether.sdk.protocol import Box, Discrete, EpisodeChunk
from tether.sdk.protocol.spaces import box
from tether.server.learner import PPOHyperparams, PPOLearner, build_batch
from tether.server.learner.distributions import ActionDistribution


def bandit_chunks(n: int, rng: np.random.Generator) -> list[EpisodeChunk]:
    """One-step episodes: action 1 pays 1, action 0 pays 0; logp from a uniform policy."""
    chunks = []
    for _ in range(n):
        a = int(rng.integers(2))
        chunks.append(EpisodeChunk(
            obs=np.zeros((2, 3), np.float32), actions=np.array([a]), rewards=np.array([float(a)], np.float32),
            action_logp=np.array([np.log(0.5)], np.float32), action_dist_inputs=None,
            is_terminated=True, is_truncated=False))
    return chunks


def prob_of_action_1(learner: PPOLearner) -> float:
    with torch.no_grad():
        logits = learner.model.dist_inputs(torch.zeros(1, 3))
    return float(torch.softmax(logits, -1)[0, 1])


def test_update_moves_policy_toward_rewarded_action() -> None:
    rng = np.random.default_rng(0)
    obs_space = box(-1, 1, (3,))
    learner = PPOLearner(obs_space, Discrete(2), PPOHyperparams(lr=3e-3, num_epochs=4, minibatch_size=64), seed=0)
    before = prob_of_action_1(learner)
    stats = learner.update(build_batch(bandit_chunks(256, rng)))
    after = prob_of_action_1(learner)
    assert abs(before - 0.5) < 0.01
    assert after > before + 0.05
    assert stats["approx_kl"] > 0 and stats["entropy"] > 0


def test_clipping_limits_how_far_one_update_moves_the_policy() -> None:
    """Same data and steps: a tight clip moves p(action 1) far less than no clip."""

    def moved(clip: float) -> float:
        learner = PPOLearner(box(-1, 1, (3,)), Discrete(2),
                             PPOHyperparams(lr=1e-3, num_epochs=30, minibatch_size=256, clip_coef=clip), seed=1)
        learner.update(build_batch(bandit_chunks(256, np.random.default_rng(1))))
        return prob_of_action_1(learner) - 0.5

    tight, loose = moved(0.02), moved(100.0)
    assert loose > 0.1
    assert 0 < tight < loose / 2


def test_box_log_prob_and_entropy_formulas() -> None:
    space = Box(low=np.full(2, -1.0), high=np.full(2, 1.0))
    inputs = torch.tensor([[0.1, -0.2, -0.5, 0.3]])
    dist = ActionDistribution(space, inputs)
    normal = torch.distributions.Normal(inputs[:, :2], inputs[:, 2:].exp())
    action = torch.tensor([[0.3, 0.0]])
    assert torch.allclose(dist.log_prob(action), normal.log_prob(action).sum(-1))
    assert torch.allclose(dist.entropy(), normal.entropy().sum(-1))


def test_missing_logp_is_filled_with_current_policy() -> None:
    rng = np.random.default_rng(2)
    chunks = bandit_chunks(64, rng)
    for c in chunks:
        c.action_logp = None
    learner = PPOLearner(box(-1, 1, (3,)), Discrete(2), PPOHyperparams(num_epochs=1, minibatch_size=64), seed=2)
    stats = learner.update(build_batch(chunks))
    assert np.isfinite(stats["policy_loss"]) and stats["approx_kl"] < 1e-6
