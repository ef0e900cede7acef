"""Action masks inside the network (§11.6): forbidden logits become MASKED_LOGIT.

The mask is a leaf of the observation, so it is in every flat row the learner trains on and in
every input the exported graph takes: the policy the engines run and the policy the loss
differentiates apply the same mask, and the masked log-probability is what both compute. The
network itself also sees the mask as features (it tells which moves are legal).
"""

from __future__ import annotations

import torch

from tether.protocol.action_mask import MASKED_LOGIT, ActionMask

from .policy_model import PolicyModel


class MaskedPolicy(PolicyModel):
    """``inner`` with its logits masked by the mask leaf of the (raw) observation."""

    def __init__(self, inner: PolicyModel, mask: ActionMask) -> None:
        super().__init__()
        self.inner = inner
        self.action_space = inner.action_space
        self.state_shape = inner.state_shape
        self.mask_offset = mask.leaf.offset
        self.mask_size = mask.leaf.size

    def dist_inputs(self, obs: torch.Tensor) -> torch.Tensor:
        return self._masked(obs, self.inner.dist_inputs(obs))

    def step(self, obs: torch.Tensor, critic_obs: torch.Tensor | None, state: tuple[torch.Tensor, ...]
             ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, ...]]:
        logits, values, state = self.inner.step(obs, critic_obs, state)
        return self._masked(obs, logits), values, state

    def _masked(self, obs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        allowed = obs[:, self.mask_offset:self.mask_offset + self.mask_size] != 0
        return torch.where(allowed, logits, torch.full_like(logits, MASKED_LOGIT))

    def value(self, critic_obs: torch.Tensor) -> torch.Tensor:
        return self.inner.value(critic_obs)
