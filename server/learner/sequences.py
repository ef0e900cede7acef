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
row's state as it is. A minibatch is whole windows, packed in random order until they hold
``minibatch_size`` steps, and is unrolled only as far as its longest window: short chunks (many
agents, each sending few steps) make more windows per minibatch, not smaller minibatches. The
gradient reaches back at most to a window's first step, so the horizon of backpropagation is
``seq_len`` or the chunk, whichever is shorter (a chunk ends where its client cut it, §10.4).
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
    """Run ``model`` along every chunk of ``batch`` from its recorded state (see the module docstring).

    The chunks run side by side, one time step per iteration; each iteration gathers only the rows
    of the chunks still running (by index: nothing is padded or copied per chunk, so one long chunk
    beside many short ones, or images, cost what their rows cost)."""
    assert batch.state_in is not None and batch.chunk_rows is not None and batch.state_prefix is not None
    rows_total = batch.all_obs.shape[0]
    ends = np.append(batch.chunk_rows[1:], rows_total)
    prefixes = [p for p in batch.state_prefix if p is not None and len(p)]
    source = np.concatenate([batch.all_obs, *prefixes]) if prefixes else batch.all_obs
    sequences = []
    at = rows_total
    for prefix, first, end in zip(batch.state_prefix, batch.chunk_rows, ends):
        before = 0 if prefix is None else len(prefix)
        sequences.append(np.concatenate([np.arange(at, at + before), np.arange(first, end)]))
        at += before
    width = max(len(seq) for seq in sequences)
    index = np.full((len(sequences), width), -1, np.int64)
    for i, seq in enumerate(sequences):
        index[i, :len(seq)] = seq
    index_t = torch.as_tensor(index, device=device)
    obs = torch.as_tensor(source, device=device)
    critic = None if batch.all_value_obs is None else torch.as_tensor(batch.all_value_obs, device=device)
    # (copies: the loop writes into them, and the batch's recorded states must stay as they came)
    state = [torch.tensor(batch.state_in[:, k], device=device) for k in range(batch.state_in.shape[1])]
    values = torch.zeros(len(source), device=device)
    dists: torch.Tensor | None = None
    before_rows = torch.zeros(len(source), len(state), state[0].shape[1], device=device)
    lengths = torch.as_tensor([len(seq) for seq in sequences], device=device)
    with torch.no_grad():
        for t in range(width):
            running = torch.nonzero(lengths > t).squeeze(1)
            rows = index_t[running, t]
            current = tuple(s[running] for s in state)
            before_rows[rows] = torch.stack(current, dim=1)
            x = obs[rows].to(torch.float32)
            # (a prefix row's value is never used: the critic reads any valid row there)
            c = x if critic is None else critic[rows.clamp(max=rows_total - 1)]
            dist, value, new_state = model.step(x, c, current)
            assert value is not None
            values[rows] = value
            if dists is None:
                dists = torch.zeros(len(source), dist.shape[1], device=device)
            dists[rows] = dist
            for k, tensor in enumerate(new_state):
                state[k][running] = tensor
    assert dists is not None
    return StatePass(values=values[:rows_total].cpu().numpy(), dist_inputs=dists[:rows_total],
                     state_before=before_rows[:rows_total])


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

    @property
    def lengths(self) -> np.ndarray:
        """Steps each window trains."""
        return (self.steps >= 0).sum(axis=1)

    def minibatches(self, order: np.ndarray, steps: int) -> list[np.ndarray]:
        """Windows in ``order`` packed into minibatches of at least ``steps`` trained steps each (the
        last one may hold fewer)."""
        lengths = self.lengths[order]
        out, start, held = [], 0, 0
        for i, n in enumerate(lengths):
            held += int(n)
            if held >= steps:
                out.append(order[start:i + 1])
                start, held = i + 1, 0
        if start < len(order):
            out.append(order[start:])
        return out


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


def run_windows(model: PolicyModel, win: Windows, chosen: np.ndarray, obs: torch.Tensor, critic: torch.Tensor | None,
                state_before: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the ``chosen`` windows step by step: (the steps trained, in window order; their dist
    inputs; their values). ``obs`` are all_obs rows as a tensor (uint8 rows are converted as they are
    read), ``critic`` the critic rows (None: the critic reads the observation)."""
    device = obs.device
    rows_np = win.rows[chosen]
    # Only the positions some chosen window uses: from the earliest burn-in to the longest window's end.
    first = int((rows_np >= 0).argmax(axis=1).min())
    last = win.burn_in + int(win.lengths[chosen].max())
    rows = torch.as_tensor(rows_np[:, :last], device=device)
    valid = rows >= 0
    safe = rows.clamp(min=0)
    start = state_before[torch.as_tensor(win.start_rows[chosen], device=device)]
    state = tuple(start[:, k] for k in range(start.shape[1]))
    with torch.no_grad():
        for t in range(min(first, win.burn_in), win.burn_in):
            _, _, new_state = model.step(obs[safe[:, t]].to(torch.float32), None, state)
            state = _keep(valid[:, t], new_state, state)
    dists, values = [], []
    for t in range(win.burn_in, last):
        x = obs[safe[:, t]].to(torch.float32)
        dist, value, new_state = model.step(x, x if critic is None else critic[safe[:, t]], state)
        assert value is not None
        dists.append(dist)
        values.append(value)
        state = _keep(valid[:, t], new_state, state)
    steps = torch.as_tensor(win.steps[chosen][:, win.burn_in:last], device=device)
    trained = steps >= 0
    return steps[trained], torch.stack(dists, dim=1)[trained], torch.stack(values, dim=1)[trained]
