"""Holding clients back: the share of new episodes clients are asked to record.

When clients produce data faster than the learner trains it, admission
(sample_pool.Admission) refuses what would be too stale by the time an update
took it; that data was computed, sent and parsed for nothing. The server
therefore tells clients, in every SET_STATE, which share of their new episodes
to record for training (``record_share``, §13.2): an episode a client does not
record is played as usual and never sent.

Every ``WINDOW_S`` seconds the share follows what happened meanwhile: when
more than ``REFUSED_TARGET`` of the steps that arrived was refused, it shrinks
to the part that could be stored (then waits ``SETTLE_S`` for data recorded
under the new share before shrinking again); when the learner sat idle for
lack of data for part of the window, it grows (also despite refusals when it
waited nearly all the time over the last few windows: refused data then came from clients that do not
hold back, or came too stale, and asking the others for less only starves
it); otherwise it stays. When more clients than ever before are past their
handshake, the share starts no higher than what lets all of them together send
one update's worth of steps per batch they each send, so that a crowd's first
batches are not refused wholesale.

While the share is below one, clients are also asked for smaller batches
(``steps_per_batch``, §13.2): a client learns of new weights only from a
batch's answer, and a step waits in the client up to a batch's time before it
is sent, so with env_steps_per_sample steps per batch the data of a client
that plays fast is often a version or two old on arrival, and refused, however
few episodes it records. Batches of ``BATCH_SHARE × env_steps_per_sample``
steps are fresher and bring new weights sooner. (Not a size that follows the
share: when the share grows because the learner waits, longer batches would
bring staler data, more refusals and a learner that waits more.)
"""

from __future__ import annotations

import math
from collections import deque

#: Seconds over which arrivals are judged: long enough to span a batch's answer.
WINDOW_S = 1.0
#: The share of arriving steps that may be refused before the share shrinks.
REFUSED_TARGET = 0.03
#: The share of a window the learner may wait for data before the share grows.
STARVED_TARGET = 0.3
#: The share of the last IDLE_WINDOWS windows the learner waited for data above which the share grows
#: whatever was refused (several windows: clients that send in bursts leave single windows idle).
IDLE_OVERRIDES = 0.85
IDLE_WINDOWS = 4
#: Growth per window while the learner waits for data.
GROWTH = 1.15
#: The share of what fitted that a shrink aims for.
AIM = 0.9
#: The most the share shrinks by in one window.
MAX_SHRINK = 1.0 / 8
#: Seconds after a shrink before refusals shrink the share again: data sent meanwhile was
#: recorded under the share before (a batch of env_steps_per_sample steps and its answer).
SETTLE_S = 3.0
#: The smallest share: a client still records one episode in this many.
FLOOR = 1.0 / 4096
#: The batch asked for while holding back, as a share of env_steps_per_sample: smaller batches are
#: fresher, but each is a message and an answer (bench/trained_share.py: 64 clients at 200 steps/s
#: had 89 % trained with a quarter, 93 % with a fifth, 65-87 % with whole batches).
BATCH_SHARE = 1.0 / 5
#: Seconds the small batches are kept after the share is back at one: whole batches at once would
#: bring staler data, refusals, and a shrink again.
BATCH_HOLD_S = 30.0


class RecordShare:
    """The share in (0, 1], adjusted from the steps stored and refused, and the time the
    learner waited for data, per window."""

    def __init__(self, now: float, train_batch_size: int, env_steps_per_sample: int) -> None:
        self.value = 1.0
        self._room = train_batch_size
        self._batch = max(1, env_steps_per_sample)
        self._clients = 0
        self._stored = 0
        self._refused = 0
        self._since = now
        self._settled_at = now
        #: When the share last came back to one (steps_per_batch keeps small batches a while after).
        self._back_at_one_at: float | None = None
        self._starved_since: float | None = None
        self._starved_s = 0.0
        #: The share of each of the last windows the learner waited for data.
        self._recent_starved: deque[float] = deque(maxlen=IDLE_WINDOWS)

    def current(self, clients: int) -> float:
        """The share to announce now, with ``clients`` past their handshake. Only a new peak of
        clients caps it: a client that reconnects, or fewer clients, leave it as it is."""
        if clients > self._clients:
            self.value = max(FLOOR, min(self.value, self._room / (clients * self._batch)))
            self._clients = clients
        return self.value

    def steps_per_batch(self, now: float) -> int | None:
        """The steps played per batch to ask clients for: fewer while the share is below one and for
        ``BATCH_HOLD_S`` after; else None (env_steps_per_sample)."""
        if self.value >= 1.0 and (self._back_at_one_at is None or now - self._back_at_one_at > BATCH_HOLD_S):
            return None
        return max(1, math.ceil(self._batch * BATCH_SHARE))

    def starving(self, starved: bool, now: float) -> None:
        """Whether the learner waits for data from now on (no update runs and the pool is short)."""
        if starved and self._starved_since is None:
            self._starved_since = now
        elif not starved and self._starved_since is not None:
            self._starved_s += now - self._starved_since
            self._starved_since = None

    def note(self, stored: int, refused: int, now: float) -> None:
        """Agent steps of a message that were stored, and refused as stale; adjusts the share
        once a window has passed."""
        self._stored += stored
        self._refused += refused
        if now - self._since < WINDOW_S:
            return
        starved = self._starved_s
        if self._starved_since is not None:
            starved += now - self._starved_since
            self._starved_since = now
        arrived = self._stored + self._refused
        window = now - self._since
        was_below_one = self.value < 1.0
        self._recent_starved.append(starved / window if window > 0 else 0.0)
        if len(self._recent_starved) == self._recent_starved.maxlen and \
                sum(self._recent_starved) / len(self._recent_starved) > IDLE_OVERRIDES:
            # The learner waited for data nearly all the time: whatever was refused (data of clients that
            # do not hold back, or sent too stale) is no reason to ask the others for less.
            self.value = min(1.0, self.value * GROWTH)
        elif arrived and self._refused > REFUSED_TARGET * arrived:
            if now >= self._settled_at:
                # Aim a little under what fit: episodes arrive in lumps, and a lump too many is refused.
                self.value = max(FLOOR, self.value * max(MAX_SHRINK, AIM * self._stored / arrived))
                self._settled_at = now + SETTLE_S
        elif starved > STARVED_TARGET * window:
            self.value = min(1.0, self.value * GROWTH)
        if was_below_one and self.value >= 1.0:
            self._back_at_one_at = now
        self._stored = self._refused = 0
        self._starved_s = 0.0
        self._since = now
