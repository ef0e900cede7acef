"""Observation and action spaces in the JSON form SET_CONFIG carries.

The JSON form mirrors gymnasium's spaces so every SDK can describe them
without gymnasium::

    {"type": "Box", "shape": [4], "dtype": "float32", "low": -1.0, "high": [1, 2, 3, "inf"]}
    {"type": "Discrete", "n": 2, "start": 0}
    {"type": "MultiDiscrete", "nvec": [3, 3]}

``low``/``high`` are a single number (the same bound everywhere) or a flat
list of ``prod(shape)`` numbers in row-major order; unbounded entries are the
strings ``"inf"`` and ``"-inf"`` because JSON has no infinity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from .errors import ErrorCode, MessageError


def _bound_to_json(values: np.ndarray) -> Any:
    flat = values.astype(np.float64).ravel()
    if flat.size and np.all(flat == flat[0]):
        return _number_to_json(float(flat[0]))
    return [_number_to_json(float(v)) for v in flat]


def _number_to_json(v: float) -> Any:
    if v == np.inf:
        return "inf"
    if v == -np.inf:
        return "-inf"
    return int(v) if v.is_integer() and abs(v) < 2**53 else v


def _bound_from_json(value: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
    def number(v: Any) -> float:
        if v == "inf":
            return np.inf
        if v == "-inf":
            return -np.inf
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"Box {what} entries must be numbers or 'inf'/'-inf', got {v!r}")
        return float(v)

    size = int(np.prod(shape)) if shape else 1
    if isinstance(value, list):
        if len(value) != size:
            raise ValueError(f"Box {what} has {len(value)} entries, shape {list(shape)} needs {size}")
        return np.array([number(v) for v in value], dtype=np.float64).reshape(shape)
    return np.full(shape, number(value), dtype=np.float64)


@dataclass(frozen=True)
class Box:
    """A box in R^shape with per-element bounds (gymnasium.spaces.Box)."""

    low: np.ndarray
    high: np.ndarray
    dtype: str = "float32"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.low.shape)

    @property
    def flat_dim(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    @property
    def is_bytes(self) -> bool:
        """A uint8 box (**[1.4]**, §8.1): integer values 0-255, such as camera images; every other
        dtype is handled as float32."""
        return self.dtype == "uint8"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "Box",
            "shape": list(self.shape),
            "dtype": self.dtype,
            "low": _bound_to_json(self.low),
            "high": _bound_to_json(self.high),
        }

    def contains_batch(self, x: np.ndarray) -> np.ndarray:
        """Per-row membership for a batch shaped (N, *shape)."""
        axes = tuple(range(1, x.ndim))
        # Compare at the batch's precision: a float32 action clipped to 0.1 is
        # 0.100000001, which must still count as inside a bound of 0.1.
        low, high = self.low.astype(x.dtype), self.high.astype(x.dtype)
        return np.all((x >= low) & (x <= high), axis=axes)


@dataclass(frozen=True)
class Discrete:
    """The integers start, ..., start + n - 1 (gymnasium.spaces.Discrete)."""

    n: int
    start: int = 0

    shape: tuple[int, ...] = field(default=(), init=False)

    @property
    def flat_dim(self) -> int:
        return 1

    def to_json(self) -> dict[str, Any]:
        return {"type": "Discrete", "n": self.n, "start": self.start}

    def contains_batch(self, x: np.ndarray) -> np.ndarray:
        return (x == np.round(x)) & (x >= self.start) & (x < self.start + self.n)


@dataclass(frozen=True)
class MultiDiscrete:
    """A vector of independent discrete choices, entry i in [0, nvec[i])."""

    nvec: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.nvec),)

    @property
    def flat_dim(self) -> int:
        return len(self.nvec)

    def to_json(self) -> dict[str, Any]:
        return {"type": "MultiDiscrete", "nvec": list(self.nvec)}

    def contains_batch(self, x: np.ndarray) -> np.ndarray:
        nvec = np.asarray(self.nvec)
        return np.all((x == np.round(x)) & (x >= 0) & (x < nvec), axis=tuple(range(1, x.ndim)))


Space = Union[Box, Discrete, MultiDiscrete]


def space_from_json(data: Any) -> Space:
    """Parse a space's JSON form; raises ``MessageError`` (INVALID_FIELD) when malformed."""
    try:
        if not isinstance(data, dict):
            raise ValueError(f"a space must be a JSON object, got {type(data).__name__}")
        kind = data.get("type")
        if kind == "Box":
            shape = tuple(int(d) for d in data["shape"])
            if any(d < 0 for d in shape):
                raise ValueError(f"Box shape must be non-negative, got {list(shape)}")
            low = _bound_from_json(data.get("low", "-inf"), shape, "low")
            high = _bound_from_json(data.get("high", "inf"), shape, "high")
            if np.any(low > high):
                raise ValueError("Box low must not exceed high")
            dtype = data.get("dtype", "float32")
            if not isinstance(dtype, str):
                raise ValueError(f"Box dtype must be a string, got {dtype!r}")
            if dtype == "uint8" and (np.any(low < 0) or np.any(high > 255)):
                raise ValueError("a uint8 Box's bounds must lie within [0, 255]")
            return Box(low=low, high=high, dtype=dtype)
        if kind == "Discrete":
            n = data["n"]
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"Discrete n must be a positive integer, got {n!r}")
            return Discrete(n=n, start=int(data.get("start", 0)))
        if kind == "MultiDiscrete":
            nvec = tuple(int(v) for v in data["nvec"])
            if not nvec or any(v < 1 for v in nvec):
                raise ValueError(f"MultiDiscrete nvec must be positive integers, got {list(nvec)}")
            return MultiDiscrete(nvec=nvec)
        raise ValueError(f"unknown space type {kind!r} (Box, Discrete, MultiDiscrete)")
    except (KeyError, TypeError, ValueError) as exc:
        detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise MessageError(ErrorCode.INVALID_FIELD, f"invalid space: {detail}") from None


