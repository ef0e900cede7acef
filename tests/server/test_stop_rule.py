"""Every client active in the last few updates must reach stop_at_return on its own episodes."""

from __future__ import annotations

from tether.server.stop_rule import ACTIVE_S, MIN_EPISODES_PER_CLIENT, ClientReturns


def test_each_active_client_needs_its_own_episodes_at_the_target() -> None:
    returns = ClientReturns(window=100, active_updates=3)
    returns.note("attacker", [500.0] * 300, updates=0, now=0.0)
    assert returns.below(450, updates=0, now=0.0) == []  # alone, a client decides (the documented trust model)
    returns.note("honest", [20.0] * 10, updates=1, now=1.0)
    assert returns.below(450, updates=1, now=1.0) == ["honest"]
    returns.note("honest", [], updates=5, now=2.0)  # sending data without finishing episodes keeps it active
    assert returns.below(450, updates=5, now=100.0) == ["honest"]
    returns.note("late", [500.0] * (MIN_EPISODES_PER_CLIENT - 1), updates=5, now=2.0)
    assert returns.below(450, updates=5, now=100.0) == ["honest", "late"]  # too few episodes to count as reached
    # With two active clients each one's last 50 episodes count: old low returns age out sooner.
    returns.note("honest", [500.0] * 50, updates=6, now=200.0)
    returns.note("late", [500.0], updates=6, now=200.0)
    assert returns.below(450, updates=6, now=200.0) == []
    # Many quick updates do not make a client that sent data within ACTIVE_S lose its say.
    returns.note("slow", [20.0] * 10, updates=6, now=200.0)
    assert returns.below(450, updates=100, now=200.0 + ACTIVE_S - 1) == ["slow"]
    assert returns.below(450, updates=100, now=200.0 + ACTIVE_S + 1) == []  # nobody active: nobody below
    returns.note("no_episode_that_counts", [], updates=100, now=300.0)  # e.g. only returns of 3e38
    assert returns.below(450, updates=100, now=301.0) == ["no_episode_that_counts"]
    assert returns.below(450, updates=104, now=301.0) == []
