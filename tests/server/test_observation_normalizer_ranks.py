"""normalize_observations with several ranks: every rank folds in the moments of every rank's rows
together, so the statistics (and weights) stay the same on every rank and equal a lone learner's."""

from __future__ import annotations

import numpy as np

from tether.protocol import Discrete
from tether.protocol.spaces import box
from tether.server.learner.observation_normalizer import NormalizedPolicy
from tether.server.learner.policy_network import ActorCritic


class TwoRanks:
    """The sums of this rank's values with those of another rank holding ``theirs`` (as gloo would give)."""

    def __init__(self, theirs: np.ndarray) -> None:
        self.theirs = theirs.astype(np.float64)
        self.calls = 0

    def sum_values(self, values: np.ndarray) -> np.ndarray:
        self.calls += 1
        if self.calls % 2 == 1:  # count and total
            self.mean = None
            result = values + np.concatenate([[len(self.theirs)], self.theirs.sum(axis=0)])
            self.mean = result[1:] / max(result[0], 1)
            return result
        return values + ((self.theirs - self.mean) ** 2).sum(axis=0)


def normalizer() -> NormalizedPolicy:
    return NormalizedPolicy(ActorCritic(3, Discrete(2), (8,)), 3, 5.0, Discrete(2), None)


def test_two_ranks_statistics_are_a_lone_learners_over_both_ranks_rows() -> None:
    rng = np.random.default_rng(0)
    mine, theirs = rng.normal(2, 3, (50, 3)), rng.normal(-1, 0.5, (20, 3))
    lone, ranked, empty = normalizer(), normalizer(), normalizer()
    for _ in range(2):
        lone.observe(np.concatenate([mine, theirs]))
        ranked.observe(mine, TwoRanks(theirs))
        empty.observe(np.zeros((0, 3)), TwoRanks(np.concatenate([mine, theirs])))  # (a rank without rows)
    for other in (ranked, empty):
        assert float(other.count) == float(lone.count) == 140
        np.testing.assert_allclose(other.running_mean.numpy(), lone.running_mean.numpy(), rtol=1e-12)
        np.testing.assert_allclose(other.running_var.numpy(), lone.running_var.numpy(), rtol=1e-9)
