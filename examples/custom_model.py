"""A network of your own for a module: a residual MLP with layer normalisation.

Run the server with it (the module must be importable, hence PYTHONPATH)::

    PYTHONPATH=examples tether serve --model '{"class": "custom_model:ResidualMlp", "options": {"width": 128}}'

Any torch module works that subclasses PolicyModel and whose ``dist_inputs`` torch.onnx.export can
trace: it is exported once, then only its weights are rewritten for each new version
(docs/models.md).
"""

from __future__ import annotations

import torch
from torch import nn

from tether.protocol.distributions import dist_inputs_size
from tether.protocol.spaces import Box, Space
from tether.server.learner.policy_model import PolicyModel


class ResidualBlock(nn.Module):
    """x + W2 relu(W1 layernorm(x))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.inner = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.inner(self.norm(x))


class ResidualMlp(PolicyModel):
    """Policy: a projection, ``blocks`` residual blocks and a linear head; value: the same shape, separate weights."""

    def __init__(self, observation_space: Space, action_space: Space, obs_dim: int, critic_input_dim: int,
                 width: int = 64, blocks: int = 2) -> None:
        super().__init__()
        out = dist_inputs_size(action_space)
        gaussian = isinstance(action_space, Box)
        self.policy = nn.Sequential(nn.Linear(obs_dim, width), *[ResidualBlock(width) for _ in range(blocks)],
                                    nn.Linear(width, out // 2 if gaussian else out))
        # A Box action's log standard deviation: one learned value per action dimension (§11).
        self.log_std = nn.Parameter(torch.zeros(out // 2)) if gaussian else None
        self.critic = nn.Sequential(nn.Linear(critic_input_dim, width),
                                    *[ResidualBlock(width) for _ in range(blocks)], nn.Linear(width, 1))

    def dist_inputs(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.policy(obs)
        if self.log_std is not None:
            out = torch.cat([out, self.log_std.expand_as(out)], dim=-1)
        return out

    def value(self, critic_obs: torch.Tensor) -> torch.Tensor:
        return self.critic(critic_obs).squeeze(-1)
