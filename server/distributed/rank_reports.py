"""Every rank seen from one place: rank 0's console and TensorBoard show the group, not rank 0 alone.

About once a second (rank 0 asks in an agreement, so every rank takes part in the same gather) each
rank sends rank 0 its report: its client address, connected clients, ingest (env steps received,
stale steps refused), health (steps waiting in its pool, resident memory, the event loop's lag: the
worst lateness of its wait between two agreements since the last report), the
clients it redirected, and — when the group runs a console — its client table, each row marked with
the rank. Rank 0 keeps the latest reports, works out each rank's ingest rate, and writes
``rank/<r>/...`` series into its metrics, which its console charts and its TensorBoard writes at
every update.
"""

from __future__ import annotations

import math
import time
from typing import Any

from ..console.state import _rss_mb as resident_mb

#: Seconds between two reports of the group (at most: an update in between delays the next).
REPORT_EVERY_S = 1.0
#: Client rows a rank reports at most (the console shows at most this many per rank).
MAX_CLIENT_ROWS = 256


class RankReports:
    """This rank's report (every rank) and the group's latest reports (kept by rank 0)."""

    def __init__(self, rank: int, world_size: int, metrics: Any, pool: Any) -> None:
        self.rank = rank
        self.world_size = world_size
        self.metrics = metrics
        self.pool = pool
        #: The rank's ConsoleState when the group runs a console (its client table and loop lag), else None.
        self.collector: Any = None
        #: The group's directory (addresses, redirects), once the rank listens.
        self.directory: Any = None
        #: The run's curriculum (None without one): rank 0's decides, the others follow it and send it
        #: their episodes' measures in their reports; ``on_curriculum_change`` is told of each change.
        self.curriculum: Any = None
        self.on_curriculum_change: Any = None
        #: Rank 0: the last report of every rank, in rank order (empty before the first).
        self.latest: list[dict[str, Any]] = []
        self._due_at = time.monotonic() + REPORT_EVERY_S
        self._marks: dict[int, tuple[float, int]] = {}
        #: The worst lateness of the agreements' timer since the last report (seconds): the event loop's lag.
        self._worst_lag_s = 0.0

    def note_lag(self, late_s: float) -> None:
        """How late a timer of the event loop fired (the lockstep loop's wait between agreements)."""
        self._worst_lag_s = max(self._worst_lag_s, late_s)

    def due(self) -> bool:
        """Rank 0's wish in an agreement: the group gathers its reports after it."""
        return self.rank == 0 and time.monotonic() >= self._due_at

    def report(self) -> dict[str, Any]:
        """What this rank tells rank 0 (plain values: it is pickled into the gather)."""
        m = self.metrics
        collector = self.collector
        clients: list[dict[str, Any]] = []
        if collector is not None:
            if self.rank > 0:
                collector.sample()  # (rank 0's console samples each second itself; the others' have no page)
            clients = [{**row, "rank": self.rank} for row in collector.client_table()[:MAX_CLIENT_ROWS]]
        directory = self.directory
        return {
            "rank": self.rank,
            "address": directory.addresses[self.rank] if directory is not None else None,
            "clients_connected": int(m.clients_connected),
            "env_steps": int(m.env_steps_received),
            "agent_steps": int(m.agent_steps_received),
            "samples_refused_stale": int(m.samples_refused_stale),
            "clients_refused": int(m.clients_refused),
            "pool_steps": int(self.pool.steps),
            "rss_mb": _rss_mb(),  # (None where it cannot be read: the console's JSON has no NaN)
            "loop_lag_ms": round(self._take_lag() * 1e3, 2),
            "redirected": list(directory.redirected) if directory is not None else [],
            "curriculum_measures": (self.curriculum.take_forwarded()
                                    if self.curriculum is not None and self.curriculum.follower else []),
            "clients": clients,
        }

    def _take_lag(self) -> float:
        worst, self._worst_lag_s = self._worst_lag_s, 0.0
        return max(worst, 0.0)

    def take(self, reports: list[dict[str, Any]]) -> None:
        """Rank 0: the reports just gathered; each rank's ingest rate, and its series in the metrics."""
        now = time.monotonic()
        self._due_at = now + REPORT_EVERY_S
        scalars: dict[str, float] = {}
        for report in reports:
            rank = int(report["rank"])
            mark = self._marks.get(rank)
            rate = (report["env_steps"] - mark[1]) / (now - mark[0]) if mark and now > mark[0] else 0.0
            self._marks[rank] = (now, report["env_steps"])
            report["env_steps_per_s"] = round(rate, 1)
            scalars.update({f"rank/{rank}/env_steps_per_s": rate, f"rank/{rank}/clients": report["clients_connected"],
                            f"rank/{rank}/pool_steps": report["pool_steps"],
                            f"rank/{rank}/loop_lag_ms": report["loop_lag_ms"]})
            if report["rss_mb"] is not None:
                scalars[f"rank/{rank}/rss_mb"] = report["rss_mb"]
            measures = report.pop("curriculum_measures", [])
            if self.curriculum is not None and rank != self.rank and measures:
                before = self.curriculum.changes_made
                self.curriculum.note_forwarded(measures)
                if self.curriculum.changes_made != before and self.on_curriculum_change is not None:
                    self.on_curriculum_change()
        self.latest = reports
        self.metrics.rank_scalars = scalars

    def follow(self, snapshot: dict[str, Any] | None) -> None:
        """A rank > 0: rank 0's curriculum as the gather left it (``snapshot``), served from now on."""
        if self.curriculum is not None and snapshot is not None and self.curriculum.adopt(snapshot):
            if self.on_curriculum_change is not None:
                self.on_curriculum_change()

    def rows(self) -> list[dict[str, Any]]:
        """The console's table of ranks: each rank's report without its clients."""
        return [{k: v for k, v in report.items() if k != "clients"} for report in self.latest]

    def other_ranks_clients(self) -> list[dict[str, Any]]:
        """The client rows of every rank but this one (rank 0's console has its own, fresh)."""
        return [row for report in self.latest if report["rank"] != self.rank for row in report["clients"]]



def _rss_mb() -> float | None:
    """The console's reading of this process's resident memory, None where it cannot be read (JSON has no NaN)."""
    value = resident_mb()
    return None if math.isnan(value) else round(value, 1)
