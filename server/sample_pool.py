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

import numpy as np

from tether.protocol.episodes import EpisodeChunk


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
    #: The client_session its batch named (protocol 1.3), if any: kept in the journal and checkpoints, so
    #: that after a restart the data guard still knows whose it is (its ``source`` is an old connection's).
    client_session: str | None = None


def split_chunk(chunk: EpisodeChunk, steps: int) -> tuple[EpisodeChunk, EpisodeChunk]:
    """The first ``steps`` steps (an unfinished chunk ending at o_steps) and the rest (starting at o_steps)."""
    def cut(a, lo, hi):
        return None if a is None else a[lo:hi]

    head = replace(chunk, obs=chunk.obs[: steps + 1], actions=chunk.actions[:steps], rewards=chunk.rewards[:steps],
                   action_logp=cut(chunk.action_logp, 0, steps), action_dist_inputs=cut(chunk.action_dist_inputs, 0, steps),
                   is_terminated=False, is_truncated=False, value_obs=cut(chunk.value_obs, 0, steps + 1),
                   step_versions=cut(chunk.step_versions, 0, steps), logged=cut(chunk.logged, 0, steps))
    tail = replace(chunk, obs=chunk.obs[steps:], actions=chunk.actions[steps:], rewards=chunk.rewards[steps:],
                   action_logp=cut(chunk.action_logp, steps, None),
                   action_dist_inputs=cut(chunk.action_dist_inputs, steps, None),
                   value_obs=cut(chunk.value_obs, steps, None), step_versions=cut(chunk.step_versions, steps, None),
                   state_prefix=_prefix(chunk, steps), logged=cut(chunk.logged, steps, None))
    return head, tail


def _prefix(chunk: EpisodeChunk, steps: int) -> np.ndarray | None:
    """A tail's state_prefix: the observations its recorded state must be advanced over (sequences.py)."""
    if chunk.state_in is None:
        return None
    before = chunk.obs[:steps]
    return before if chunk.state_prefix is None else np.concatenate([chunk.state_prefix, before])


def part_of(chunk: EpisodeChunk, start: int, end: int) -> EpisodeChunk:
    """Steps ``[start, end)`` of a chunk: cut (and bootstrapped) at ``end`` unless it is the chunk's end."""
    if start > 0:
        chunk = split_chunk(chunk, start)[1]
    if end - start < chunk.env_steps:
        chunk = split_chunk(chunk, end - start)[0]
    return chunk


def oldest_version(item: "Pooled") -> int:
    """The oldest weights version among a pooled chunk's steps."""
    versions = item.chunk.step_versions
    return item.weights_seq_no if versions is None or not len(versions) else int(versions.min())


