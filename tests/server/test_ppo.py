"""PPO math on tiny fixed data: the clipped surrogate, and that an update
moves the policy toward advantageous actions."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from tether.protocol import Box, Discrete, EpisodeChunk
from tether.protocol.spaces import box
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
    """Steps sent without action_logp (off-policy EPISODES) are trained as if
    they carried the current policy's logp: the update moves the policy, and
    exactly as far as the same update given those logps explicitly. (A
    statistic taken before the first optimizer step, such as the first
    minibatch's KL, is 0 whatever the fill is.)"""
    rng = np.random.default_rng(2)
    hp = PPOHyperparams(lr=3e-3, num_epochs=4, minibatch_size=32)
    missing, explicit = (PPOLearner(box(-1, 1, (3,)), Discrete(2), hp, seed=2) for _ in range(2))
    warmup = bandit_chunks(64, rng)
    for learner in (missing, explicit):
        learner.update(build_batch(warmup))  # leave the uniform start: p(action 1) != 0.5
    chunks = bandit_chunks(128, rng)
    actions = torch.tensor([int(c.actions[0]) for c in chunks])
    with torch.no_grad():
        current_logp = torch.log_softmax(explicit.model.dist_inputs(torch.zeros(len(chunks), 3)), -1)
        current_logp = current_logp[torch.arange(len(chunks)), actions].numpy()
    for c, logp in zip(chunks, current_logp):
        c.action_logp = np.array([logp], np.float32)
    explicit.update(build_batch(chunks))
    before = prob_of_action_1(missing)
    for c in chunks:
        c.action_logp = None
    stats = missing.update(build_batch(chunks))
    after = prob_of_action_1(missing)

    assert abs(before - 0.5) > 0.01, "the warm-up moved the policy off uniform"
    assert np.isfinite(stats["policy_loss"])
    assert after > before + 0.03, (before, after)
    assert abs(after - prob_of_action_1(explicit)) < 1e-5, (after, prob_of_action_1(explicit))
    for p_missing, p_explicit in zip(missing.model.parameters(), explicit.model.parameters()):
        assert torch.allclose(p_missing, p_explicit, atol=1e-6)


def test_clip_vloss_keeps_the_value_within_clip_coef_of_its_old_prediction() -> None:
    """Returns of 100 where the critic predicts about 0: clipped, the value stops once it is clip_coef
    past its old prediction (give or take one optimizer step); unclipped, it goes much further."""
    def value_after(clip_vloss: bool) -> float:
        learner = PPOLearner(box(-1, 1, (3,)), Discrete(2),
                             PPOHyperparams(lr=3e-2, num_epochs=20, minibatch_size=64, clip_vloss=clip_vloss,
                                            clip_coef=0.2, gamma=0.0), seed=2)
        chunks = [replace(c, rewards=np.full(1, 100.0, np.float32)) for c in bandit_chunks(64, np.random.default_rng(2))]
        with torch.no_grad():
            before = float(learner.model.value(torch.zeros(1, 3)))
        learner.update(build_batch(chunks))
        with torch.no_grad():
            return float(learner.model.value(torch.zeros(1, 3))) - before

    clipped, free = value_after(True), value_after(False)
    assert 0 < clipped < free / 5, (clipped, free)


def test_norm_adv_off_uses_the_raw_advantages() -> None:
    """Every action pays 1 and the data has three times more action 1: normalised, all advantages are
    equal and cancel (the policy stays); raw, they are positive and the more frequent action gains."""
    def p1_after(norm_adv: bool) -> float:
        learner = PPOLearner(box(-1, 1, (3,)), Discrete(2),
                             PPOHyperparams(lr=1e-2, num_epochs=10, minibatch_size=256, norm_adv=norm_adv), seed=3)
        chunks = [EpisodeChunk(np.zeros((2, 3), np.float32), np.array([int(i % 4 != 0)]), np.ones(1, np.float32),
                               np.array([np.log(0.5)], np.float32), None, True, False) for i in range(256)]
        learner.update(build_batch(chunks))
        return prob_of_action_1(learner)

    assert abs(p1_after(True) - 0.5) < 0.01
    assert p1_after(False) > 0.55