def box(low: Any, high: Any, shape: tuple[int, ...] | None = None, dtype: str = "float32") -> Box:
    """Convenience constructor mirroring ``gymnasium.spaces.Box(low, high, shape)``."""
    if shape is None:
        shape = np.shape(low) if np.ndim(low) else np.shape(high)
    return Box(
        low=np.broadcast_to(np.asarray(low, dtype=np.float64), shape).copy(),
        high=np.broadcast_to(np.asarray(high, dtype=np.float64), shape).copy(),
        dtype=dtype,
    )


def from_gymnasium(space: Any) -> Space:
    """Convert a gymnasium Box, Discrete or MultiDiscrete (duck-typed; no import needed)."""
    name = type(space).__name__
    if name == "Box":
        return box(space.low, space.high, tuple(space.shape), str(space.dtype))
    if name == "Discrete":
        return Discrete(n=int(space.n), start=int(space.start))
    if name == "MultiDiscrete":
        nvec = np.asarray(space.nvec)
        start = np.asarray(getattr(space, "start", np.zeros_like(nvec)))
        # The protocol's MultiDiscrete (§8.3) is one row of choices from 0: converting another
        # would change which actions are valid, so it is refused here, not at the first batch.
        if nvec.ndim != 1 or np.any(start != 0):
            raise TypeError(f"unsupported space {space!r}: a MultiDiscrete must have a one-dimensional nvec and "
                            "start 0 (flatten it, or shift its actions to start at 0)")
        return MultiDiscrete(nvec=tuple(int(v) for v in nvec))
    if isinstance(space, (Box, Discrete, MultiDiscrete)):
        return space
    raise TypeError(f"unsupported space {space!r}: use Box, Discrete or MultiDiscrete")


def to_gymnasium(space: Space) -> Any:
    """Convert to the gymnasium space (imports gymnasium)."""
    import gymnasium as gym

    if isinstance(space, Box):
        dtype = np.dtype(space.dtype)
        return gym.spaces.Box(space.low.astype(dtype), space.high.astype(dtype), space.shape, dtype=dtype)
    if isinstance(space, Discrete):
        return gym.spaces.Discrete(space.n, start=space.start)
    return gym.spaces.MultiDiscrete(list(space.nvec))
