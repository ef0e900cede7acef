"""The bounded pool of experience waiting for the next learner update.

An update takes at most ``batch_steps`` agent steps, oldest first; a chunk
that does not fit whole is split (the first part is bootstrapped like any cut
chunk, the rest stays for the next update). The pool holds at most
``capacity`` agent steps plus one message: a sender that finds it full waits
(``wait_for_room``) until an update has taken its share, so the server's
memory and the size of every update stay bounded however fast data arrives.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable

from tether.sdk.protocol.episodes import EpisodeChunk


@dataclass
class Pooled:
    """One agent's chunk, the weights version it was computed with, and who sent it."""

    module_id: str
    chunk: EpisodeChunk
    weights_seq_no: int
    source: str = ""
    #: Answered before the server last stopped and restored from its checkpoint or journal:
    #: trained whatever its staleness, since the client was told it was stored.
    replayed: bool = False


def split_chunk(chunk: EpisodeChunk, steps: int) -> tuple[EpisodeChunk, EpisodeChunk]:
    """The first ``steps`` steps (an unfinished chunk ending at o_steps) and the rest (starting at o_steps)."""
    def cut(a, lo, hi):
        return None if a is None else a[lo:hi]

    head = replace(chunk, obs=chunk.obs[: steps + 1], actions=chunk.actions[:steps], rewards=chunk.rewards[:steps],
                   action_logp=cut(chunk.action_logp, 0, steps), action_dist_inputs=cut(chunk.action_dist_inputs, 0, steps),
                   is_terminated=False, is_truncated=False, value_obs=cut(chunk.value_obs, 0, steps + 1))
    tail = replace(chunk, obs=chunk.obs[steps:], actions=chunk.actions[steps:], rewards=chunk.rewards[steps:],
                   action_logp=cut(chunk.action_logp, steps, None),
                   action_dist_inputs=cut(chunk.action_dist_inputs, steps, None),
                   value_obs=cut(chunk.value_obs, steps, None))
    return head, tail


class SamplePool:
    """FIFO of pooled chunks with a step count, a bounded take and a room signal."""

    def __init__(self, batch_steps: int, capacity: int) -> None:
        self.batch_steps = batch_steps
        self.capacity = capacity
        self._items: deque[Pooled] = deque()
        self.steps = 0
        self._room = asyncio.Event()
        self._room.set()

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[Pooled]:
        """The pooled items, oldest first (a copy of the list; the chunks are shared)."""
        return list(self._items)

    def add(self, item: Pooled) -> None:
        self._items.append(item)
        self.steps += item.chunk.env_steps
        if self.steps >= self.capacity:
            self._room.clear()

    async def wait_for_room(self) -> None:
        """Return once the pool holds fewer than ``capacity`` steps."""
        while self.steps >= self.capacity:
            self._room.clear()
            await self._room.wait()

    def drop(self, keep: Callable[[Pooled], bool]) -> int:
        """Remove the items ``keep`` refuses; returns the steps removed."""
        kept = deque(p for p in self._items if keep(p))
        removed = self.steps - sum(p.chunk.env_steps for p in kept)
        self._items = kept
        self._set_steps(self.steps - removed)
        return removed

    def take(self) -> list[Pooled]:
        """The oldest items up to ``batch_steps`` agent steps, splitting the last one to fit."""
        out: list[Pooled] = []
        room = self.batch_steps
        while self._items and room > 0:
            item = self._items[0]
            n = item.chunk.env_steps
            if n <= room:
                out.append(self._items.popleft())
                room -= n
            else:
                head, tail = split_chunk(item.chunk, room)
                out.append(replace(item, chunk=head))
                self._items[0] = replace(item, chunk=tail)
                room = 0
        self._set_steps(self.steps - sum(p.chunk.env_steps for p in out))
        return out

    def _set_steps(self, steps: int) -> None:
        self.steps = steps
        if steps < self.capacity:
            self._room.set()
