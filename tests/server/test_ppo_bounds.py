"""PPO updates are bounded: every step is used, a few steps move the policy a
little, and a non-finite update is rolled back instead of published."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tether.protocol import Discrete, EpisodeChunk
from tether.protocol.spaces import box
from tether.server.learner import NonFiniteUpdate, PPOHyperparams, PPOLearner, build_batch


def noise_chunks(n: int, seed: int, logp: float = float(np.log(0.5)), reward_scale: float = 1.0) -> list[EpisodeChunk]:
    """One-step episodes with random observations, actions and rewards (no signal to learn)."""
    rng = np.random.default_rng(seed)
    return [EpisodeChunk(obs=rng.normal(size=(2, 3)).astype(np.float32), actions=np.array([int(rng.integers(2))]),
                         rewards=np.array([rng.normal() * reward_scale], np.float32),
                         action_logp=np.array([logp], np.float32), action_dist_inputs=None,
                         is_terminated=True, is_truncated=False) for _ in range(n)]


def learner(seed: int = 0, **hp) -> PPOLearner:
    return PPOLearner(box(-5, 5, (3,)), Discrete(2), PPOHyperparams(**{"lr": 1e-3, "minibatch_size": 256, **hp}), seed=seed)


def weights(l: PPOLearner) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in l.model.actor.parameters()])


def test_a_few_steps_move_the_policy_far_less_than_a_full_batch() -> None:
    moved = {}
    for n in (10, 2000):
        l = learner()
        before = weights(l)
        l.update(build_batch(noise_chunks(n, seed=n)))
        moved[n] = float((weights(l) - before).norm())
    assert moved[10] < 0.05 * moved[2000], moved


def test_last_partial_minibatch_is_used() -> None:
    l = learner(num_epochs=2)
    steps = []
    l.optimizer.register_step_post_hook(lambda opt, args, kwargs: steps.append(opt.param_groups[0]["lr"]))
    l.update(build_batch(noise_chunks(300, seed=1)))
    assert steps == pytest.approx([1e-3, 1e-3 * 44 / 256] * 2)


@pytest.mark.parametrize("poison", ["logp", "reward"])
def test_non_finite_update_is_rolled_back(poison: str) -> None:
    l = learner()
    l.update(build_batch(noise_chunks(300, seed=2)))  # some optimizer state to restore
    before = {k: v.clone() for k, v in l.model.state_dict().items()}
    adam_step = l.optimizer.state_dict()["state"][0]["step"].clone()
    chunks = noise_chunks(300, seed=3)
    if poison == "logp":
        chunks[0].action_logp[:] = -1000.0
    else:
        chunks[0].rewards[:] = 3e38
    with pytest.raises(NonFiniteUpdate):
        l.update(build_batch(chunks))
    after = l.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(l.optimizer.state_dict()["state"][0]["step"], adam_step)


def test_reward_clip_makes_huge_rewards_trainable() -> None:
    l = learner(reward_clip=10.0)
    chunks = noise_chunks(300, seed=4)
    chunks[0].rewards[:] = 3e38
    stats = l.update(build_batch(chunks))
    assert np.isfinite(stats["value_loss"]) and all(torch.isfinite(p).all() for p in l.model.parameters())
