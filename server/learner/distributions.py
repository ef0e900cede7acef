"""Torch action distributions built from ``action_dist_inputs``.

The formulas match protocol/distributions.py exactly (the
conformance vectors check both), so a logp computed on a client and one
recomputed here agree for unchanged weights.
"""

from __future__ import annotations

import math

import torch
from torch.distributions import Categorical

from tether.protocol.spaces import Box, Discrete, MultiDiscrete, Space


class ActionDistribution:
    """log_prob / entropy for a batch of dist inputs, for one action space."""

    def __init__(self, space: Space, dist_inputs: torch.Tensor) -> None:
        self.space = space
        self.inputs = dist_inputs

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        space = self.space
        if isinstance(space, Discrete):
            return Categorical(logits=self.inputs).log_prob(actions.long() - space.start)
        if isinstance(space, MultiDiscrete):
            parts = torch.split(self.inputs, list(space.nvec), dim=-1)
            return sum(Categorical(logits=p).log_prob(actions[..., i].long()) for i, p in enumerate(parts))
        mean, log_std = self._gaussian()
        z = (actions.reshape(mean.shape) - mean) / log_std.exp()
        return (-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self) -> torch.Tensor:
        space = self.space
        if isinstance(space, Discrete):
            return Categorical(logits=self.inputs).entropy()
        if isinstance(space, MultiDiscrete):
            parts = torch.split(self.inputs, list(space.nvec), dim=-1)
            return sum(Categorical(logits=p).entropy() for p in parts)
        _, log_std = self._gaussian()
        return (log_std + 0.5 + 0.5 * math.log(2 * math.pi)).sum(-1)

    def _gaussian(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert isinstance(self.space, Box)
        k = self.space.flat_dim
        return self.inputs[..., :k], self.inputs[..., k:]
