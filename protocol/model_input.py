"""How observations are fed to a policy model (§12.1): its input's element type and shape.

A model of a float observation space takes (batch, obs_dim) float32; **[1.4]** one of a uint8 Box
takes the observations as they are, (batch, *shape) uint8 (an image in HWC order), and converts and
scales them inside the graph. A client reads which from the model itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ModelInput:
    """The layout of a model's observation input, batch dimension left out."""

    dtype: np.dtype
    #: Dimensions after the batch; None when the model leaves one open (then rows are flattened).
    dims: tuple[int, ...] | None

    @staticmethod
    def of(onnx_type: str, shape: list[Any]) -> "ModelInput":
        """From ONNX Runtime's description of the input (``NodeArg.type``, ``NodeArg.shape``)."""
        dtype = np.dtype(np.uint8) if onnx_type == "tensor(uint8)" else np.dtype(np.float32)
        rest = tuple(shape[1:])
        dims = rest if rest and all(isinstance(d, int) for d in rest) else None
        return ModelInput(dtype, dims)

    def feed(self, obs: np.ndarray, rows: int) -> np.ndarray:
        """``rows`` observations (any layout of their values) as the input takes them."""
        return np.asarray(obs, dtype=self.dtype).reshape((rows, *self.dims) if self.dims is not None else (rows, -1))
