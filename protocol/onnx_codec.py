"""The ``onnx_file`` field of SET_STATE: base64(gzip(ONNX bytes)), as RLlink v1."""

from __future__ import annotations

import base64
import gzip
import zlib

from .errors import ErrorCode, MessageError


def encode_onnx(model_bytes: bytes, level: int = 6) -> str:
    """Compress and base64-encode an ONNX model for SET_STATE."""
    return base64.b64encode(gzip.compress(model_bytes, compresslevel=level)).decode("ascii")


def decode_onnx(field: str) -> bytes:
    """Inverse of ``encode_onnx``; raises ``MessageError`` (INVALID_FIELD) when corrupt."""
    try:
        return gzip.decompress(base64.b64decode(field.encode("ascii"), validate=True))
    except (ValueError, OSError, EOFError, zlib.error, UnicodeEncodeError) as exc:
        raise MessageError(ErrorCode.INVALID_FIELD, f"onnx_file is not base64(gzip(onnx)): {exc}") from None
