"""Observation and action spaces in the JSON form SET_CONFIG carries.

The JSON form mirrors gymnasium's spaces so every SDK can describe them
without gymnasium::

    {"type": "Box", "shape": [4], "dtype": "float32", "low": -1.0, "high": [1, 2, 3, "inf"]}
    {"type": "Discrete", "n": 2, "start": 0}
    {"type": "MultiDiscrete", "nvec": [3, 3]}
    {"type": "Dict", "spaces": {"camera": {...}, "speed": {...}}}      (1.4, observations only)
    {"type": "Tuple", "spaces": [{...}, {...}]}                        (1.4, observations only)

``low``/``high`` are a single number (the same bound everywhere) or a flat
list of ``prod(shape)`` numbers in row-major order; unbounded entries are the
strings ``"inf"`` and ``"-inf"`` because JSON has no infinity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeGuard, Union

import numpy as np

from .errors import ErrorCode, InvalidInputError, MessageError


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

    @cached_property  # (read on every client call: once found, a plain attribute)
    def flat_dim(self) -> int:
        return int(self.low.size)  # (1 for a scalar box)

    @cached_property  # (read on every client call: once found, a plain attribute)
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


#: A space that is not composite: what a Dict or Tuple holds at its leaves.
LeafSpace = Union[Box, Discrete, MultiDiscrete]

#: Limits on composite spaces (§8.6): deeper or wider ones are refused as INVALID_FIELD.
MAX_SPACE_DEPTH = 8
MAX_LEAVES = 64
_KEY_CHARACTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


@dataclass(frozen=True)
class Leaf:
    """One leaf of a composite observation space (§8.6): where its values sit in the flat row."""

    #: Keys and tuple indices from the root, joined by ``.`` ("camera", "sensors.0").
    path: str
    space: LeafSpace
    #: Position of its first value in the flat row, and how many values it has there.
    offset: int
    size: int

    @property
    def is_bytes(self) -> bool:
        return isinstance(self.space, Box) and self.space.is_bytes


def _leaves(children: list[tuple[str, "Space"]], prefix: str) -> list[tuple[str, LeafSpace]]:
    out: list[tuple[str, LeafSpace]] = []
    for name, child in children:
        path = f"{prefix}.{name}" if prefix else name
        if isinstance(child, (Dict, Tuple)):
            out += [(f"{path}.{p}", s) for p, s in ((leaf.path, leaf.space) for leaf in child.leaves)]
        else:
            out.append((path, child))
    return out


class _Composite:
    """What Dict and Tuple share: their leaves, depth first, and a flat row of all their values."""

    def _children(self) -> list[tuple[str, "Space"]]:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def leaves(self) -> tuple[Leaf, ...]:
        """The leaves in the order of §8.6 (Dict keys sorted, Tuple items in order, depth first)."""
        cached = self.__dict__.get("_leaf_cache")
        if cached is None:
            cached, offset = [], 0
            for path, space in _leaves(self._children(), ""):
                size = space.flat_dim
                cached.append(Leaf(path, space, offset, size))
                offset += size
            cached = tuple(cached)
            object.__setattr__(self, "_leaf_cache", cached)
        return cached

    def leaf(self, path: str) -> Leaf | None:
        """The leaf at ``path``, or None."""
        return next((leaf for leaf in self.leaves if leaf.path == path), None)

    @property
    def flat_dim(self) -> int:
        return sum(leaf.size for leaf in self.leaves)

    @property
    def shape(self) -> tuple[int, ...]:
        """The flat row's shape: a composite observation is stored and trained on as one row of its
        leaves' values (each leaf flattened, converted to float32, in leaf order)."""
        return (self.flat_dim,)


