"""Every client active in the last few updates must reach stop_at_return on its own episodes."""

from __future__ import annotations

from tether.server.stop_rule import MIN_EPISODES_PER_CLIENT, ClientReturns


def test_each_active_client_needs_its_own_episodes_at_the_target() -> None:
    returns = ClientReturns(window=100, active_updates=3)
    returns.note("attacker", [500.0] * 300, updates=0)
    assert returns.below(450, updates=0) == []  # alone, a client decides (the documented trust model)
    returns.note("honest", [20.0] * 10, updates=1)
    assert returns.below(450, updates=1) == ["honest"]
    returns.note("honest", [], updates=5)  # sending data without finishing episodes keeps it active
    assert returns.below(450, updates=5) == ["honest"]
    returns.note("late", [500.0] * (MIN_EPISODES_PER_CLIENT - 1), updates=5)
    assert returns.below(450, updates=5) == ["honest", "late"]  # too few episodes to count as reached
    # With two active clients each one's last 50 episodes count: old low returns age out sooner.
    returns.note("honest", [500.0] * 50, updates=6)
    returns.note("late", [500.0], updates=6)
    assert returns.below(450, updates=6) == []
    assert returns.below(450, updates=100) == []  # nobody active: nobody below (the run-wide rule still applies)
