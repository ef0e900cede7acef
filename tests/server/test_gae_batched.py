"""Batched GAE (the learner's on a GPU, gae.py's compute_gae_batched) gives compute_gae's results."""

from __future__ import annotations

import numpy as np
import torch

from tether.server.learner.gae import compute_gae, compute_gae_batched


def batch(rng: np.random.Generator, lengths: list[int]) -> tuple[np.ndarray, ...]:
    n = sum(lengths)
    ends = np.zeros(n, bool)
    ends[np.cumsum(lengths) - 1] = True
    terminated = ends & (rng.random(n) < 0.5)
    return (rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32),
            rng.normal(size=n).astype(np.float32), terminated, ends)


def both(arrays: tuple[np.ndarray, ...], gamma: float = 0.99, lam: float = 0.95):
    expected = compute_gae(*arrays, gamma, lam)
    got = compute_gae_batched(*(torch.as_tensor(a) for a in arrays), gamma, lam)
    return expected, tuple(t.numpy() for t in got)


def test_chunks_of_many_lengths_give_the_loops_results() -> None:
    rng = np.random.default_rng(0)
    for lengths in ([1], [5], [200, 3, 1, 57, 200], list(rng.integers(1, 300, size=40))):
        (adv, ret), (adv_b, ret_b) = both(batch(rng, lengths))
        np.testing.assert_allclose(adv_b, adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ret_b, ret, rtol=1e-5, atol=1e-5)


def test_a_batch_whose_last_chunk_is_cut_and_a_non_finite_value_stays_in_its_chunk() -> None:
    rng = np.random.default_rng(1)
    rewards, values, next_values, terminated, ends = batch(rng, [4, 6, 5])
    ends[-1] = False  # (a cut chunk still ends the batch)
    next_values[6] = np.inf
    (adv, _), (adv_b, _) = both((rewards, values, next_values, terminated, ends))
    assert np.isinf(adv_b[4:7]).all() and np.isfinite(adv_b[:4]).all() and np.isfinite(adv_b[10:]).all()
    np.testing.assert_allclose(adv_b[np.isfinite(adv)], adv[np.isfinite(adv)], rtol=1e-5, atol=1e-5)


def test_an_empty_batch() -> None:
    empty = tuple(np.zeros(0, t) for t in (np.float32, np.float32, np.float32, bool, bool))
    (adv, _), (adv_b, ret_b) = both(empty)
    assert adv_b.shape == ret_b.shape == (0,)


def test_the_learners_targets_on_a_gpu_are_its_targets_on_the_cpu() -> None:
    """The path a CUDA learner takes (critic values and GAE on the device), run on the CPU here."""
    from tether.protocol import Discrete
    from tether.protocol.episodes import EpisodeChunk
    from tether.protocol.spaces import box
    from tether.server.learner import PPOHyperparams, PPOLearner, build_batch

    rng = np.random.default_rng(2)
    learner = PPOLearner(box(-10, 10, (3,)), Discrete(2), PPOHyperparams(reward_clip=0.5), seed=0)
    chunks = [EpisodeChunk(obs=rng.standard_normal((t + 1, 3)).astype(np.float32), actions=rng.integers(0, 2, t),
                           rewards=rng.standard_normal(t), action_logp=np.full(t, -0.69),
                           action_dist_inputs=np.zeros((t, 2)), is_terminated=t % 2 == 0, is_truncated=t % 2 == 1)
              for t in (7, 30, 1, 12)]
    batch = build_batch(chunks)
    for cpu, device in zip(learner._targets(batch), learner._targets_on_device(batch)):
        np.testing.assert_allclose(device, cpu, rtol=1e-5, atol=1e-6)
