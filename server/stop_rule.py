"""When a run is done: ``max_env_steps`` received, or ``stop_at_return`` reached by the
windowed mean return over several updates and by every active client on its own.

Returns are kept per client, so that ``stop_at_return`` is never decided by what one client asserts.

A client that holds the token can send made-up episodes with any return (their
log-probabilities can be honest: the actions were sampled, the rewards are the
client's word). The run-wide window of returns can therefore be filled by one
client. The stop rule also asks every *active* client — one that sent data in
the last few updates or the last minute — to have reached the target on its own last episodes:
made-up returns from one client cannot end a run while another client's
episodes are below the target. (A client that is the only active one decides
alone; docs/protocol.md §6.4 states this trust model.)

A client is its ``client_session`` when its batches carry one, else its
connection: the owner of its episode state (``SessionOwners.owner``).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass, fields
from typing import Callable, Hashable, Iterable, Sequence

from .config import ServerConfig
from .metrics import FinishedEpisode, Metrics, plausible_return

#: Consecutive updates at whose end the windowed mean return must be >= stop_at_return.
TARGET_UPDATES = 3
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

    def active(self, updates: int, now: float | None = None) -> list[tuple[Hashable, deque]]:
        """The clients that have a say now, with their last returns."""
        now = time.monotonic() if now is None else now
        return [(c, r) for c, (r, (last_update, last_time)) in self._clients.items()
                if updates - last_update <= self.active_updates or (now - last_time <= ACTIVE_S and r)]

    def below(self, target: float, updates: int, now: float | None = None, clients: int | None = None,
              active: list[tuple[Hashable, deque]] | None = None) -> list[Hashable]:
        """Active clients that have not reached ``target`` on their own last episodes: with n
        active clients, each one's last max(MIN_EPISODES_PER_CLIENT, window / n) (together about
        a window, so the rule lags no more than the run-wide mean); too few, or a mean below it.
        ``clients``: n when more clients than these have a say (the active clients of every rank);
        ``active``: active()'s answer when the caller has it."""
        active = self.active(updates, now) if active is None else active
        share = max(MIN_EPISODES_PER_CLIENT, self.window // max(1, len(active), clients or 0))
        out = []
        for client, returns in active:
            recent = list(returns)[-share:]
            if len(recent) < MIN_EPISODES_PER_CLIENT or not sum(recent) / len(recent) >= target:
                out.append(client)
        return out


@dataclass
class TargetView:
    """What the stop_at_return decision reads, in numbers that add up across the ranks of a group."""

    #: The sum and count of the last episodes' returns (all of a lone server's window; a rank's share of the group's).
    window_sum: float = 0.0
    window_count: float = 0.0
    #: Episodes in the windows (each at most a window), and finished so far.
    episodes_held: float = 0.0
    episodes_total: float = 0.0
    #: Updates discarded (non-finite) since the start (or the resume).
    discards: float = 0.0
    #: Active clients, and those of them below the target on their own last episodes.
    clients_active: float = 0.0
    clients_below: float = 0.0
    env_steps: float = 0.0

    def to_list(self) -> list[float]:
        return [float(getattr(self, f.name)) for f in fields(self)]

    @classmethod
    def from_list(cls, values: Iterable[float]) -> "TargetView":
        return cls(*(float(v) for v in values))

    @classmethod
    def size(cls) -> int:
        return len(fields(cls))


def window_shares(held: Sequence[int], window: int) -> list[int]:
    """How many of its last returns each rank of a group gives to the group's window of ``window``
    returns, ``held[r]`` being what rank r holds: as even as the ranks allow, a rank holding fewer
    than its share giving all it holds and the others the rest (so the shares add up to
    min(window, sum(held)); the same on every rank, which all read the same ``held``)."""
    shares = [0] * len(held)
    left = window
    order = sorted(range(len(held)), key=lambda r: (held[r], r))
    for i, rank in enumerate(order):
        remaining = len(order) - i
        shares[rank] = min(max(0, int(held[rank])), -(-left // remaining))
        left -= shares[rank]
    return shares


class StopRule:
    """Decides when the run is done and says so through ``request_stop`` ("max_env_steps" or
    "stop_at_return"); keeps when the target was first met."""

    def __init__(self, config: ServerConfig, metrics: Metrics, request_stop: Callable[[str], None]) -> None:
        self.config = config
        self.metrics = metrics
        self._request_stop = request_stop
        #: Each client's own returns: every active client must reach stop_at_return.
        self.client_returns = ClientReturns(min(config.metrics_window, 100), active_updates=TARGET_UPDATES)
        self._target_streak: list[tuple[float, int, int]] = []
        #: Updates discarded here (TargetView.discards), those the judge has seen, and the episodes
        #: finished (its view's: a group's) when it saw the last one; None before any.
        self.discards = 0
        self._discards_seen = 0
        self._window_fresh_from: float | None = None
        #: Wall-clock time (time.time()) and env steps when the mean return first met stop_at_return
        #: in the run of updates that confirmed it (see check_target).
        self.reached_target_at: float | None = None
        self.env_steps_at_target: int | None = None
        self.target_confirmed_at: float | None = None
        #: The windowed mean return the rule confirmed the target on (a group's: over every rank's share).
        self.return_mean_at_target: float | None = None

    def note(self, client: Hashable, records: list, finished: list[FinishedEpisode], suspect: bool) -> None:
        """``client`` sent ``records``, which finished ``finished`` episodes (``suspect``: see DataGuard)."""
        if self.config.stop_at_return is not None and (records or finished):
            # A suspect client still has a say (it stays active), but its returns do not count toward the target.
            # (A batch with no records, of a client holding its episodes back, does not make it active.)
            self.client_returns.note(client, () if suspect else (
                e.total_return for e in finished if e.complete and plausible_return(e)), self.metrics.updates)

    def check_budget(self) -> None:
        """max_env_steps, checked as data arrives."""
        c, m = self.config, self.metrics
        if c.max_env_steps is not None and m.env_steps_received >= c.max_env_steps:
            self._request_stop("max_env_steps")

    def update_discarded(self) -> None:
        """An update was discarded (non-finite): returns of the episodes behind its batch may be
        bogus too, so the target waits until a whole window of episodes came after it (judge_target
        sees it in its view's ``discards``)."""
        self.discards += 1

    def check_target(self) -> None:
        """stop_at_return, checked after each published update (judge_target on this server's view)."""
        if self.config.stop_at_return is not None:
            self.judge_target(self.target_view())

    def target_view(self, share: int | None = None, clients: int | None = None) -> TargetView:
        """This server's numbers for judge_target. A rank of a group gives its last ``share`` returns
        (window_shares) and judges its clients as ``clients`` of the group's active ones, so that the
        sum over the ranks is the group's view."""
        c, m = self.config, self.metrics
        returns = list(m.returns)
        last = returns if share is None else returns[len(returns) - min(len(returns), max(0, share)):]
        active = self.client_returns.active(m.updates)
        below = self.client_returns.below(c.stop_at_return, m.updates, clients=clients, active=active) \
            if c.stop_at_return is not None else []
        return TargetView(
            window_sum=float(sum(last)), window_count=float(len(last)), episodes_held=float(len(returns)),
            episodes_total=float(m.episodes_total), discards=float(self.discards),
            clients_active=float(len(active)), clients_below=float(len(below)),
            env_steps=float(m.env_steps_received))

    def judge_target(self, view: TargetView) -> bool:
        """stop_at_return, judged on ``view`` after each published update (a group's: the sum of its
        ranks' views, judged alike by every rank). The windowed mean
        must be >= the target at the end of TARGET_UPDATES consecutive updates,
        across which at least half a window of new episodes finished: one
        message of made-up episodes is trained on by at most one update and is
        half pushed out of the window by real episodes before the run can end.
        After a discarded (non-finite) update, a whole window of new episodes
        must finish before the return counts again. Every client active in the
        last TARGET_UPDATES updates must also have reached the target on its own
        last episodes (ClientReturns): one client's made-up returns cannot end a run
        while another client's episodes fall short. Returns whether the target is reached (and the
        stop requested). The decision depends on the views judged so far only: ranks that judge the
        same sums decide the same."""
        c = self.config
        need = min(c.metrics_window, 100)
        if c.stop_at_return is None:
            return False
        if view.discards > self._discards_seen:  # (a discard since the last judgement: the window starts over)
            self._discards_seen, self._window_fresh_from = int(view.discards), view.episodes_total
        # (window_count: a group's shares were set at the agreement before; a rank whose window lost a
        # refused client's returns since may give fewer, and a mean of too few returns does not count)
        if (view.window_count < need or view.window_count == 0  # (at most the returns held: too few yet, too)
                or not view.window_sum / view.window_count >= c.stop_at_return
                or self._window_fresh_from is not None and view.episodes_total - self._window_fresh_from < need
                or view.clients_below > 0):
            self._target_streak = []
            return False
        self._target_streak.append((time.time(), int(view.env_steps), int(view.episodes_total)))
        first_t, first_steps, first_episodes = self._target_streak[0]
        if len(self._target_streak) >= TARGET_UPDATES and view.episodes_total - first_episodes >= need // 2:
            if self.reached_target_at is None:
                self.reached_target_at, self.env_steps_at_target = first_t, first_steps
                self.target_confirmed_at = time.time()
                self.return_mean_at_target = view.window_sum / view.window_count
            self._request_stop("stop_at_return")
            return True
        return False
