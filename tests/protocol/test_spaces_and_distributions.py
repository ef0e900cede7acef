"""Spaces round-trip through JSON and gymnasium; sampling matches log_prob."""

from __future__ import annotations

import math
import random

import gymnasium as gym
import numpy as np

from tether.protocol import Box, Discrete, MultiDiscrete, from_gymnasium, log_prob, sample, space_from_json, to_gymnasium
from tether.protocol.distributions import deterministic, to_env_action


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


def test_box_records_the_raw_sample_and_the_engine_gets_it_clipped() -> None:
    rng = random.Random(1)
    space = Box(low=np.array([-0.1]), high=np.array([0.1]))
    inputs = np.array([0.0, 1.0], dtype=np.float32)  # std e^1: most samples fall outside
    outside = 0
    for _ in range(200):
        a, lp = sample(space, inputs, rng)
        outside += not space.contains_batch(a.reshape(1, 1))[0]
        assert math.isclose(lp, log_prob(space, inputs, a), rel_tol=1e-6)  # density at the raw sample
        env_a = to_env_action(space, a)
        assert abs(float(env_a[0])) <= 0.1 + 1e-7
        assert float(env_a[0]) == float(np.clip(a[0], -0.1, 0.1))
    assert outside > 150  # the raw sample is recorded, not the clipped one


def test_raw_sample_gives_the_unbiased_gradient() -> None:
    """mean 0.8, std 0.5, box [-1, 1], reward = -(executed action - 0.3)^2: the
    score-function gradient of the recorded sample matches the analytic one.
    Recording the clipped value with its density gave dJ/dmean 0.510 instead of 0.656."""
    import torch

    space = Box(low=np.array([-1.0]), high=np.array([1.0]))
    mean = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    log_std = torch.tensor(math.log(0.5), dtype=torch.float64, requires_grad=True)
    rng = random.Random(0)
    inputs = np.array([0.8, math.log(0.5)])
    raw = np.array([float(sample(space, inputs, rng)[0][0]) for _ in range(200_000)])
    reward = torch.tensor(-(np.clip(raw, -1, 1) - 0.3) ** 2)
    logp = torch.distributions.Normal(mean, log_std.exp()).log_prob(torch.tensor(raw))
    ((reward - reward.mean()) * logp).mean().backward()
    # Analytic: E[-(clip(x)-0.3)^2] differentiated under the Gaussian (numerical quadrature).
    xs = np.linspace(-6, 6, 400_001)

    def objective(mu: float, s: float) -> float:
        x = mu + s * xs
        pdf = np.exp(-0.5 * xs**2) / math.sqrt(2 * math.pi)
        return float(np.trapezoid(-(np.clip(x, -1, 1) - 0.3) ** 2 * pdf, xs))

    h = 1e-5
    d_mean = (objective(0.8 + h, 0.5) - objective(0.8 - h, 0.5)) / (2 * h)
    d_logstd = (objective(0.8, 0.5 * math.exp(h)) - objective(0.8, 0.5 * math.exp(-h))) / (2 * h)
    assert abs(mean.grad.item() - d_mean) < 0.02, (mean.grad.item(), d_mean)
    assert abs(log_std.grad.item() - d_logstd) < 0.02, (log_std.grad.item(), d_logstd)


def test_multidiscrete_and_deterministic() -> None:
    space = MultiDiscrete((2, 3))
    inputs = np.array([0.0, 5.0, 1.0, 0.0, 9.0], dtype=np.float32)
    assert deterministic(space, inputs).tolist() == [1, 2]
    a, lp = sample(space, inputs, random.Random(2))
    assert math.isclose(lp, log_prob(space, inputs, a), rel_tol=1e-6)
    assert deterministic(Discrete(2, start=3), np.array([0.1, 0.2])) == 4


def test_gymnasium_multidiscrete_that_the_protocol_cannot_express_is_refused() -> None:
    import pytest

    """§8.3's MultiDiscrete is one row of choices from 0: a start or a 2-D nvec would change which
    actions are valid, so the conversion refuses it instead of refusing every action later."""
    import gymnasium as gym

    from tether.protocol.spaces import MultiDiscrete, from_gymnasium

    assert from_gymnasium(gym.spaces.MultiDiscrete([3, 2])) == MultiDiscrete((3, 2))
    with pytest.raises(TypeError, match="start 0"):
        from_gymnasium(gym.spaces.MultiDiscrete([3, 2], start=[1, 0]))
    with pytest.raises(TypeError, match="one-dimensional nvec"):
        from_gymnasium(gym.spaces.MultiDiscrete([[3, 2], [2, 2]]))


def test_a_recorded_discrete_draw_is_the_general_draw_and_sums_in_order() -> None:
    """sample_for_record draws a Discrete action without the general dispatch: the same action (an int,
    offset by ``start``), the same logp bit for bit and the same engine action as ``sample`` then
    ``to_env_action``, masked logits included; the probabilities are summed in order, as every SDK does
    (not compensated, as Python 3.12's sum() is)."""
    from tether.protocol.distributions import _categorical_sample, sample_for_record

    values = np.random.default_rng(0)
    for space in (Discrete(2), Discrete(5), Discrete(3, start=-1), Discrete(4, start=7)):
        for t in range(300):
            dist = values.normal(0, 3, space.n).astype(np.float32 if t % 2 else np.float64)
            if t % 3 == 0:
                dist[values.integers(space.n)] = np.float32(-3e38)  # (a masked action, §11.6)
            fast, general = random.Random(t), random.Random(t)
            action, logp, env_action = sample_for_record(space, dist, fast)
            want, want_logp = sample(space, dist, general)
            assert (action, env_action) == (want, to_env_action(space, want)) and type(action) is int
            assert logp.hex() == want_logp.hex()
    logits = [0.0, -36.9, -36.9]  # (exps of 1e-16 beside 1: an in-order sum drops them, a compensated one not)
    exps = [math.exp(v) for v in logits]
    total = 0.0
    for e in exps:
        total += e
    assert total == 1.0 and math.fsum(exps) > 1.0
    for u in range(50):
        index, logp = _categorical_sample(logits, random.Random(u))
        assert logp == logits[index] - math.log(total)
