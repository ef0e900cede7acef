"""Returns per client, so that ``stop_at_return`` is never decided by what one client asserts.

A client that holds the token can send made-up episodes with any return (their
log-probabilities can be honest: the actions were sampled, the rewards are the
client's word). The run-wide window of returns can therefore be filled by one
client. The stop rule also asks every *active* client — one that sent data in
the last few updates or the last minute — to have reached the target on its own last episodes:
made-up returns from one client cannot end a run while another client's
episodes are below the target. (A client that is the only active one decides
alone; docs/protocol.md §6.4 states this trust model.)

A client is its ``client_session`` when its batches carry one, else its
connection: the owner of its episode state (``Trainer.owner``).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from typing import Hashable, Iterable

#: Episodes a client must have finished before its own mean return counts as reached.
MIN_EPISODES_PER_CLIENT = 5
#: Clients remembered (least recently active forgotten first).
MAX_CLIENTS = 65_536
#: A client that sent data this recently, and has finished an episode that counts, is active
#: however many updates ran since: a client feeding data fast (more updates) cannot make a slow
#: one (long rollouts) lose its say. (One that only sent implausible or no episodes has its say
#: for active_updates updates, then none.)
ACTIVE_S = 60.0


class ClientReturns:
    """Each client's last ``window`` episode returns and the update count when it last sent data."""

    def __init__(self, window: int, active_updates: int) -> None:
        self.window = window
        #: A client that sent no data during this many updates no longer has a say.
        self.active_updates = active_updates
        self._clients: OrderedDict[Hashable, tuple[deque, list[float]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._clients)

    def note(self, client: Hashable, returns: Iterable[float], updates: int, now: float | None = None) -> None:
        """``client`` sent data while ``updates`` updates were done, at ``now`` (monotonic seconds);
        ``returns``: its episodes that finished."""
        now = time.monotonic() if now is None else now
        entry = self._clients.get(client)
        if entry is None:
            entry = self._clients[client] = (deque(maxlen=self.window), [updates, now])
        self._clients.move_to_end(client)
        entry[0].extend(returns)
        entry[1][:] = [updates, now]
        while len(self._clients) > MAX_CLIENTS:
            self._clients.popitem(last=False)

    def below(self, target: float, updates: int, now: float | None = None) -> list[Hashable]:
        """Active clients that have not reached ``target`` on their own last episodes: with n
        active clients, each one's last max(MIN_EPISODES_PER_CLIENT, window / n) (together about
        a window, so the rule lags no more than the run-wide mean); too few, or a mean below it."""
        now = time.monotonic() if now is None else now
        active = [(c, r) for c, (r, (last_update, last_time)) in self._clients.items()
                  if updates - last_update <= self.active_updates or (now - last_time <= ACTIVE_S and r)]
        share = max(MIN_EPISODES_PER_CLIENT, self.window // max(1, len(active)))
        out = []
        for client, returns in active:
            recent = list(returns)[-share:]
            if len(recent) < MIN_EPISODES_PER_CLIENT or not sum(recent) / len(recent) >= target:
                out.append(client)
        return out
