"""Generalised advantage estimation over episode chunks laid end to end."""

from __future__ import annotations

import numpy as np


def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    chunk_ends: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns for steps of many chunks in one flat array.

    ``next_values[t]`` is V(o_{t+1}). ``terminated[t]`` is true only at the last
    step of a chunk whose episode terminated: there the future is worth 0. At
    the last step of a truncated or cut chunk the future is V(o_T), the
    bootstrap, because the episode would have gone on. ``chunk_ends[t]`` marks
    each chunk's last step, where the recursion restarts.
    """
    n = rewards.shape[0]
    advantages = np.zeros(n, dtype=np.float32)
    not_terminal = 1.0 - terminated.astype(np.float32)
    deltas = rewards + gamma * next_values * not_terminal - values
    last = 0.0
    gl = gamma * lam
    for t in range(n - 1, -1, -1):
        # Restart (not multiply by 0) at a chunk's end: a non-finite value stays in its own chunk.
        last = deltas[t] + (0.0 if chunk_ends[t] else gl * last)
        advantages[t] = last
    return advantages, advantages + values
