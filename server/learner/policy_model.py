"""The interface every module network follows, built-in or the user's (``model = {class = ...}``).

A network is a torch ``nn.Module`` that subclasses :class:`PolicyModel`, built as
``Class(observation_space=, action_space=, obs_dim=, critic_input_dim=, **options)`` and providing:

* ``dist_inputs(obs)``: (batch, obs_dim) float32 -> (batch, K) action distribution inputs (§11 of
  docs/protocol.md: logits, or mean and log standard deviation side by side). This is the part that
  is exported to ONNX and run in the engines, so it must be traceable by ``torch.onnx.export``
  (no data-dependent Python control flow) and use only its parameters and the input.
* ``value(critic_obs)``: (batch, critic_input_dim) -> (batch,) values (trained only on the server).
  ``critic_input_dim`` is ``obs_dim``, or with a centralized critic the listed agents' observations
  followed by the agent's own.

A network with memory (the built-in ``recurrent`` core; model_config.py) also has ``state_shape``
(tensors, units) and ``step(obs, critic_obs, state)``: one step for a batch, from the state before it,
giving (dist inputs, values or None, the state after it). The engines run ``step`` with the state fed
back; the learner runs it along sequences.
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

from tether.protocol.spaces import Space

from .distributions import ActionDistribution
from .model_config import ModelConfig, ModelConfigError


class PolicyModel(nn.Module):
    """Base class of module networks: subclasses define ``dist_inputs`` and ``value``."""

    action_space: Space
    #: (state tensors, units) of a network with memory; None without.
    state_shape: tuple[int, int] | None = None

    def step(self, obs: torch.Tensor, critic_obs: torch.Tensor | None, state: tuple[torch.Tensor, ...]
             ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, ...]]:  # pragma: no cover - interface
        """One step of a network with memory: (dist inputs, values of ``critic_obs`` or None, next state)."""
        raise NotImplementedError

    def dist_inputs(self, obs: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        """Action distribution inputs for a batch of flat observations."""
        raise NotImplementedError

    def value(self, critic_obs: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        """State values for a batch of critic inputs, shape (batch,)."""
        raise NotImplementedError

    def evaluate(
        self, obs: torch.Tensor, actions: torch.Tensor, value_obs: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logp of actions, entropy, value) for a batch; the value reads ``value_obs`` when given."""
        dist = ActionDistribution(self.action_space, self.dist_inputs(obs))
        return dist.log_prob(actions), dist.entropy(), self.value(obs if value_obs is None else value_obs)


def load_user_model(config: ModelConfig, observation_space: Space, action_space: Space, obs_dim: int,
                    critic_input_dim: int) -> PolicyModel:
    """Import and build ``config.user_class``; a missing class or a wrong kind is a ModelConfigError."""
    assert config.user_class is not None
    module_name, class_name = config.user_class.split(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ModelConfigError(f"model: cannot import {config.user_class!r}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, PolicyModel)):
        raise ModelConfigError(f"model: {config.user_class!r} is not a subclass of "
                               f"tether.server.learner.policy_model.PolicyModel")
    try:
        model = cls(observation_space=observation_space, action_space=action_space, obs_dim=obs_dim,
                    critic_input_dim=critic_input_dim, **config.options)
    except Exception as exc:  # noqa: BLE001 - the user's constructor: whatever it raises is a configuration error
        raise ModelConfigError(f"model: building {config.user_class!r} failed: {exc!r:.300}") from None
    model.action_space = action_space
    return model


def check_output_width(model: PolicyModel, obs_dim: int, expected: int, what: str) -> None:
    """Refuses a network whose dist_inputs is not (batch, ``expected``) wide, before training starts."""
    try:
        with torch.no_grad():
            out = model.dist_inputs(torch.zeros(2, obs_dim))
    except Exception as exc:  # noqa: BLE001 - the user's network: whatever it raises is a configuration error
        raise ModelConfigError(f"model: {what}'s dist_inputs fails on 2 observations: {exc!r:.300}") from None
    if tuple(out.shape) != (2, expected):
        raise ModelConfigError(f"model: {what} returns dist_inputs of shape {tuple(out.shape)} for 2 observations; "
                               f"the action space needs (2, {expected})")