@dataclass(frozen=True, eq=True)
class Dict(_Composite):
    """Named subspaces (gymnasium.spaces.Dict); **[1.4]** observation spaces only."""

    #: (key, space) pairs sorted by key, as gymnasium orders them.
    spaces: tuple[tuple[str, "Space"], ...]

    def _children(self) -> list[tuple[str, "Space"]]:
        return list(self.spaces)

    def to_json(self) -> dict[str, Any]:
        return {"type": "Dict", "spaces": {key: space.to_json() for key, space in self.spaces}}


@dataclass(frozen=True, eq=True)
class Tuple(_Composite):
    """Subspaces in order (gymnasium.spaces.Tuple); **[1.4]** observation spaces only."""

    spaces: tuple["Space", ...]

    def _children(self) -> list[tuple[str, "Space"]]:
        return [(str(i), space) for i, space in enumerate(self.spaces)]

    def to_json(self) -> dict[str, Any]:
        return {"type": "Tuple", "spaces": [space.to_json() for space in self.spaces]}


Space = Union[Box, Discrete, MultiDiscrete, Dict, Tuple]


def is_composite(space: Any) -> TypeGuard["Dict | Tuple"]:
    """A Dict or a Tuple (§8.6)."""
    return isinstance(space, (Dict, Tuple))


def _dict_key(key: Any) -> str:
    if not isinstance(key, str) or not key or not set(key) <= _KEY_CHARACTERS:
        raise ValueError(f"a Dict key must be a non-empty string of letters, digits, '_' and '-', got {key!r}")
    return key


def space_from_json(data: Any) -> Space:
    """Parse a space's JSON form; raises ``MessageError`` (INVALID_FIELD) when malformed."""
    try:
        return _space_from_json(data, 1)
    except (KeyError, TypeError, ValueError) as exc:
        detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise MessageError(ErrorCode.INVALID_FIELD, f"invalid space: {detail}") from None


def _space_from_json(data: Any, depth: int) -> Space:
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
    if kind in ("Dict", "Tuple"):
        if depth > MAX_SPACE_DEPTH:
            raise ValueError(f"composite spaces nest at most {MAX_SPACE_DEPTH} levels deep")
        children = data["spaces"]
        composite: Space
        if kind == "Dict":
            if not isinstance(children, dict) or not children:
                raise ValueError("a Dict's spaces must be a non-empty object of named spaces")
            composite = Dict(tuple(sorted((_dict_key(k), _space_from_json(v, depth + 1))
                                          for k, v in children.items())))
        else:
            if not isinstance(children, list) or not children:
                raise ValueError("a Tuple's spaces must be a non-empty array of spaces")
            composite = Tuple(tuple(_space_from_json(v, depth + 1) for v in children))
        if len(composite.leaves) > MAX_LEAVES:
            raise ValueError(f"a composite space has at most {MAX_LEAVES} leaves, got {len(composite.leaves)}")
        return composite
    raise ValueError(f"unknown space type {kind!r} (Box, Discrete, MultiDiscrete, Dict, Tuple)")


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
    if name == "Dict":
        return Dict(tuple(sorted((_dict_key(str(k)), from_gymnasium(v)) for k, v in space.spaces.items())))
    if name == "Tuple":
        return Tuple(tuple(from_gymnasium(v) for v in space.spaces))
    if isinstance(space, (Box, Discrete, MultiDiscrete, Dict, Tuple)):
        return space
    raise TypeError(f"unsupported space {space!r}: use Box, Discrete, MultiDiscrete, Dict or Tuple")


def to_gymnasium(space: Space) -> Any:
    """Convert to the gymnasium space (imports gymnasium)."""
    import gymnasium as gym

    if isinstance(space, Box):
        dtype = np.dtype(space.dtype)
        return gym.spaces.Box(space.low.astype(dtype), space.high.astype(dtype), space.shape, dtype=dtype)
    if isinstance(space, Discrete):
        return gym.spaces.Discrete(space.n, start=space.start)
    if isinstance(space, Dict):
        return gym.spaces.Dict({key: to_gymnasium(child) for key, child in space.spaces})
    if isinstance(space, Tuple):
        return gym.spaces.Tuple([to_gymnasium(child) for child in space.spaces])
    return gym.spaces.MultiDiscrete(list(space.nvec))


