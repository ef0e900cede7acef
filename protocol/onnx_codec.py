"""The ``onnx_file`` field of SET_STATE: base64(gzip(ONNX bytes)), as RLlink v1."""

from __future__ import annotations

import base64
import gzip
import zlib

from .errors import ErrorCode, MessageError


#: Models from this size on (64 KiB) are stored in the gzip stream uncompressed (level 0): they are mostly
#: float weights, which gzip barely shrinks (Nature-CNN: 7% at level 6, at 20 times the time of
#: level 0, about 250 ms per version on the learner's thread).
STORED_FROM_BYTES = 64 << 10


def encode_onnx(model_bytes: bytes, level: int | None = None) -> str:
    """Compress and base64-encode an ONNX model for SET_STATE (``level``: gzip's; by default 6 for a
    model under STORED_FROM_BYTES, else 0). The same bytes give the same field."""
    if level is None:
        level = 6 if len(model_bytes) < STORED_FROM_BYTES else 0
    # (mtime 0: the same model is the same field, whenever encoded; gzip would stamp the second)
    return base64.b64encode(gzip.compress(model_bytes, compresslevel=level, mtime=0)).decode("ascii")


def decode_onnx(field: str) -> bytes:
    """Inverse of ``encode_onnx``; raises ``MessageError`` (INVALID_FIELD) when corrupt."""
    try:
        return gzip.decompress(base64.b64decode(field.encode("ascii"), validate=True))
    except (ValueError, OSError, EOFError, zlib.error, UnicodeEncodeError) as exc:
        raise MessageError(ErrorCode.INVALID_FIELD, f"onnx_file is not base64(gzip(onnx)): {exc}") from None
