"""The built-in network a module trains: an encoder (none, or a CNN), then a policy MLP and a
separate value MLP (CleanRL's Agent; its Atari agent with the CNN)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from tether.protocol.distributions import dist_inputs_size
from tether.protocol.spaces import Box, Leaf, Space

from .composite_encoder import CompositeEncoder
from .image_encoder import ImageEncoder
from .model_config import ModelConfig
from .policy_model import PolicyModel
from .recurrent_core import RecurrentCore


#: Initial log standard deviation of a Box policy: std 1, as in CleanRL and
#: Stable-Baselines3. Pendulum-v1 (torque in [-2, 2]) reached a mean return of
#: -300 in about 57k env steps from 0 and about 72k from -0.5 (std 0.61).
LOG_STD_INIT = 0.0


def critic_input_dim(obs_dim: int, value_obs_dim: int | None) -> int:
    """Width of the value head's input: the own observation, preceded by the
    module's value_obs when it has a centralized critic."""
    return obs_dim if value_obs_dim is None else value_obs_dim + obs_dim


def _layer(in_dim: int, out_dim: int, gain: float) -> nn.Linear:
    layer = nn.Linear(in_dim, out_dim)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, out_gain: float) -> nn.Sequential:
    """Linear+Tanh layers; the shape onnx_export.py knows how to write."""
    layers: list[nn.Module] = []
    last = in_dim
    for width in hidden:
        layers += [_layer(last, width, math.sqrt(2)), nn.Tanh()]
        last = width
    layers.append(_layer(last, out_dim, out_gain))
    return nn.Sequential(*layers)


class ActorCritic(PolicyModel):
    """Policy head outputs action_dist_inputs; the value head is used only in training.

    With the ``cnn`` encoder both heads read the features of one shared CNN (as CleanRL's Atari
    agent): the policy the features of the agent's images, the value those of every image of its
    critic input.

    For Box actions the log standard deviation is a state-independent
    parameter appended to the mean, as the protocol's Gaussian expects.

    With a centralized critic (``value_obs_dim`` given) the value head sees the
    module's ``value_obs`` followed by the agent's own observation (MAPPO's
    agent-specific global state): agents of one module share ``value_obs``, so
    without their own observation the critic could only learn the average of
    their returns. ``build_batch`` lays the rows out in that order.

    With a ``recurrent`` core (model_config.py) the encoder's features go through the core; the
    policy head reads its output, and the value head its output followed by the encoded critic input
    (the value shares the core, so the state the engines carry is all the learner needs).
    """

    def __init__(
        self,
        obs_dim: int,
        action_space: Space,
        hidden: tuple[int, ...] = (64, 64),
        value_obs_dim: int | None = None,
        model: ModelConfig | None = None,
        leaves: tuple[Leaf, ...] | None = None,
    ) -> None:
        """``leaves``: a composite observation's (§8.6), whose image leaves the ``cnn`` encoder reads."""
        super().__init__()
        self.action_space = action_space
        self.obs_dim = obs_dim
        out = dist_inputs_size(action_space)
        if isinstance(action_space, Box):
            out //= 2
            self.log_std = nn.Parameter(torch.full((out,), LOG_STD_INIT))
        else:
            self.log_std = None
        critic_dim = critic_input_dim(obs_dim, value_obs_dim)
        self.encoder: ImageEncoder | CompositeEncoder | None = None
        if model is not None and model.encoder == "cnn":
            self.encoder = CompositeEncoder(leaves, model) if leaves is not None else ImageEncoder(model)
        actor_in = obs_dim if self.encoder is None else self.encoder.features_size(obs_dim)
        critic_in = critic_dim if self.encoder is None else self.encoder.features_size(critic_dim)
        self.core: RecurrentCore | None = None
        if model is not None and model.recurrent is not None:
            self.core = RecurrentCore(model.recurrent.type, actor_in, model.recurrent.size)
            self.state_shape = (self.core.state_count, self.core.size)
            actor_in, critic_in = self.core.size, self.core.size + critic_in
        self.actor = mlp(actor_in, hidden, out, 0.01)
        self.critic = mlp(critic_in, hidden, 1, 1.0)

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        return obs if self.encoder is None else self.encoder(obs)

    def _head(self, features: torch.Tensor) -> torch.Tensor:
        out = self.actor(features)
        if self.log_std is not None:
            out = torch.cat([out, self.log_std.expand_as(out)], dim=-1)
        return out

    def dist_inputs(self, obs: torch.Tensor) -> torch.Tensor:
        """The action distribution inputs; with a recurrent core, of a first step (the zero state)."""
        if self.core is not None:
            return self.step(obs, None, self.core.initial_state(obs.shape[0], obs.device))[0]
        return self._head(self._features(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values; with a recurrent core, of a first step (the zero state)."""
        if self.core is not None:
            values = self.step(obs[:, -self.obs_dim:], obs, self.core.initial_state(obs.shape[0], obs.device))[1]
            assert values is not None
            return values
        return self.critic(self._features(obs)).squeeze(-1)

    def step(self, obs: torch.Tensor, critic_obs: torch.Tensor | None, state: tuple[torch.Tensor, ...]
             ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, ...]]:
        assert self.core is not None, "step needs a recurrent core"
        out, state = self.core.step(self._features(obs), state)
        values = None
        if critic_obs is not None:
            values = self.critic(torch.cat([out, self._features(critic_obs)], dim=1)).squeeze(-1)
        return self._head(out), values, state


def flat_obs_dim(space: Space) -> int:
    return int(np.prod(space.shape)) if space.shape else 1
