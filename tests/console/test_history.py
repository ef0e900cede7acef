"""The console's history stays bounded over a long run and keeps its shape."""

from __future__ import annotations

import math

from tether.server.console.history import History, Series


def test_a_day_of_samples_fits_in_capacity_spread_over_the_whole_run() -> None:
    series = Series(capacity=256)
    for second in range(86_400):
        series.add(float(second), float(second))
    assert len(series.t) < 256 and series.samples == 86_400
    assert series.t[0] == 0.0 and series.t[-1] > 86_400 - 2 * series.stride  # the whole run, start to end
    gaps = {round(b - a) for a, b in zip(series.t, series.t[1:])}
    assert gaps == {series.stride}  # evenly spread
    # Each point is the mean of the samples it stands for (a ramp: the middle of its interval).
    assert all(abs(v - (t + (series.stride - 1) / 2)) < 1e-6 for t, v in zip(series.t, series.v))


def test_values_that_are_not_finite_do_not_poison_their_neighbours() -> None:
    series = Series(capacity=4)
    for i, value in enumerate([1.0, math.nan, 3.0, math.inf, 5.0, 7.0, 9.0, 11.0]):
        series.add(float(i), value)
    assert all(math.isfinite(v) for v in series.v), series.v
    history = History(capacity=8)
    history.add(0.0, {"a": math.nan, "b": 2.0})
    assert history.to_json() == {"a": {"t": [0.0], "v": [None]}, "b": {"t": [0.0], "v": [2.0]}}


def test_memory_is_bounded_by_capacity_per_series() -> None:
    history = History(capacity=64)
    for second in range(20_000):
        history.add(float(second), {f"module/m{k}/return_mean": float(k) for k in range(10)})
    assert history.points() <= 10 * 64

