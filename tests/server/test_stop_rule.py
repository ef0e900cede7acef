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


def _rank(returns: list[float], client_returns: list[float], updates: int = 10):
    """One rank's stop rule, its metrics window holding ``returns``, its one client ``client_returns``."""
    from tether.server.config import ServerConfig
    from tether.server.metrics import Metrics
    from tether.server.stop_rule import StopRule

    metrics = Metrics()
    metrics.returns.extend(returns)
    metrics.episodes_total = len(returns)
    metrics.updates = updates
    stops: list[str] = []
    rule = StopRule(ServerConfig(stop_at_return=450.0), metrics, stops.append)
    rule.client_returns.note(object(), client_returns, updates=updates)
    return rule, metrics, stops


def _judge_group(ranks: list, times: int) -> None:
    """Every rank judges the sum of the ranks' views, as the agreements of a group do after each update."""
    from tether.server.stop_rule import TargetView

    for _ in range(times):
        views = [rule.target_view(share_of=len(ranks), clients=len(ranks)).to_list() for rule, _, _ in ranks]
        group = TargetView.from_list(map(sum, zip(*views)))
        for rule, metrics, _ in ranks:
            rule.judge_target(group)
            metrics.episodes_total += 30  # (new episodes between two updates)


def test_a_group_judges_its_episodes_together_not_each_rank_its_own_window() -> None:
    """A rank whose client plays slowly has finished 40 episodes, all at 500; the other rank 100 at 500. On
    its own the slow rank's rule waits for a whole window of its own; the group's rule, on the sum of the
    ranks' views, is done."""
    fast, slow = _rank([500.0] * 100, [500.0] * 100), _rank([500.0] * 40, [500.0] * 40)
    for rule, metrics, stops in (fast, slow):
        for _ in range(4):
            rule.check_target()
            metrics.episodes_total += 30
    assert fast[2] and not slow[2], "each rank on its own: the slow one is not done"
    fast, slow = _rank([500.0] * 100, [500.0] * 100), _rank([500.0] * 40, [500.0] * 40)
    _judge_group([fast, slow], times=3)
    assert fast[2] == slow[2] == ["stop_at_return"], "the group is done, on every rank alike"


def test_a_group_is_not_done_while_one_ranks_episodes_or_client_fall_short() -> None:
    # The slow rank's episodes are low: the group's mean (its share of the window counts half) falls short.
    ranks = [_rank([500.0] * 100, [500.0] * 100), _rank([100.0] * 60, [100.0] * 60)]
    _judge_group(ranks, times=5)
    assert not ranks[0][2] and not ranks[1][2]
    # The mean would do (one low episode among a hundred), but the slow rank's client is below the target
    # on its own last episodes: made-up returns on one rank cannot end the run for all.
    ranks = [_rank([500.0] * 100, [500.0] * 100), _rank([500.0] * 50, [500.0] * 5 + [20.0] * 40)]
    _judge_group(ranks, times=5)
    assert not ranks[0][2] and not ranks[1][2]
