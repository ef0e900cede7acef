"""Spaces round-trip through JSON and gymnasium; sampling matches log_prob."""

from __future__ import annotations

import math
import random

import gymnasium as gym
import numpy as np

from tether.sdk.protocol import Box, Discrete, MultiDiscrete, from_gymnasium, log_prob, sample, space_from_json, to_gymnasium
from tether.sdk.protocol.distributions import deterministic


def test_gymnasium_round_trip() -> None:
    for space in [gym.spaces.Box(-1.0, 2.0, (3,), np.float32), gym.spaces.Discrete(5, start=1),
                  gym.spaces.MultiDiscrete([2, 3]), gym.make("CartPole-v1").observation_space]:
        ours = from_gymnasium(space)
        back = to_gymnasium(space_from_json(ours.to_json()))
        assert back == space


def test_infinite_bounds_survive_json() -> None:
    space = space_from_json({"type": "Box", "shape": [2], "low": ["-inf", 0], "high": "inf"})
    assert space.low[0] == -np.inf and space.high[1] == np.inf
    assert space.to_json()["low"] == ["-inf", 0]


def test_sampled_logp_equals_log_prob_and_frequencies_match() -> None:
    rng = random.Random(0)
    space = Discrete(3)
    logits = np.array([0.0, 1.0, 2.0], dtype=np.float32)
    counts = [0, 0, 0]
    for _ in range(20000):
        a, lp = sample(space, logits, rng)
        counts[a] += 1
        assert math.isclose(lp, log_prob(space, logits, a), rel_tol=1e-6)
    probs = np.exp(logits) / np.exp(logits).sum()
    assert np.allclose(np.array(counts) / 20000, probs, atol=0.015)


def test_box_samples_are_clipped_and_logp_is_at_the_clipped_action() -> None:
    rng = random.Random(1)
    space = Box(low=np.array([-0.1]), high=np.array([0.1]))
    inputs = np.array([0.0, 1.0], dtype=np.float32)  # std e^1: most samples fall outside
    for _ in range(200):
        a, lp = sample(space, inputs, rng)
        assert space.contains_batch(a.reshape(1, 1))[0]
        assert abs(float(a[0])) <= 0.1 + 1e-7
        assert math.isclose(lp, log_prob(space, inputs, a), rel_tol=1e-6)


def test_multidiscrete_and_deterministic() -> None:
    space = MultiDiscrete((2, 3))
    inputs = np.array([0.0, 5.0, 1.0, 0.0, 9.0], dtype=np.float32)
    assert deterministic(space, inputs).tolist() == [1, 2]
    a, lp = sample(space, inputs, random.Random(2))
    assert math.isclose(lp, log_prob(space, inputs, a), rel_tol=1e-6)
    assert deterministic(Discrete(2, start=3), np.array([0.1, 0.2])) == 4
