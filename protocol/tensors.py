"""Binary tensors in JSON bodies (§10.9, protocol 1.4): an array as its raw bytes.

A record's observations may be written as a tensor object instead of nested lists of numbers::

    {"dtype": "uint8", "shape": [501, 84, 84, 4], "b64": "<base64 of the raw little-endian bytes>"}

The bytes are the array in row-major (C) order, little-endian, base64-encoded (RFC 4648, standard
alphabet, with padding). An 84x84x4 image is 28,224 bytes, 37,632 as base64, where the same image as
JSON numbers takes about four bytes per value and a float parse each. JSON number lists stay valid in
every version; a peer sends tensors only to a server that announced 1.4 or later.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import numpy as np

#: The element types a tensor may have: its ``dtype`` name -> numpy's little-endian type.
TENSOR_DTYPES: dict[str, np.dtype] = {"uint8": np.dtype("u1"), "float32": np.dtype("<f4")}
TENSOR_MEMBERS = frozenset({"dtype", "shape", "b64"})


class TensorError(ValueError):
    """A tensor object that cannot be read; the message says which member is wrong."""


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is written as a tensor object (a JSON object where numbers may be)."""
    return isinstance(value, dict)


def encode_tensor(array: np.ndarray) -> dict[str, Any]:
    """The tensor object of a uint8 or float32 array."""
    array = np.asarray(array)
    name = {np.dtype("u1"): "uint8", np.dtype("f4"): "float32"}.get(array.dtype.newbyteorder("<"))
    if name is None:
        raise TypeError(f"tensors are uint8 or float32, not {array.dtype}")
    data = np.ascontiguousarray(array, dtype=TENSOR_DTYPES[name]).tobytes()
    return {"dtype": name, "shape": list(array.shape), "b64": base64.b64encode(data).decode("ascii")}


def decode_tensor(value: dict[str, Any]) -> np.ndarray:
    """The array a tensor object holds (a read-only view of its decoded bytes); raises TensorError."""
    unknown = set(value) - TENSOR_MEMBERS
    if unknown or not TENSOR_MEMBERS <= set(value):
        raise TensorError(f"a tensor has exactly the members dtype, shape and b64, got {sorted(value)}")
    dtype = TENSOR_DTYPES.get(value["dtype"]) if isinstance(value["dtype"], str) else None
    if dtype is None:
        raise TensorError(f"tensor dtype must be one of {', '.join(TENSOR_DTYPES)}, got {value['dtype']!r}")
    shape = value["shape"]
    if not isinstance(shape, list) or not shape or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise TensorError(f"tensor shape must be a non-empty list of integers >= 0, got {shape!r}")
    data = value["b64"]
    if not isinstance(data, str):
        raise TensorError(f"tensor b64 must be a string, got {type(data).__name__}")
    expected = math.prod(shape) * dtype.itemsize
    # Checked before decoding: a short header cannot make the server decode (or allocate) more than it got.
    if len(data) != 4 * ((expected + 2) // 3):
        raise TensorError(f"tensor of shape {shape} and dtype {value['dtype']} holds {expected} bytes: its b64 must be "
                          f"{4 * ((expected + 2) // 3)} characters, got {len(data)}")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise TensorError("tensor b64 is not valid base64 (standard alphabet, padded)") from None
    if len(raw) != expected:
        raise TensorError(f"tensor b64 decodes to {len(raw)} bytes, its shape and dtype need {expected}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)
