"""Training a network with memory on sequences (truncated backpropagation through time).

A chunk is one agent's consecutive steps of one episode, recorded with the state its SDK fed the
model before the chunk's first step (``state_in``, §10.1). The learner:

1. runs the network along every chunk from that state, without gradient and with the current
   weights (``state_pass``): the state before every observation, the values GAE needs (the value
   head reads the core's output), and the dist inputs of steps sent without a behaviour logp. A
   chunk that is a later part of a record the server cut (sample_pool.py) first advances its state
   over the observations before it (``state_prefix``);
2. cuts each chunk into windows of ``seq_len`` steps (``windows``), each starting from the state
   the pass found there; with ``burn_in``, the ``burn_in`` steps before a window are run first
   without gradient, so that its start state follows the weights as they change during the update;
3. runs each minibatch of windows step by step (``run_windows``) and hands the losses only the
   windows' real steps: padding never enters a loss.

Chunks of different lengths run side by side in one batched loop; a padded position leaves its
row's state as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .policy_model import PolicyModel
from .rollout_batch import RolloutBatch


def _keep(valid: torch.Tensor, new: tuple[torch.Tensor, ...], old: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The new state where the row advanced, the old one where it was padding."""
    mask = valid.unsqueeze(1)
    return tuple(torch.where(mask, n, o) for n, o in zip(new, old))


@dataclass
class StatePass:
    """Per row of ``all_obs``: the value, the dist inputs and the state before it."""

    values: np.ndarray  # (rows,)
    dist_inputs: torch.Tensor  # (rows, K)
    state_before: torch.Tensor  # (rows, state tensors, units)


def state_pass(model: PolicyModel, batch: RolloutBatch, device: torch.device) -> StatePass:
    """Run ``model`` along every chunk of ``batch`` from its recorded state (see the module docstring)."""
    assert batch.state_in is not None and batch.chunk_rows is not None and batch.state_prefix is not None
    chunks = len(batch.chunk_rows)
    rows_total = batch.all_obs.shape[0]
    ends = np.append(batch.chunk_rows[1:], rows_total)
    lengths = ends - batch.chunk_rows
    prefixes = np.array([0 if p is None else p.shape[0] for p in batch.state_prefix])
    width = int((lengths + prefixes).max())
    obs_dim = batch.all_obs.shape[1]
    critic = batch.all_obs if batch.all_value_obs is None else batch.all_value_obs
    obs = np.zeros((chunks, width, obs_dim), np.float32)
    critic_rows = np.zeros((chunks, width, critic.shape[1]), np.float32)
    valid = np.zeros((chunks, width), bool)
    for i, (start, end, before) in enumerate(zip(batch.chunk_rows, ends, prefixes)):
        if before:
            obs[i, :before] = batch.state_prefix[i]  # type: ignore[index]
        obs[i, before:before + end - start] = batch.all_obs[start:end]
        critic_rows[i, before:before + end - start] = critic[start:end]
        valid[i, :before + end - start] = True
    obs_t = torch.as_tensor(obs, device=device)
    critic_t = torch.as_tensor(critic_rows, device=device)
    valid_t = torch.as_tensor(valid, device=device)
    state = tuple(torch.as_tensor(batch.state_in[:, k], device=device) for k in range(batch.state_in.shape[1]))
    values, dists, states = [], [], []
    with torch.no_grad():
        for t in range(width):
            states.append(torch.stack(state, dim=1))
            dist, value, new_state = model.step(obs_t[:, t], critic_t[:, t], state)
            assert value is not None
            values.append(value)
            dists.append(dist)
            state = _keep(valid_t[:, t], new_state, state)
    # Back to all_obs order: chunk i's rows sit after its prefix.
    take = np.concatenate([np.arange(s, e) - s + before + i * width
                           for i, (s, e, before) in enumerate(zip(batch.chunk_rows, ends, prefixes))])
    take_t = torch.as_tensor(take, device=device)
    return StatePass(
        values=torch.stack(values, dim=1).reshape(-1)[take_t].cpu().numpy(),
        dist_inputs=torch.stack(dists, dim=1).reshape(chunks * width, -1)[take_t],
        state_before=torch.stack(states, dim=1).reshape(chunks * width, *states[0].shape[1:])[take_t],
    )


@dataclass
class Windows:
    """Sequences of at most ``seq_len`` steps, each after up to ``burn_in`` positions of burn-in.

    Per window and position (``burn_in + seq_len`` of them): the all_obs row it reads (-1: padding)
    and the step it trains (-1: burn-in or padding); per window the row whose state it starts from.
    """

    rows: np.ndarray  # (windows, positions)
    steps: np.ndarray  # (windows, positions)
    start_rows: np.ndarray  # (windows,)
    burn_in: int

    @property
    def count(self) -> int:
        return int(self.rows.shape[0])


def windows(batch: RolloutBatch, seq_len: int, burn_in: int) -> Windows:
    """Every chunk's steps cut into windows of ``seq_len`` (the last may be shorter)."""
    assert batch.chunk_rows is not None
    step_of_row = np.full(batch.all_obs.shape[0], -1, np.int64)
    step_of_row[batch.next_obs_index - 1] = np.arange(batch.size)
    ends = np.append(batch.chunk_rows[1:], batch.all_obs.shape[0])
    rows, steps, starts = [], [], []
    positions = burn_in + seq_len
    for first, end in zip(batch.chunk_rows, ends):
        length = end - first - 1  # (the chunk's steps: its last row is o_T)
        for s in range(0, length, seq_len):
            n = min(seq_len, length - s)
            b = min(burn_in, s)
            row = np.full(positions, -1, np.int64)
            row[burn_in - b:burn_in + n] = np.arange(first + s - b, first + s + n)
            step = np.full(positions, -1, np.int64)
            step[burn_in:burn_in + n] = step_of_row[first + s:first + s + n]
            rows.append(row)
            steps.append(step)
            starts.append(first + s - b)
    return Windows(np.stack(rows), np.stack(steps), np.array(starts), burn_in)


def run_windows(model: PolicyModel, win: Windows, chosen: np.ndarray, obs: torch.Tensor, critic: torch.Tensor,
                state_before: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the ``chosen`` windows step by step: (the steps trained, in window order; their dist
    inputs; their values). ``obs`` and ``critic`` are all_obs rows and critic rows as tensors."""
    device = obs.device
    rows = torch.as_tensor(win.rows[chosen], device=device)
    valid = rows >= 0
    safe = rows.clamp(min=0)
    start = state_before[torch.as_tensor(win.start_rows[chosen], device=device)]
    state = tuple(start[:, k] for k in range(start.shape[1]))
    with torch.no_grad():
        for t in range(win.burn_in):
            _, _, new_state = model.step(obs[safe[:, t]], None, state)
            state = _keep(valid[:, t], new_state, state)
    dists, values = [], []
    for t in range(win.burn_in, rows.shape[1]):
        dist, value, new_state = model.step(obs[safe[:, t]], critic[safe[:, t]], state)
        assert value is not None
        dists.append(dist)
        values.append(value)
        state = _keep(valid[:, t], new_state, state)
    steps = torch.as_tensor(win.steps[chosen][:, win.burn_in:], device=device)
    trained = steps >= 0
    return steps[trained], torch.stack(dists, dim=1)[trained], torch.stack(values, dim=1)[trained]
