"""The bounded pool of experience waiting for the next learner update.

An update takes at most ``batch_steps`` agent steps, oldest first; a chunk
that does not fit whole is split (the first part is bootstrapped like any cut
chunk, the rest stays for the next update). The pool holds at most
``capacity`` agent steps plus one message: a sender that finds it full waits
(``wait_for_room``) until an update has taken its share, so the server's
memory and the size of every update stay bounded however fast data arrives.

``Admission`` decides, before a message's chunks are pooled, how many of
their steps an update will take while they are still within
``max_staleness``: the server stores only those, and tells the client how many
it refused, instead of answering for data that it would drop later.
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


class Admission:
    """How many steps of a chunk appended to the pool now are trained in time.

    The pool is a FIFO and update ``j`` from now takes its steps
    ``[j * batch_steps, (j + 1) * batch_steps)``, so the updates that will
    train a module before any given step are known: they are the updates in
    which that module has pooled steps (plus the running update, if it trains
    the module). Each such update publishes one new version of the module, and
    a step's staleness when it is trained is its staleness now plus the number
    of those versions published before its own update. The estimate never
    under-estimates: an update that fails, or data dropped ahead, only makes
    steps fresher. Chunks of one message are admitted in order with ``append``.
    """

    def __init__(self, pool: "SamplePool", running_modules: set[str]) -> None:
        self.batch_steps = pool.batch_steps
        self.position = pool.steps
        self.running_modules = running_modules
        #: module -> indices (from now) of the updates that take some of its pooled steps.
        self.updates_with: dict[str, set[int]] = {}
        offset = 0
        for item in pool.items():
            self._note(item.module_id, offset, item.chunk.env_steps)
            offset += item.chunk.env_steps

    def _note(self, module_id: str, start: int, steps: int) -> None:
        if steps > 0:
            first, last = start // self.batch_steps, (start + steps - 1) // self.batch_steps
            self.updates_with.setdefault(module_id, set()).update(range(first, last + 1))

    def fresh_steps(self, module_id: str, steps: int, staleness_now: int, max_staleness: int) -> int:
        """The leading steps of a chunk of ``steps`` that are trained with staleness <= ``max_staleness``."""
        budget = max_staleness - staleness_now - (module_id in self.running_modules)
        if budget < 0 or steps <= 0:
            return 0
        before = self.updates_with.get(module_id, set())
        first = self.position // self.batch_steps
        last = (self.position + steps - 1) // self.batch_steps
        published = sum(1 for j in before if j < first)
        for j in range(first, last + 1):
            # Steps taken by update j see the versions of every earlier update that trains the module,
            # this chunk's own earlier parts included.
            if published > budget:
                return max(0, j * self.batch_steps - self.position)
            published += 1  # update j trains this module: this chunk is in it
        return steps

    def append(self, module_id: str, steps: int) -> None:
        """Count ``steps`` of ``module_id`` as pooled after everything before."""
        self._note(module_id, self.position, steps)
        self.position += steps


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
