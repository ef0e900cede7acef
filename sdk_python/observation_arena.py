"""Copies of image observations carved out of blocks that are used again.

A client copies every observation it records (the engine may reuse its buffer). An image is tens of
kilobytes: a fresh allocation per frame makes the kernel map and zero new pages on every get_action
(about 18 us for 28 KB on a virtual machine, measured), and freed ones go back to the system. Here
copies are views into 2 MiB blocks; once no recorded observation refers to a block any more (its
batch was sent), the block is filled again, its pages already mapped.
"""

from __future__ import annotations

import sys

import numpy as np

#: The size of one block (below the 4 MiB from which numpy asks for transparent huge pages, whose
#: synchronous compaction on first touch costs more than it saves here).
BLOCK_BYTES = 2 << 20
#: Smaller observations are copied as they are (a fresh small allocation costs nothing to speak of).
MIN_OBSERVATION_BYTES = 4096
#: Blocks kept for reuse at most (the rest are left to be freed when their last observation is).
MAX_KEPT_BLOCKS = 64


class ObservationArena:
    """Hands out copies of observations, each a view into a block that it keeps alive.

    A block is reused only when no view into it is left (a reference count says so), so an
    observation an episode still holds is never overwritten. Not thread-safe: one per client."""

    def __init__(self) -> None:
        self._block: np.ndarray | None = None
        self._next = 0
        #: Blocks handed out in full, oldest first: candidates for reuse.
        self._used: list[np.ndarray] = []

    def copy(self, observation: np.ndarray) -> np.ndarray:
        """A copy of ``observation`` that nothing else refers to."""
        if observation.nbytes < MIN_OBSERVATION_BYTES or observation.nbytes * 4 > BLOCK_BYTES:
            return observation.copy()
        block = self._block
        if (block is None or self._next == len(block) or block.shape[1:] != observation.shape
                or block.dtype != observation.dtype):
            block = self._block = self._fresh_block(observation)
            self._next = 0
        out = block[self._next]
        self._next += 1
        np.copyto(out, observation)
        return out

    def _fresh_block(self, observation: np.ndarray) -> np.ndarray:
        if self._block is not None:
            self._used.append(self._block)
        for i in range(len(self._used)):
            # Referenced by the list and getrefcount's argument only: no observation is left in it.
            if (sys.getrefcount(self._used[i]) == 2 and self._used[i].shape[1:] == observation.shape
                    and self._used[i].dtype == observation.dtype):
                return self._used.pop(i)
        if len(self._used) > MAX_KEPT_BLOCKS:
            del self._used[0]
        return np.empty((BLOCK_BYTES // observation.nbytes, *observation.shape), observation.dtype)
