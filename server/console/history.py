"""Bounded time series for the console: a whole run, however long, in at most
``capacity`` points per series.

Every series keeps its points at one resolution: each stored point is the mean
of ``stride`` consecutive samples. When the series is full, neighbouring points
are merged in pairs and the stride doubles, so a day-long run keeps the same
number of points as a minute-long one, spread evenly over the whole run (the
chart can zoom anywhere), and memory stays at ``capacity`` points per series.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Series:
    """One metric over time: ``t`` (seconds since the run started) and ``v``, at one stride."""

    capacity: int = 1024
    t: list[float] = field(default_factory=list)
    v: list[float] = field(default_factory=list)
    stride: int = 1
    #: Samples added so far (each stored point stands for ``stride`` of them, the newest fewer).
    samples: int = 0
    _pending_t: float = 0.0
    _pending_sum: float = 0.0
    _pending_count: int = 0
    _pending_finite: int = 0

    def add(self, t: float, value: float) -> bool:
        """Adds a sample; returns whether a new point was stored (a sample that
        is not finite counts in the stride but not in the mean)."""
        self.samples += 1
        if self._pending_count == 0:
            self._pending_t = t
        self._pending_count += 1
        if math.isfinite(value):
            self._pending_sum += value
            self._pending_finite += 1
        if self._pending_count < self.stride:
            return False
        mean = self._pending_sum / self._pending_finite if self._pending_finite else math.nan
        self.t.append(self._pending_t)
        self.v.append(mean)
        self._pending_count = self._pending_finite = 0
        self._pending_sum = 0.0
        if len(self.t) >= self.capacity:
            self._halve()
        return True

    def _halve(self) -> None:
        t, v = self.t, self.v
        merged_t, merged_v = [], []
        for i in range(0, len(t) - 1, 2):
            merged_t.append(t[i])
            a, b = v[i], v[i + 1]
            merged_v.append((a + b) / 2 if math.isfinite(a) and math.isfinite(b) else (a if math.isfinite(a) else b))
        if len(t) % 2:
            merged_t.append(t[-1])
            merged_v.append(v[-1])
        self.t, self.v = merged_t, merged_v
        self.stride *= 2

    def since(self, index: int) -> tuple[list[float], list[float]]:
        """The points stored from ``index`` on."""
        return self.t[index:], self.v[index:]


class History:
    """Named series sharing one capacity: what a browser that connects gets first."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self.series: dict[str, Series] = {}

    def add(self, t: float, values: dict[str, float]) -> None:
        for key, value in values.items():
            series = self.series.get(key)
            if series is None:
                series = self.series[key] = Series(self.capacity)
            series.add(t, float(value))

    def points(self) -> int:
        """Points held over all series (at most capacity per series)."""
        return sum(len(s.t) for s in self.series.values())

    def to_json(self) -> dict[str, dict[str, list]]:
        """Every series as {"t": [...], "v": [...]} (a value that is not finite as null)."""
        return {key: {"t": [round(x, 3) for x in s.t], "v": [x if math.isfinite(x) else None for x in s.v]}
                for key, s in self.series.items()}
