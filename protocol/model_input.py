"""How observations are fed to a policy model (§12.1): its input's element type and shape.

A model of a float observation space takes (batch, obs_dim) float32; **[1.4]** one of a uint8 Box
takes the observations as they are, (batch, *shape) uint8 (an image in HWC order), and converts and
scales them inside the graph. A client reads which from the model itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .spaces import is_composite


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


class ModelFeeds:
    """A model's inputs filled from observations (§12.1): one input, or **[1.4]** for a Dict or Tuple
    observation one input per leaf, named by the leaf's path, each in its own element type and shape.

    Observations of a composite space are given as flat rows (``flatten_observation``: the leaves'
    values in leaf order); others as before, in any layout of their values."""

    def __init__(self, inputs: list[tuple[str, ModelInput, slice | None]]) -> None:
        #: (input name, layout, the leaf's values within a flat row, or None for the whole row).
        self.inputs = inputs

    @staticmethod
    def of_session(session_inputs: list[Any], observation_space: Any = None,
                   input_name: str | None = None) -> "ModelFeeds":
        """From ONNX Runtime's ``get_inputs()``; raises ValueError when a leaf has no input of its name."""
        by_name = {i.name: i for i in session_inputs}
        if observation_space is not None and is_composite(observation_space):
            inputs: list[tuple[str, ModelInput, slice | None]] = []
            for leaf in observation_space.leaves:
                found = by_name.get(leaf.path)
                if found is None:
                    raise ValueError(f"the model has no input {leaf.path!r} for that leaf of the observation space "
                                     f"(its inputs: {sorted(by_name)})")
                inputs.append((leaf.path, ModelInput.of(found.type, list(found.shape)),
                               slice(leaf.offset, leaf.offset + leaf.size)))
            return ModelFeeds(inputs)
        chosen = by_name.get(input_name or "", session_inputs[0])
        return ModelFeeds([(chosen.name, ModelInput.of(chosen.type, list(chosen.shape)), None)])

    @property
    def single(self) -> ModelInput | None:
        """The one input's layout of a non-composite observation, else None."""
        return self.inputs[0][1] if len(self.inputs) == 1 and self.inputs[0][2] is None else None

    def feed(self, obs: np.ndarray, rows: int) -> dict[str, np.ndarray]:
        """``rows`` observations as the model's inputs, by name."""
        if self.inputs[0][2] is None:
            name, layout, _ = self.inputs[0]
            return {name: layout.feed(obs, rows)}
        flat = np.asarray(obs).reshape(rows, -1)
        return {name: np.ascontiguousarray(layout.feed(flat[:, part], rows)) for name, layout, part in self.inputs}
