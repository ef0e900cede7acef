"""A CNN that reads flat HWC images (the ``cnn`` encoder of model_config.py).

Engines produce images height x width x channels; the protocol carries an observation as a flat
vector. The encoder undoes the flattening, moves channels first as torch's convolutions want, scales
the values and runs Nature-CNN (or the configured layers). An input of several images side by side
(a group's members, a centralized critic's agents) is read image by image with the same weights.
Everything is a plain reshape, so the exported ONNX graph takes the same flat vector.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .model_config import ModelConfig


def _conv(in_channels: int, out_channels: int, kernel: int, stride: int) -> nn.Conv2d:
    layer = nn.Conv2d(in_channels, out_channels, kernel, stride)
    nn.init.orthogonal_(layer.weight, math.sqrt(2))
    nn.init.zeros_(layer.bias)
    return layer


class ImageEncoder(nn.Module):
    """Flat HWC images -> ReLU features, ``dense`` per image."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        assert config.image_shape is not None
        self.image_shape = config.image_shape
        self.image_size = math.prod(config.image_shape)
        self.scale = config.scale
        self.dense_size = config.dense
        height, width, channels = config.image_shape
        layers: list[nn.Module] = []
        for out_channels, kernel, stride in config.conv:
            layers += [_conv(channels, out_channels, kernel, stride), nn.ReLU()]
            channels = out_channels
            height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
        self.conv = nn.Sequential(*layers)
        dense = nn.Linear(channels * height * width, config.dense)
        nn.init.orthogonal_(dense.weight, math.sqrt(2))
        nn.init.zeros_(dense.bias)
        self.dense = nn.Sequential(nn.Flatten(), dense, nn.ReLU())

    def features_size(self, input_size: int) -> int:
        """Width of the features of an input of ``input_size`` values (whole images)."""
        return input_size // self.image_size * self.dense_size

    def forward(self, flat: torch.Tensor) -> torch.Tensor:
        images = flat.shape[-1] // self.image_size
        height, width, channels = self.image_shape
        x = flat.reshape(-1, height, width, channels).permute(0, 3, 1, 2) * self.scale
        return self.dense(self.conv(x)).reshape(-1, images * self.dense_size)
