"""RLlink framing: an 8-byte zero-padded ASCII decimal length, then the body.

``encode_frame`` turns a message into bytes; ``FrameDecoder`` turns a stream of
bytes, arriving in pieces of any size, back into frame bodies. Neither does I/O.
"""

from __future__ import annotations

from typing import Any

import orjson

from .errors import ErrorCode, FramingError

HEADER_SIZE = 8
#: Largest body an 8-digit header can describe.
MAX_ENCODABLE_BODY = 99_999_999
#: Default receive limit (64 MiB); configurable per decoder.
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024

_DIGITS = frozenset(b"0123456789")


def encode_body(body: bytes) -> bytes:
    """Prefix an already-serialised JSON body with its length header."""
    if len(body) > MAX_ENCODABLE_BODY:
        raise ValueError(f"body of {len(body)} bytes does not fit an 8-digit header")
    return b"%08d" % len(body) + body


def encode_frame(message: dict[str, Any], attachment: bytes | None = None) -> bytes:
    """Serialise a message (a dict with a "type") into one complete frame; **[1.4]** with
    ``attachment``, the body is the JSON, one NUL byte and the attachment's raw bytes (§4.3).

    numpy arrays and scalars are serialised natively by orjson.
    """
    body = orjson.dumps(message, option=orjson.OPT_SERIALIZE_NUMPY)
    return encode_body(body if attachment is None else b"".join((body, b"\0", attachment)))


class FrameDecoder:
    """Incremental frame parser: feed bytes, take complete bodies.

    A header that is not 8 ASCII digits, or a length over ``max_frame_bytes``,
    raises ``FramingError``; after that the decoder refuses further data,
    because the byte stream can no longer be split into frames. Complete
    frames that arrived before the bad header are still returned first: the
    error is then held in ``error`` and raised by the next ``feed``.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._pos = 0
        self._failed: FramingError | None = None

    @property
    def error(self) -> FramingError | None:
        """The framing error that ended this stream, if any."""
        return self._failed

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet returned as a body (a partial frame)."""
        return len(self._buffer) - self._pos

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes and return every body they complete, in order."""
        self.add(data)
        bodies: list[bytes] = []
        while True:
            try:
                body = self.next_body()
            except FramingError:
                if not bodies:
                    raise
                return bodies  # the error stays in ``error`` and is raised by the next call
            if body is None:
                return bodies
            bodies.append(body)

    def add(self, data: bytes) -> None:
        """Buffer received bytes without parsing them (see ``next_body``)."""
        if self._failed is not None:
            raise self._failed
        self._buffer += data

    def next_body(self) -> bytes | None:
        """The next complete body, or None until more bytes arrive.

        Taking one body at a time lets a server answer a request before it even
        looks at the next header, so a limit changed by that request (a larger
        frame limit after authentication) applies to the frames after it.
        """
        if self._failed is not None:
            raise self._failed
        buf = self._buffer
        start = self._pos
        if len(buf) - start < HEADER_SIZE:
            return None
        header = bytes(buf[start : start + HEADER_SIZE])
        if not _DIGITS.issuperset(header):
            raise self._fail(FramingError(ErrorCode.BAD_HEADER, f"frame header must be 8 ASCII digits, got {header!r}"))
        length = int(header)
        if length > self.max_frame_bytes:
            raise self._fail(FramingError(
                ErrorCode.FRAME_TOO_LARGE,
                f"frame body of {length} bytes exceeds the limit of {self.max_frame_bytes} bytes",
            ))
        end = start + HEADER_SIZE + length
        if len(buf) < end:
            return None
        with memoryview(buf) as view:  # (one copy: slicing the bytearray first would make two)
            body = bytes(view[start + HEADER_SIZE : end])
        self._pos = end
        # Compact once consumed bytes dominate, so the buffer does not grow forever.
        if self._pos * 2 >= len(buf):
            del buf[: self._pos]
            self._pos = 0
        return body

    def _fail(self, error: FramingError) -> FramingError:
        self._failed = error
        self._buffer = bytearray()
        self._pos = 0
        return error
