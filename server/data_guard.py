"""Strikes against clients whose data makes updates non-finite, and their refusal.

When an update leaves a client's data out because it made the update
non-finite (see learner/isolation.py), the client gets a strike. A client
with ``STRIKES_TO_REFUSE`` strikes within the last ``STRIKE_WINDOW_UPDATES``
updates is refused: its later episode messages are answered with ERROR
``DATA_REFUSED`` and nothing of them is stored (docs/protocol.md §13.2, §14).

A client is known by two names: the connection its data came on (the
``source`` string, "#<connection id> <peer>"), and, when its messages carry a
``client_session`` (protocol 1.3), that session, so a reconnect does not
clear its record. A strike counts against every name of the client; either
name, once refused, refuses the client. Data submitted without a source
(in-process use) shares the name "". With several ranks, a client_session is
judged by the group: every rank counts every rank's strikes against it (one
per update, as one server would), and one that a rank refuses is refused by
every rank (LockstepLearnerLoop tells them at the next agreement).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any, Hashable, Iterable

from tether.protocol.errors import ErrorCode, MessageError

#: Strikes within the window after which a client is refused.
STRIKES_TO_REFUSE = 3
#: The window, in updates (published or not).
STRIKE_WINDOW_UPDATES = 100
#: Names remembered (least recently struck or seen forgotten first); bounds the memory an
#: attacker that keeps changing its client_session can make the server hold.
MAX_NAMES = 10_000
#: client_sessions remembered per connection.
MAX_SESSIONS_PER_SOURCE = 8


def _session_name(owner: Hashable) -> tuple | None:
    if isinstance(owner, tuple) and len(owner) == 2 and owner[0] == "client_session":
        return owner
    return None


class DataGuard:
    """The strike record of every client, and the refusal check of its messages."""

    def __init__(self, strikes_to_refuse: int = STRIKES_TO_REFUSE, window_updates: int = STRIKE_WINDOW_UPDATES,
                 max_names: int = MAX_NAMES) -> None:
        self.strikes_to_refuse = strikes_to_refuse
        self.window_updates = window_updates
        self.max_names = max_names
        #: Updates counted so far (the clock of the strike window).
        self.updates = 0
        self._strikes: OrderedDict[Hashable, deque[int]] = OrderedDict()
        self._refused: OrderedDict[Hashable, int] = OrderedDict()
        #: source -> the client_sessions seen on it.
        self._sessions: OrderedDict[str, list[tuple]] = OrderedDict()
        #: Several ranks: client_sessions refused here that the other ranks have not been told of yet.
        self._untold: list[tuple] = []
        #: Several ranks: strikes against client_sessions made here and not told yet, (session, update).
        self._untold_strikes: list[tuple[tuple, int]] = []

    # -- names ---------------------------------------------------------------

    def note(self, owner: Hashable, source: str) -> None:
        """Remember that data of ``owner``'s client_session (if any) came on ``source``."""
        session = _session_name(owner)
        if session is None:
            return
        seen = self._sessions.setdefault(source, [])
        self._sessions.move_to_end(source)
        if session not in seen:
            seen.append(session)
            del seen[:-MAX_SESSIONS_PER_SOURCE]
        while len(self._sessions) > self.max_names:
            self._sessions.popitem(last=False)

    def _names(self, source: str, owner: Hashable = None) -> list[Hashable]:
        names: list[Hashable] = [("source", source), *self._sessions.get(source, ())]
        session = _session_name(owner)
        if session is not None and session not in names:
            names.append(session)
        return names

    # -- checks --------------------------------------------------------------

    def check(self, owner: Hashable, source: str) -> None:
        """Raise MessageError(DATA_REFUSED) if the client (``owner`` as Trainer.owner
        gives it, ``source`` as submit's) is refused."""
        for name in self._names(source, owner):
            if name in self._refused:
                raise MessageError(
                    ErrorCode.DATA_REFUSED,
                    f"this client's data made {self._refused[name]} learner updates non-finite (values no update "
                    f"can train on); the server no longer stores its episodes")

    def is_refused(self, source: str, client_session: str | None = None) -> bool:
        """Whether data that came on ``source`` (with its batch's ``client_session``, if any: pooled data
        keeps it, so a refusal still finds data whose connection this guard forgot, or a restart renamed)
        belongs to a refused client."""
        owner = ("client_session", client_session) if client_session is not None else None
        return any(name in self._refused for name in self._names(source, owner))

    def drop_refused(self, pool: Any) -> int:
        """Remove from ``pool`` (a SamplePool) the data of refused clients, each item known by its source and
        client_session; returns the steps removed."""
        return pool.drop(lambda p: not self.is_refused(p.source, p.client_session))

    def is_suspect(self, owner: Hashable, source: str) -> bool:
        """Whether the client has a strike within the window (or is refused)."""
        for name in self._names(source, owner):
            if name in self._refused or self._recent(name):
                return True
        return False

    def _recent(self, name: Hashable) -> int:
        times = self._strikes.get(name)
        if not times:
            return 0
        while times and times[0] <= self.updates - self.window_updates:
            times.popleft()
        return len(times)

    # -- strikes -------------------------------------------------------------

    def tick(self) -> None:
        """One more update (the strike window's clock)."""
        self.updates += 1

    def strike(self, sources: Iterable[str], sessions: dict[str, str] | None = None) -> list[str]:
        """One strike against the client of each source (for this update), and against the
        client_session ``sessions`` names for it (its pooled data's); returns the sources whose
        client is refused from now on."""
        newly, struck = [], set()
        sessions = sessions or {}
        for source in sources:
            refused_now = False
            session = sessions.get(source)
            for name in self._names(source, ("client_session", session) if session is not None else None):
                if name not in struck:  # a session seen on two of the sources: still one strike
                    struck.add(name)
                    if self._add_strike(name, self.updates) and _session_name(name) is not None:
                        self._untold_strikes.append((name, self.updates))
                        del self._untold_strikes[:-self.max_names]  # (a lone server never tells: bounded all the same)
                if self._refuse_if_due(name):
                    refused_now = True
                    if _session_name(name) is not None:
                        self._untold.append(name)
                        del self._untold[:-self.max_names]
            if refused_now:
                newly.append(source)
        self._forget_the_oldest()
        return newly

    def _add_strike(self, name: Hashable, update: int) -> bool:
        """A strike against ``name`` at ``update``; False when it has one at that update already (one
        per update, however many sources, or ranks, its data came on)."""
        times = self._strikes.setdefault(name, deque())
        self._strikes.move_to_end(name)
        if update in times:
            return False
        times.append(update)
        if len(times) > 1 and times[-2] > update:  # (told late by another rank: kept in order, for _recent)
            ordered = sorted(times)
            times.clear()
            times.extend(ordered)
        return True

    def _refuse_if_due(self, name: Hashable) -> bool:
        """Refuse ``name`` if its strikes in the window reach the limit; True when refused now."""
        count = self._recent(name)
        if count >= self.strikes_to_refuse and name not in self._refused:
            self._refused[name] = count
            return True
        return False

    def _forget_the_oldest(self) -> None:
        for table in (self._strikes, self._refused):
            while len(table) > self.max_names:
                table.popitem(last=False)

    # -- several ranks ----------------------------------------------------------

    @property
    def untold(self) -> int:
        """Refusals of and strikes against client_sessions made here since the other ranks were last told."""
        return len(self._untold) + len(self._untold_strikes)

    def take_untold(self) -> dict[str, list]:
        """What the other ranks must be told since the last call: the client_sessions refused here, with their
        strike counts, and the strikes made here against client_sessions, with their updates."""
        untold, self._untold = self._untold, []
        strikes, self._untold_strikes = self._untold_strikes, []
        return {"refused": [(name, self._refused.get(name, self.strikes_to_refuse)) for name in untold],
                "strikes": strikes}

    def adopt(self, told: dict[str, list]) -> list[tuple]:
        """What another rank's ``take_untold`` said: its strikes count here too (the ranks' update clocks are
        the group's), and the client_sessions it refused, or that reach the limit with its strikes, are
        refused here, whichever rank they reconnect to (their connection names are a rank's own). Returns the
        client_sessions refused here by it."""
        if isinstance(told, list):  # (a rank of an older release tells its refusals alone)
            told = {"refused": told}
        newly = []
        for name, update in told.get("strikes", ()):
            name = tuple(name)
            if _session_name(name) is not None and self._add_strike(name, int(update)) and self._refuse_if_due(name):
                newly.append(name)  # (every rank adds the same strikes: every rank refuses it at this agreement)
        for name, count in told.get("refused", ()):
            name = tuple(name)
            if _session_name(name) is not None and name not in self._refused:
                self._refused[name] = int(count)
                newly.append(name)
        self._forget_the_oldest()
        return newly

    # -- checkpoints -------------------------------------------------------------

    def state(self) -> dict[str, list]:
        """The client_sessions refused, for a checkpoint (plain values; a connection's name means nothing
        once the server restarts, so connections are not kept, nor strikes short of a refusal)."""
        return {"refused_sessions": [[name[1], int(count)] for name, count in self._refused.items()
                                     if _session_name(name) is not None]}

    def load_state(self, state: dict) -> None:
        """Refuse again the client_sessions a checkpoint's ``state()`` names (a resumed run goes on refusing
        them: a client refused before a restart does not get new strikes to spend)."""
        for session, count in state.get("refused_sessions", []):
            if isinstance(session, str):
                self._refused[("client_session", session)] = int(count)
                # (several ranks: told again, in case the checkpoint was taken before the others were told)
                self._untold.append(("client_session", session))
        del self._untold[:-self.max_names]
        while len(self._refused) > self.max_names:
            self._refused.popitem(last=False)

    @property
    def refused_count(self) -> int:
        """Names (connections and client_sessions) refused now."""
        return len(self._refused)