def flatten_observation(space: "Dict | Tuple", observation: Any) -> np.ndarray:
    """**[1.4]** One observation of a Dict or Tuple space as its flat float32 row (§8.6): a Dict's as a
    mapping of its keys (nested for nested spaces), a Tuple's as a sequence; each leaf's values
    flattened row-major, in leaf order. Raises InvalidInputError (a ValueError) naming a missing or
    unknown leaf (OBS_LEAF_MISMATCH) or one of another size, or of another shape unless flat
    (OBS_SHAPE_MISMATCH)."""
    parts = []
    for leaf in space.leaves:
        value: Any = observation
        for step in leaf.path.split("."):
            try:
                value = value[int(step)] if isinstance(value, (list, tuple)) else value[step]
            except (KeyError, IndexError, TypeError, ValueError):
                raise InvalidInputError(ErrorCode.OBS_LEAF_MISMATCH, f"the observation has no leaf {leaf.path!r} "
                                        f"(the space's leaves: {', '.join(l.path for l in space.leaves)})") from None
        try:
            array = np.asarray(value, dtype=np.float32)
        except (TypeError, ValueError):
            raise InvalidInputError(ErrorCode.OBS_SHAPE_MISMATCH, f"observation leaf {leaf.path!r} is not an "
                                    f"array of numbers") from None
        if array.size != leaf.size:
            raise InvalidInputError(ErrorCode.OBS_SHAPE_MISMATCH, f"observation leaf {leaf.path!r} has {array.size} values; its space "
                             f"{leaf.space.to_json()['type']} of shape {list(leaf.space.shape)} has {leaf.size}")
        if array.ndim > 1 and array.shape != tuple(leaf.space.shape):  # (e.g. a CHW camera for an HWC leaf)
            raise InvalidInputError(ErrorCode.OBS_SHAPE_MISMATCH, f"observation leaf {leaf.path!r} has shape "
                                    f"{list(array.shape)}; its space has shape {list(leaf.space.shape)} (pass it in "
                                    "that shape, or flat)")
        parts.append(array.reshape(-1))
    extra = _unknown_keys(space, observation, "")
    if extra:
        raise InvalidInputError(ErrorCode.OBS_LEAF_MISMATCH,
                                f"the observation has leaves the space does not: {', '.join(extra)}")
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def _unknown_keys(space: Space, value: Any, prefix: str) -> list[str]:
    if isinstance(space, Dict) and hasattr(value, "keys"):
        known = dict(space.spaces)
        out = [f"{prefix}{k}" for k in value.keys() if k not in known]
        return out + [p for k, child in space.spaces if k in value
                      for p in _unknown_keys(child, value[k], f"{prefix}{k}.")]
    if isinstance(space, Tuple) and isinstance(value, (list, tuple)):
        out = [f"{prefix}{i}" for i in range(len(space.spaces), len(value))]
        return out + [p for i, child in enumerate(space.spaces) if i < len(value)
                      for p in _unknown_keys(child, value[i], f"{prefix}{i}.")]
    return []


def leaf_arrays(space: "Dict | Tuple", rows: np.ndarray) -> dict[str, np.ndarray]:
    """**[1.4]** Flat rows (N, flat_dim) of a composite space split into its leaves, by path, each
    (N, *leaf shape) in its element type (uint8 for a byte box): the form records carry (§10.1)."""
    rows = np.asarray(rows).reshape(len(rows), -1)
    out = {}
    for leaf in space.leaves:
        part = rows[:, leaf.offset:leaf.offset + leaf.size].reshape((len(rows), *leaf.space.shape))
        out[leaf.path] = part.astype(np.uint8) if leaf.is_bytes else part.astype(np.float32, copy=False)
    return out
