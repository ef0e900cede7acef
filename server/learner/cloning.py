"""Demonstration episodes prepared for behavioural cloning (``tether pretrain``, a module's ``demos``).

A network without memory clones step by step: any minibatch of (observation, action) pairs. A network
with memory clones along sequences: each episode starts from a zero state (§12.4), so the episodes
form a batch of chunks with ``state_in`` zeros; a state pass with the current weights gives the state
before every step, and minibatches are whole windows of ``seq_len`` steps (after ``burn_in``) run with
``run_windows``, as PPO trains such a network (sequences.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import numpy as np
import torch

from tether.protocol.episodes import EpisodeChunk

from .model_config import RecurrentConfig
from .policy_model import PolicyModel
from .rollout_batch import build_batch
from .sequences import StatePass, Windows, run_windows, state_pass, windows


class CloningData:
    """Whole demonstration episodes: their steps' observations and actions (and returns-to-go, for the
    value), served in minibatches of at least a given number of steps."""

    def __init__(self, episodes: list[EpisodeChunk], recurrent: RecurrentConfig | None, device: torch.device,
                 returns: np.ndarray | None = None) -> None:
        """``returns``: one per step in episode order (None: the value is not fitted)."""
        if not episodes:
            raise ValueError("no demonstration episodes")
        self.recurrent = recurrent
        self.device = device
        if recurrent is not None:
            zeros = np.zeros((len(recurrent.state_names), recurrent.size), np.float32)
            episodes = [replace(e, state_in=zeros, state_prefix=None, value_obs=None) for e in episodes]
        self.batch = build_batch([replace(e, value_obs=None) if recurrent is None else e for e in episodes])
        actions = self.batch.actions
        self.actions = torch.as_tensor(actions, dtype=torch.float32 if actions.dtype.kind == "f" else torch.long,
                                       device=device)
        self.returns = None if returns is None else torch.as_tensor(returns, dtype=torch.float32, device=device)
        self.obs = torch.as_tensor(self.batch.all_obs, device=device)  # (uint8 images stay bytes until read)
        self._step_rows = torch.as_tensor(self.batch.next_obs_index - 1, device=device)
        self._windows: Windows | None = None if recurrent is None else windows(self.batch, recurrent.seq_len,
                                                                                recurrent.burn_in)
        self._states: StatePass | None = None

    @property
    def steps(self) -> int:
        return self.batch.size

    def refresh(self, model: PolicyModel) -> None:
        """For a network with memory: the state before every step, with ``model``'s current weights (the
        windows' start states; call it once per epoch or update)."""
        if self.recurrent is not None:
            self._states = state_pass(model, self.batch, self.device)

    def epoch(self, model: PolicyModel, rng: np.random.Generator, size: int
              ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """Every step once, in random minibatches of about ``size`` steps: (steps, dist inputs, values;
        values None when no returns were given to fit them)."""
        if self._windows is None:
            order = torch.as_tensor(rng.permutation(self.steps), device=self.device)
            for start in range(0, self.steps, size):
                yield self._steps(model, order[start:start + size])
            return
        self.refresh(model)
        for chosen in self._windows.minibatches(rng.permutation(self._windows.count), size):
            yield self._windows_run(model, chosen)

    def sample(self, model: PolicyModel, rng: np.random.Generator, size: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One random minibatch of about ``size`` steps (the cloning term beside a PPO minibatch); a
        network with memory reads the states of the last ``refresh``."""
        if self._windows is None:
            return self._steps(model, torch.as_tensor(rng.integers(0, self.steps, min(size, self.steps)),
                                                      device=self.device))
        if self._states is None:
            self.refresh(model)
        chosen = self._windows.minibatches(rng.permutation(self._windows.count), size)[0]
        return self._windows_run(model, chosen)

    def _steps(self, model: PolicyModel, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        rows = self.obs[self._step_rows[idx]].to(torch.float32)
        return idx, model.dist_inputs(rows), None if self.returns is None else model.value(rows)

    def _windows_run(self, model: PolicyModel, chosen: np.ndarray
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        assert self._windows is not None and self._states is not None
        return run_windows(model, self._windows, chosen, self.obs, None, self._states.state_before)
