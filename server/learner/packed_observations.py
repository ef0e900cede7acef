"""Observations of a Dict or Tuple space with byte leaves (§8.6: a camera image beside a vector), kept
as bytes while they wait to be trained on.

A record's composite observations are checked and decoded as flat float32 rows (§10.6). A byte leaf
holds integers 0-255, so in the pool, the journal and a checkpoint each row is packed: its float
leaves as float32, then its byte leaves as uint8, a quarter of the memory for the image. The learner
gets the flat float32 rows back when it builds a batch (``unpack``). Rows that are float32 already (a
space without byte leaves, or a journal written before packing) pass through ``unpack`` unchanged:
packed rows are told apart by their element type, uint8, which a composite space's rows never have.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tether.protocol.episodes import EpisodeChunk
from tether.protocol.spaces import Space, is_composite


class ObservationPacking:
    """How one composite space's flat rows are packed: float leaves first (float32, aligned), then
    byte leaves (uint8), the row padded to a multiple of 4 bytes."""

    def __init__(self, leaves: list[tuple[int, int, bool]], flat_dim: int) -> None:
        """``leaves``: (offset in the flat row, size, is a byte leaf) per leaf."""
        self.flat_dim = flat_dim
        floats = [(offset, size) for offset, size, is_bytes in leaves if not is_bytes]
        byte_leaves = [(offset, size) for offset, size, is_bytes in leaves if is_bytes]
        #: (flat columns, packed float columns) per float leaf, and (flat columns, packed byte columns) per byte leaf.
        self._floats: list[tuple[slice, slice]] = []
        self._bytes: list[tuple[slice, slice]] = []
        at = 0
        for offset, size in floats:
            self._floats.append((slice(offset, offset + size), slice(at, at + size)))
            at += size
        self._float_bytes = 4 * at
        at = self._float_bytes
        for offset, size in byte_leaves:
            self._bytes.append((slice(offset, offset + size), slice(at, at + size)))
            at += size
        self.row_bytes = -(-at // 4) * 4

    @staticmethod
    def of(space: Space) -> "ObservationPacking | None":
        """The packing of a Dict or Tuple space with at least one byte leaf; None for any other space."""
        if not is_composite(space):
            return None
        leaves = [(leaf.offset, leaf.size, bool(leaf.is_bytes)) for leaf in space.leaves]  # type: ignore[union-attr]
        if not any(is_bytes for _, _, is_bytes in leaves):
            return None
        return ObservationPacking(leaves, space.flat_dim)

    def pack(self, rows: np.ndarray) -> np.ndarray:
        """Flat float32 rows ``(n, flat_dim)`` (byte leaves holding integers 0-255, as checked at ingest)
        as packed rows ``(n, row_bytes)`` of uint8."""
        rows = rows.reshape(rows.shape[0], self.flat_dim)
        out = np.zeros((rows.shape[0], self.row_bytes), np.uint8)
        floats = out[:, :self._float_bytes].view(np.float32)
        for flat, packed in self._floats:
            floats[:, packed] = rows[:, flat]
        for flat, packed in self._bytes:
            out[:, packed] = rows[:, flat]
        return out

    def unpack(self, rows: np.ndarray) -> np.ndarray:
        """Packed rows as flat float32 rows ``(n, flat_dim)``; rows that are not packed (not uint8) as they are."""
        if rows.dtype != np.uint8:
            return rows
        rows = rows.reshape(rows.shape[0], self.row_bytes)
        out = np.empty((rows.shape[0], self.flat_dim), np.float32)
        floats = rows[:, :self._float_bytes].view(np.float32)
        for flat, packed in self._floats:
            out[:, flat] = floats[:, packed]
        for flat, packed in self._bytes:
            out[:, flat] = rows[:, packed]
        return out

    def pack_chunk(self, chunk: EpisodeChunk) -> EpisodeChunk:
        """The chunk with its observations (and a recurrent chunk's ``state_prefix``) packed; a chunk
        packed already as it is."""
        if chunk.obs.dtype == np.uint8:
            return chunk
        prefix = chunk.state_prefix
        return replace(chunk, obs=self.pack(chunk.obs),
                       state_prefix=prefix if prefix is None or prefix.dtype == np.uint8 else self.pack(prefix))
