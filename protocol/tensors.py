"""Binary tensors (§10.9, protocol 1.4): an array as its raw bytes.

A record's observations may be written as a tensor object instead of nested lists of numbers, its
bytes (row-major, little-endian) either in the body's binary attachment (§4.3)::

    {"dtype": "uint8", "shape": [501, 84, 84, 4], "offset": 0}

or inline as base64 (RFC 4648, standard alphabet, padded), for a peer that can only send text::

    {"dtype": "uint8", "shape": [501, 84, 84, 4], "b64": "AAEC..."}

An 84x84x4 image is 28,224 bytes: read in place from the attachment, 37,632 characters to decode as
base64, and about 100 KB and 28,224 numbers to parse as JSON. JSON numbers stay valid in every
version; a peer sends tensors only to a server that announced 1.4 or later.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import numpy as np

#: The element types a tensor may have: its ``dtype`` name -> numpy's little-endian type.
TENSOR_DTYPES: dict[str, np.dtype] = {"uint8": np.dtype("u1"), "float32": np.dtype("<f4")}
#: Where the server keeps the body's attachment in a tensor object that refers to it (``offset``): a
#: member name no sender's member is left under (bind_attachment removes any).
ATTACHMENT = "\x00attachment"


#: The most dimensions a tensor may have, and the largest dimension (§10.9).
MAX_RANK = 32
MAX_DIM = 2**31 - 1


def describe(value: Any) -> str:
    """A short repr of a received value for an error message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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


def encode_tensor_at(array: np.ndarray, offset: int) -> dict[str, Any]:
    """The tensor object of an array whose bytes go into the attachment at ``offset``."""
    name = {np.dtype("u1"): "uint8", np.dtype("f4"): "float32"}.get(np.asarray(array).dtype.newbyteorder("<"))
    if name is None:
        raise TypeError(f"tensors are uint8 or float32, not {np.asarray(array).dtype}")
    return {"dtype": name, "shape": list(np.shape(array)), "offset": offset}


#: Bound in place of the attachment to a tensor past the body's budget: together, a body's tensors
#: refer to at most as many bytes as its attachment holds (§10.9), so a body cannot make its receiver
#: read its bytes many times over.
OVERCLAIMED = "overclaimed"


def _claimed_bytes(tensor: dict[str, Any]) -> int:
    """The bytes an offset tensor refers to (0 when it is malformed: decoding refuses it anyway)."""
    name = tensor.get("dtype")
    dtype = TENSOR_DTYPES.get(name) if isinstance(name, str) else None
    shape = tensor.get("shape")
    if dtype is None or "offset" not in tensor or not isinstance(shape, list) or len(shape) > MAX_RANK or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM for d in shape):
        return 0
    return math.prod(shape) * dtype.itemsize


def bind_attachment(message: dict[str, Any], attachment: memoryview | None) -> None:
    """Lets every tensor object of a message's observations (records' and agent entries' ``obs``)
    read the body's attachment; removes a member of the internal name that a sender wrote."""
    records = message.get("episodes")
    if not isinstance(records, list):
        return
    unclaimed = len(attachment) if attachment is not None else 0
    for record in records:
        if not isinstance(record, dict):
            continue
        agents = record.get("agents")
        places = agents.values() if isinstance(agents, dict) else (record,)
        for place in places:
            obs = place.get("obs") if isinstance(place, dict) else None
            if not isinstance(obs, dict):
                continue
            obs.pop(ATTACHMENT, None)
            # A tensor, or (1.4) a composite observation's object of leaves, each maybe a tensor (§8.6):
            # a tensor's members are never objects, and a leaf may be named like one ("shape").
            tensors = [v for v in obs.values() if isinstance(v, dict)] or [obs]
            for tensor in tensors:
                tensor.pop(ATTACHMENT, None)
                if attachment is not None:
                    unclaimed -= _claimed_bytes(tensor)
                    tensor[ATTACHMENT] = attachment if unclaimed >= 0 else OVERCLAIMED


def decode_tensor(value: dict[str, Any]) -> np.ndarray:
    """The array a tensor object holds (a read-only view of its bytes); raises TensorError."""
    members = set(value) - {ATTACHMENT}
    if members not in ({"dtype", "shape", "b64"}, {"dtype", "shape", "offset"}):
        raise TensorError(f"a tensor has exactly the members dtype, shape and one of b64 and offset, "
                          f"got {sorted(members)}")
    dtype = TENSOR_DTYPES.get(value["dtype"]) if isinstance(value["dtype"], str) else None
    if dtype is None:
        raise TensorError(f"tensor dtype must be one of {', '.join(TENSOR_DTYPES)}, got {value['dtype']!r}")
    shape = value["shape"]
    if not isinstance(shape, list) or not 1 <= len(shape) <= MAX_RANK or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM for d in shape):
        raise TensorError(f"tensor shape must be a list of 1 to {MAX_RANK} integers from 0 to {MAX_DIM}, "
                          f"got {describe(shape)}")
    expected = math.prod(shape) * dtype.itemsize
    if "offset" in value:
        offset = value["offset"]
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise TensorError(f"tensor offset must be an integer >= 0, got {offset!r}")
        attachment = value.get(ATTACHMENT)
        if attachment is None:
            raise TensorError("tensor offset refers to the attachment, but the body has none")
        if attachment is OVERCLAIMED:
            raise TensorError("the body's tensors refer to more bytes than its attachment holds: tensors may not "
                              "read the same bytes twice")
        if offset + expected > len(attachment):
            raise TensorError(f"tensor of shape {shape} and dtype {value['dtype']} needs {expected} bytes at offset "
                              f"{offset}, but the attachment holds {len(attachment)}")
        # A copy: a stored observation must not keep the whole received body alive.
        flat = np.frombuffer(attachment, dtype=dtype, count=math.prod(shape), offset=offset).copy()
        return _shaped(flat, shape)
    data = value["b64"]
    if not isinstance(data, str):
        raise TensorError(f"tensor b64 must be a string, got {type(data).__name__}")
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
    return _shaped(np.frombuffer(raw, dtype=dtype), shape)


def _shaped(flat: np.ndarray, shape: list[int]) -> np.ndarray:
    try:
        return flat.reshape(shape)
    except ValueError:  # an empty array of dimensions too large for an array (numpy refuses them)
        raise TensorError(f"tensor shape {describe(shape)} is too large for an array") from None
