"""The ``cnn`` encoder of a composite observation (§8.6): one CNN per image leaf, the other leaves
as they are, features side by side (ML-Agents' and Stable-Baselines3's CombinedExtractor).

The learner holds a composite observation as one flat row of its leaves' values in leaf order
(protocol/spaces.py); an image leaf is a uint8 Box of rank 3 (height, width, channels). Each gets
its own Nature-CNN (the configured layers), so a camera and a minimap are read by different
weights. An input of several observations side by side (a centralized critic's) is read
observation by observation with the same weights.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from tether.protocol.spaces import Leaf

from .image_encoder import ImageEncoder
from .model_config import ModelConfig, ModelConfigError, check_conv_fits


def image_leaves(leaves: tuple[Leaf, ...]) -> list[Leaf]:
    """The leaves a CNN reads: uint8 Boxes of rank 3 (HWC images)."""
    return [leaf for leaf in leaves if leaf.is_bytes and len(leaf.space.shape) == 3]


class CompositeEncoder(nn.Module):
    """Flat composite rows -> image features (per image leaf) followed by the other leaves' values."""

    def __init__(self, leaves: tuple[Leaf, ...], config: ModelConfig) -> None:
        super().__init__()
        images = image_leaves(leaves)
        if not images:
            raise ModelConfigError("model: encoder 'cnn' needs an image leaf (a uint8 Box of shape [height, width, "
                                   "channels]) in the Dict or Tuple observation")
        self.obs_dim = sum(leaf.size for leaf in leaves)
        self._images = [(leaf.offset, leaf.size) for leaf in images]
        self._rest = [(leaf.offset, leaf.size) for leaf in leaves if leaf not in images]
        for leaf in images:
            try:
                check_conv_fits(config.conv, tuple(leaf.space.shape))
            except ModelConfigError as exc:
                raise ModelConfigError(f"{exc} (image leaf {leaf.path!r})") from None
        self.cnns = nn.ModuleList(
            ImageEncoder(dataclasses.replace(config, image_shape=tuple(leaf.space.shape))) for leaf in images)
        self.rest_size = sum(size for _, size in self._rest)
        self.per_obs = sum(cnn.dense_size for cnn in self.cnns) + self.rest_size

    def features_size(self, input_size: int) -> int:
        """Width of the features of ``input_size`` values (whole observations)."""
        return input_size // self.obs_dim * self.per_obs

    def forward(self, flat: torch.Tensor) -> torch.Tensor:
        count = flat.shape[-1] // self.obs_dim
        rows = flat.reshape(-1, self.obs_dim)
        parts = [cnn(rows[:, offset:offset + size]) for cnn, (offset, size) in zip(self.cnns, self._images)]
        parts += [rows[:, offset:offset + size] for offset, size in self._rest]
        return torch.cat(parts, dim=1).reshape(-1, count * self.per_obs)
