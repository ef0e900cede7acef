"""Generalised advantage estimation over episode chunks laid end to end."""

from __future__ import annotations

import numpy as np
import torch


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


def compute_gae_batched(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    chunk_ends: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``compute_gae`` on tensors, on their device, every chunk at once: the chunks are laid out as the
    rows of a padded [chunks, longest] table and the recursion runs over its columns, from the last,
    so it takes as many steps as the longest chunk has, not as the batch has (a GPU's way: one small
    kernel per column instead of one Python step per sample). Same results as ``compute_gae``."""
    n = rewards.shape[0]
    device = rewards.device
    if n == 0:
        empty = torch.zeros(0, dtype=torch.float32, device=device)
        return empty, empty
    deltas = rewards + gamma * next_values * (~terminated).float() - values
    ends = chunk_ends.clone()
    ends[-1] = True  # (the batch's last step ends a chunk, as compute_gae's restart from 0 has it)
    chunk = torch.cumsum(ends.long(), 0) - ends.long()  # each step's chunk: ends counted before it
    starts = torch.zeros(n, dtype=torch.long, device=device)
    first = torch.ones(n, dtype=torch.bool, device=device)
    first[1:] = ends[:-1]  # a chunk starts after the previous one's end
    starts[first] = torch.arange(n, device=device)[first]
    position = torch.arange(n, device=device) - torch.cummax(starts, 0).values
    chunks, longest = int(chunk[-1]) + 1, int(position.max()) + 1
    table = torch.zeros(chunks, longest, dtype=torch.float32, device=device)
    table[chunk, position] = deltas.float()
    valid = torch.zeros(chunks, longest, dtype=torch.bool, device=device)
    valid[chunk, position] = True
    out = torch.zeros_like(table)
    last = torch.zeros(chunks, dtype=torch.float32, device=device)
    gl = gamma * lam
    for t in range(longest - 1, -1, -1):
        # Past a chunk's end its row is padding: the recursion restarts from 0 at its last step.
        last = torch.where(valid[:, t], table[:, t] + gl * last, torch.zeros_like(last))
        out[:, t] = last
    advantages = out[chunk, position]
    return advantages, advantages + values.float()
