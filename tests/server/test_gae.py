"""GAE on tiny fixed data, checked against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from tether.server.learner.gae import compute_gae


def reference(rewards, values, bootstrap, gamma, lam):
    """Textbook backward recursion for one chunk."""
    adv, last = [0.0] * len(rewards), 0.0
    next_values = list(values[1:]) + [bootstrap]
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_values[t] - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv


def run(rewards, values, next_values, terminated, ends, gamma=0.9, lam=0.8):
    arr = lambda x, d=np.float32: np.asarray(x, dtype=d)  # noqa: E731
    return compute_gae(arr(rewards), arr(values), arr(next_values), arr(terminated, bool), arr(ends, bool), gamma, lam)


def test_terminated_chunk_does_not_bootstrap() -> None:
    adv, ret = run([1, 1, 1], [0.5, 0.4, 0.3], [0.4, 0.3, 9.0], [0, 0, 1], [0, 0, 1])
    assert adv == pytest.approx(reference([1, 1, 1], [0.5, 0.4, 0.3], 0.0, 0.9, 0.8), rel=1e-6)
    assert ret == pytest.approx(adv + np.array([0.5, 0.4, 0.3]), rel=1e-6)


def test_truncated_chunk_bootstraps_from_the_last_observation() -> None:
    adv, _ = run([1, 1, 1], [0.5, 0.4, 0.3], [0.4, 0.3, 9.0], [0, 0, 0], [0, 0, 1])
    assert adv == pytest.approx(reference([1, 1, 1], [0.5, 0.4, 0.3], 9.0, 0.9, 0.8), rel=1e-6)
    # Bootstrapping matters: with V(o_T) = 9 the last advantage is 1 + 0.9 * 9 - 0.3.
    assert adv[2] == pytest.approx(8.8, rel=1e-6)


def test_chunks_do_not_leak_into_each_other() -> None:
    # Chunk A (2 steps, truncated) then chunk B (2 steps, terminated), laid end to end.
    adv, _ = run([1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4], [0.2, 5.0, 0.4, 7.0], [0, 0, 0, 1], [0, 1, 0, 1])
    a = reference([1, 2], [0.1, 0.2], 5.0, 0.9, 0.8)
    b = reference([3, 4], [0.3, 0.4], 0.0, 0.9, 0.8)
    assert adv == pytest.approx(a + b, rel=1e-6)


def test_build_batch_marks_terminals_chunk_ends_and_bootstrap_observations() -> None:
    """Multi-step chunks as they arrive: A (3 steps, terminated), then B (4 steps, cut mid-episode) and C
    (2 steps continuing B, truncated). With V(o) = the observation's row number in all_obs, GAE must
    bootstrap B from its last observation (the one C starts from) and C from its own, never A."""
    from tether.protocol import EpisodeChunk
    from tether.server.learner import build_batch

    def chunk(first: int, steps: int, terminated: bool, truncated: bool) -> EpisodeChunk:
        obs = np.arange(first, first + steps + 1, dtype=np.float32)[:, None]
        return EpisodeChunk(obs, np.zeros(steps, np.int64), np.ones(steps, np.float32), np.zeros(steps, np.float32),
                            None, terminated, truncated)

    a, b, c = chunk(0, 3, True, False), chunk(10, 4, False, False), chunk(14, 2, False, True)
    batch = build_batch([a, b, c])
    assert list(batch.terminated) == [0, 0, 1, 0, 0, 0, 0, 0, 0]
    assert list(batch.chunk_ends) == [0, 0, 1, 0, 0, 0, 1, 0, 1]
    assert list(batch.obs[:, 0]) == [0, 1, 2, 10, 11, 12, 13, 14, 15]
    assert list(batch.all_obs[batch.next_obs_index, 0]) == [1, 2, 3, 11, 12, 13, 14, 15, 16]
    values_all = batch.all_obs[:, 0].astype(np.float32)  # V(o) = o, so bootstraps are visible in the result
    values = batch.obs[:, 0].astype(np.float32)
    adv, _ = compute_gae(batch.rewards, values, values_all[batch.next_obs_index], batch.terminated,
                         batch.chunk_ends, 0.9, 0.8)
    expected = (reference([1, 1, 1], [0, 1, 2], 0.0, 0.9, 0.8)            # terminated: no bootstrap
                + reference([1] * 4, [10, 11, 12, 13], 14.0, 0.9, 0.8)    # cut: V(o_4) = C's first observation
                + reference([1, 1], [14, 15], 16.0, 0.9, 0.8))            # truncated: V(o_T)
    assert adv == pytest.approx(expected, rel=1e-5)
