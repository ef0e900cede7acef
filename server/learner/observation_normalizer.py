"""Observation normalisation inside the network (``normalize_observations``).

Engines send raw observations and never see statistics: the learner keeps a running mean and
variance of every observation value, updated from the data it trains on, and the network subtracts
and divides by them (then clips to ``[-clip, clip]``) before anything else. They are part of the
weights: exported into the ONNX graph with every version, saved in checkpoints, and rolled back with
the weights when an update is undone. Stable-Baselines3's VecNormalize does the same outside the
model, which is why its users must ship the statistics beside the policy; here the graph carries them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tether.protocol.action_mask import ActionMask
from tether.protocol.spaces import Space, is_composite

from .policy_model import PolicyModel

#: Keeps the division finite for a value that never changes (variance 0).
EPSILON = 1e-8


def normalized_values(observation_space: Space, action_mask: ActionMask | None) -> np.ndarray | None:
    """Which values of a flat row are normalised: of a composite observation (§8.6) its vector leaves
    (not its images, which the CNN scales, nor its action mask); None for every value."""
    if not is_composite(observation_space):
        return None
    selected = np.zeros(observation_space.flat_dim, dtype=bool)
    for leaf in observation_space.leaves:
        if not leaf.is_bytes and (action_mask is None or leaf.path != action_mask.leaf.path):
            selected[leaf.offset:leaf.offset + leaf.size] = True
    return selected


class NormalizedPolicy(PolicyModel):
    """``inner`` reading normalised observations. Inputs wider than one observation (a centralized
    critic's: several agents' observations side by side) are normalised observation by observation.
    ``selected`` (bool per value) leaves the other values as they are."""

    def __init__(self, inner: PolicyModel, obs_dim: int, clip: float, action_space: Space,
                 selected: np.ndarray | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.obs_dim = obs_dim
        self.clip = float(clip)
        self.action_space = action_space
        self.state_shape = inner.state_shape
        # float64 running statistics (Chan et al.'s parallel update), float32 copies the graph uses.
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("running_mean", torch.zeros(obs_dim, dtype=torch.float64))
        self.register_buffer("running_var", torch.ones(obs_dim, dtype=torch.float64))
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_inv_std", torch.ones(obs_dim))
        #: The columns whose statistics are kept (all when None): an image's are never read.
        self._columns = None if selected is None else np.flatnonzero(np.asarray(selected, dtype=bool))
        #: (start, end, normalised) runs of columns: the graph touches the selected ones only, so an
        #: image beside a vector is sliced and joined once, not computed on and then thrown away.
        self._runs: list[tuple[int, int, bool]] = []
        if selected is not None:
            flags = np.asarray(selected, dtype=bool)
            edges = [0, *(np.flatnonzero(flags[1:] != flags[:-1]) + 1).tolist(), len(flags)]
            self._runs = [(a, b, bool(flags[a])) for a, b in zip(edges[:-1], edges[1:]) if b > a]

    def observe(self, obs: np.ndarray, data_parallel: Any = None) -> None:
        """Fold a batch of observations (rows of obs_dim values) into the statistics. With
        ``data_parallel`` (several ranks, each calling this with its own rows, none perhaps) the batch is
        every rank's rows together, so every rank folds in the same moments and keeps the same statistics."""
        columns = slice(None) if self._columns is None else self._columns
        rows = np.asarray(obs).reshape(-1, self.obs_dim)[:, columns].astype(np.float64)
        if data_parallel is not None:
            # Two sums (count and total, then squared deviations from the group's mean): exact moments.
            width = rows.shape[1]
            first = data_parallel.sum_values(np.concatenate([[rows.shape[0]], rows.sum(axis=0)]))
            n = float(first[0])
            batch_mean = first[1:] / max(n, 1.0)
            batch_var = data_parallel.sum_values(((rows - batch_mean) ** 2).sum(axis=0).reshape(width)) / max(n, 1.0)
        else:
            n = float(rows.shape[0])
            batch_mean = rows.mean(axis=0) if n else None
            batch_var = rows.var(axis=0) if n else None
        if n == 0:
            return
        count = float(self.count)
        new_mean = self.running_mean.cpu().numpy().copy()
        new_var = self.running_var.cpu().numpy().copy()
        mean, var = new_mean[columns], new_var[columns]
        total = count + n
        delta = batch_mean - mean
        new_mean[columns] = mean + delta * n / total
        new_var[columns] = (var * count + batch_var * n + delta * delta * count * n / total) / total
        device = self.obs_mean.device
        self.count.fill_(total)
        self.running_mean.copy_(torch.from_numpy(new_mean))
        self.running_var.copy_(torch.from_numpy(new_var))
        self.obs_mean.copy_(torch.from_numpy(new_mean.astype(np.float32)).to(device))
        self.obs_inv_std.copy_(torch.from_numpy((1.0 / np.sqrt(new_var + EPSILON)).astype(np.float32)).to(device))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` of one or more observations side by side, each normalised and clipped."""
        per_obs = x.reshape(-1, self.obs_dim)
        if not self._runs:
            out = ((per_obs - self.obs_mean) * self.obs_inv_std).clamp(-self.clip, self.clip)
        else:
            out = torch.cat([
                ((per_obs[:, a:b] - self.obs_mean[a:b]) * self.obs_inv_std[a:b]).clamp(-self.clip, self.clip)
                if normalised else per_obs[:, a:b] for a, b, normalised in self._runs], dim=1)
        return out.reshape(x.shape)

    def dist_inputs(self, obs: torch.Tensor) -> torch.Tensor:
        return self.inner.dist_inputs(self.normalize(obs))

    def value(self, critic_obs: torch.Tensor) -> torch.Tensor:
        return self.inner.value(self.normalize(critic_obs))

    def step(self, obs: torch.Tensor, critic_obs: torch.Tensor | None, state: tuple[torch.Tensor, ...]
             ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, ...]]:
        return self.inner.step(self.normalize(obs), None if critic_obs is None else self.normalize(critic_obs), state)