class Admission:
    """How many steps of a chunk appended to the pool now are trained in time.

    The pool is a FIFO and update ``j`` from now takes its steps
    ``[j * batch_steps, (j + 1) * batch_steps)``, so the updates that will
    train a module before any given step are known: they are the updates in
    which that module has pooled steps (plus the running update, if it trains
    the module). Each such update publishes one new version of the module, and
    a step's staleness when it is trained is its staleness now plus the number
    of those versions published before its own update. An update that fails
    only makes steps fresher; removing pooled data (a refused client's) can
    move later data into an earlier update that then trains its module, which
    the update's own staleness drop catches. The parts of one message's
    chunks are admitted in order with ``append``.
    """

    def __init__(self, pool: "SamplePool", running_modules: set[str], shared_updates: bool = False) -> None:
        self.batch_steps = pool.batch_steps
        self.position = pool.steps
        self.running_modules = running_modules
        #: Several ranks: this pool's takes are known, but not what the other ranks' shares of the same
        #: updates train, so every update before a step's counts as training its module (never too few).
        self.shared_updates = shared_updates
        self._pool = pool
        #: module -> indices (from now) of the updates that take some of its pooled steps, asked of
        #: the pool once per module (it keeps them as it changes) and widened by ``append``.
        self.updates_with: dict[str, set[int]] = {}

    def _updates_with(self, module_id: str) -> set[int]:
        if module_id not in self.updates_with:
            self.updates_with[module_id] = self._pool.updates_with(module_id)
        return self.updates_with[module_id]

    def _note(self, module_id: str, start: int, steps: int) -> None:
        if steps > 0:
            first, last = start // self.batch_steps, (start + steps - 1) // self.batch_steps
            self._updates_with(module_id).update(range(first, last + 1))

    def fresh_parts(self, module_id: str, staleness: np.ndarray, max_staleness: int) -> list[tuple[int, int]]:
        """The parts ``[start, end)`` of a chunk to store, given each step's staleness now: each step,
        in order, that an update will train within ``max_staleness`` after the steps stored before it
        (so an old step held back in front of fresh ones is refused alone, and the fresh ones are kept)."""
        steps = len(staleness)
        bumps_from_running = int(module_id in self.running_modules)
        with_module = set(self._updates_with(module_id))
        stored: list[np.ndarray] = []
        k, position = 0, self.position
        while k < steps:
            j = position // self.batch_steps
            earlier = j if self.shared_updates else sum(1 for i in with_module if i < j)
            allowed = max_staleness - bumps_from_running - earlier
            room = (j + 1) * self.batch_steps - position
            # Steps taken by update j see every earlier update that trains the module; later
            # updates allow no more than this one, so when none is fresh here none will be.
            fresh = np.flatnonzero(staleness[k:] <= allowed)[:room] + k
            if not len(fresh):
                break
            stored.append(fresh)
            with_module.add(j)
            position += len(fresh)
            k = int(fresh[-1]) + 1
        if not stored:
            return []
        index = np.concatenate(stored)
        breaks = np.flatnonzero(np.diff(index) != 1) + 1
        return [(int(run[0]), int(run[-1]) + 1) for run in np.split(index, breaks)]

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
        # Which updates take each module's steps, kept as the pool changes so that admission does
        # not walk the pool for every message. Update indices are absolute: the first pooled step
        # is step ``_head`` of a numbering in which update k takes [k * batch_steps, (k+1) * batch_steps).
        self._head = 0
        self._updates: dict[str, dict[int, int]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[Pooled]:
        """The pooled items, oldest first (a copy of the list; the chunks are shared)."""
        return list(self._items)

    def updates_with(self, module_id: str) -> set[int]:
        """Indices, counted from the next update (0), of the updates that will take some of
        ``module_id``'s pooled steps."""
        first = self._head // self.batch_steps
        return {k - first for k in self._updates.get(module_id, ())}

    def add(self, item: Pooled) -> None:
        self._note(item, self._head + self.steps)
        self._items.append(item)
        self.steps += item.chunk.env_steps
        if self.steps >= self.capacity:
            self._room.clear()

    def _note(self, item: Pooled, start: int) -> None:
        n = item.chunk.env_steps
        if n > 0:
            counts = self._updates.setdefault(item.module_id, {})
            for k in range(start // self.batch_steps, (start + n - 1) // self.batch_steps + 1):
                counts[k] = counts.get(k, 0) + 1

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
        if removed:  # later steps move into earlier updates: renumber
            self._head, self._updates, start = 0, {}, 0
            for item in self._items:
                self._note(item, start)
                start += item.chunk.env_steps
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
                tail_item = replace(item, chunk=tail)
                self._items[0] = replace(tail_item, weights_seq_no=oldest_version(tail_item))
                room = 0
        self._set_steps(self.steps - sum(p.chunk.env_steps for p in out))
        taken = self._head // self.batch_steps
        for counts in self._updates.values():
            counts.pop(taken, None)
        # A full take keeps the numbering; a short one empties the pool, which starts it again.
        self._head = self._head + self.batch_steps if self._items else 0
        if not self._items:
            self._updates.clear()
        return out

    def _set_steps(self, steps: int) -> None:
        self.steps = steps
        if steps < self.capacity:
            self._room.set()
