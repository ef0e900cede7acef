"""Every client active in the last few updates must reach stop_at_return on its own episodes."""

from __future__ import annotations

import pytest

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


def _judge_group(ranks: list, times: int, between=None) -> list[list[bool]]:
    """Every rank judges the sum of the ranks' views, as a group's agreements do after each update: each
    rank's share of the window from the returns every rank held at the agreement before. Returns each
    judgement's decisions, one per rank."""
    from tether.server.stop_rule import TargetView, window_shares

    decisions = []
    for judgement in range(times):
        held = [len(metrics.returns) for _, metrics, _ in ranks]
        shares = window_shares(held, 100)
        views = [rule.target_view(shares[r], clients=len(ranks)).to_list() for r, (rule, _, _) in enumerate(ranks)]
        group = TargetView.from_list(map(sum, zip(*views)))
        decisions.append([rule.judge_target(group) for rule, _, _ in ranks])
        for r, (rule, metrics, _) in enumerate(ranks):
            metrics.episodes_total += 30  # (new episodes between two updates)
            if between is not None:
                between(judgement, r, rule, metrics)
    return decisions


def test_window_shares_are_even_where_the_ranks_hold_enough_and_add_up_to_a_window() -> None:
    from tether.server.stop_rule import window_shares

    assert window_shares([100, 100], 100) == [50, 50]
    assert window_shares([100, 100, 100], 100) in ([34, 33, 33], [33, 34, 33], [33, 33, 34])
    assert sum(window_shares([100, 100, 100], 100)) == 100
    assert window_shares([100, 7], 100) == [93, 7], "a rank short of its share gives all it holds, the other the rest"
    assert window_shares([100] + [1] * 7, 100) == [93] + [1] * 7
    assert window_shares([0, 100], 100) == [0, 100]
    assert window_shares([3, 3], 100) == [3, 3], "never more than a rank holds"
    assert window_shares([0, 0], 100) == [0, 0]


def test_a_ranks_view_gives_its_last_returns_and_judges_its_clients_as_the_groups() -> None:
    rule, _, _ = _rank([100.0] * 50 + [500.0] * 50, [100.0] * 75 + [500.0] * 25)
    view = rule.target_view(50)
    assert (view.window_count, view.window_sum, view.episodes_held) == (50, 25_000, 100), "its last 50, all it holds"
    assert rule.target_view().window_count == 100, "a lone server's: its whole window"
    # Its one client, judged alone, needs its own whole window at 450; as one of a group's four active
    # clients, its last quarter of a window: 25 at 500.
    assert rule.target_view().clients_below == 1
    assert rule.target_view(50, clients=4).clients_below == 0
    assert rule.target_view(50, clients=4).clients_active == 1


def test_a_group_judges_its_episodes_together_not_each_rank_its_own_window() -> None:
    """A rank whose client plays slowly has finished 40 episodes, all at 500; the other rank 100 at 500. On
    its own the slow rank's rule waits for a whole window of its own; the group's rule, on the sum of the
    ranks' views, is done, on both ranks at the same judgement."""
    fast, slow = _rank([500.0] * 100, [500.0] * 100), _rank([500.0] * 40, [500.0] * 40)
    for rule, metrics, stops in (fast, slow):
        for _ in range(4):
            rule.check_target()
            metrics.episodes_total += 30
    assert fast[2] and not slow[2], "each rank on its own: the slow one is not done"
    fast, slow = _rank([500.0] * 100, [500.0] * 100), _rank([500.0] * 40, [500.0] * 40)
    assert _judge_group([fast, slow], times=3) == [[False, False], [False, False], [True, True]]
    assert fast[2] == slow[2] == ["stop_at_return"], "the group is done, on every rank alike"
    assert fast[0].return_mean_at_target == slow[0].return_mean_at_target == 500.0
    assert fast[0].env_steps_at_target == slow[0].env_steps_at_target


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


def test_a_short_rank_cannot_shrink_the_groups_window() -> None:
    """Seven ranks hold one episode each, at 500; one holds 100, of which the last 93 are at 300. The
    group's window is a hundred returns (all of the seven's, 93 of the eighth's), and its mean falls short:
    the seven short ranks do not make a window of 19 returns out of the eighth's best."""
    ranks = [_rank([500.0] * 7 + [300.0] * 93, [500.0] * 100)] + [_rank([500.0], [500.0] * 100) for _ in range(7)]
    decisions = _judge_group(ranks, times=5)
    assert not any(any(d) for d in decisions) and not any(stops for _, _, stops in ranks)


def test_a_discarded_update_on_one_rank_starts_the_groups_window_over_on_every_rank() -> None:
    """Only one rank held the data of the module whose update was discarded (a rank with no data for it
    does not count it). Both ranks' windows are at the target, yet neither is done until a whole window of
    the group's episodes finished after the discard, and both decide alike at every judgement."""
    ranks = [_rank([500.0] * 100, [500.0] * 100), _rank([500.0] * 100, [500.0] * 100)]

    def discard_on_rank_1_first(judgement: int, rank: int, rule, metrics) -> None:
        if judgement == 0 and rank == 1:
            rule.update_discarded()

    decisions = _judge_group(ranks, times=6, between=discard_on_rank_1_first)
    assert all(d[0] == d[1] for d in decisions), decisions
    # The group's episodes at each judgement: 200, 260 (sees the discard: 0 since), 320 (60 since), then
    # 380, 440 and 500 (>= 100 since: a streak of three updates).
    assert [d[0] for d in decisions] == [False] * 5 + [True], decisions
    # Without the discard: done at the third judgement.
    ranks = [_rank([500.0] * 100, [500.0] * 100), _rank([500.0] * 100, [500.0] * 100)]
    assert _judge_group(ranks, times=3) == [[False, False], [False, False], [True, True]]


def test_a_lone_servers_discarded_update_waits_for_a_window_of_new_episodes() -> None:
    rule, metrics, stops = _rank([500.0] * 100, [500.0] * 100)
    rule.update_discarded()
    decided = []
    for _ in range(7):
        decided.append(rule.judge_target(rule.target_view()))
        metrics.episodes_total += 30
    assert decided == [False] * 6 + [True] and stops == ["stop_at_return"]


def test_a_share_cut_short_by_refused_returns_does_not_count() -> None:
    """The shares come from what the ranks held at the agreement before the update; that update refused a
    client of rank 1 and took 95 of its returns out of its window. The group's view then holds 55 returns,
    all at 500: too few to count, whatever their mean."""
    from tether.server.stop_rule import TargetView, window_shares

    ranks = [_rank([500.0] * 100, [500.0] * 100), _rank([500.0] * 100, [500.0] * 100)]
    shares = window_shares([100, 100], 100)
    for _ in range(95):
        ranks[1][1].returns.pop()
    decided = []
    for _ in range(4):
        views = [rule.target_view(shares[r], clients=2).to_list() for r, (rule, _, _) in enumerate(ranks)]
        group = TargetView.from_list(map(sum, zip(*views)))
        assert group.window_count == 55 and group.episodes_held == 105
        decided.append([rule.judge_target(group) for rule, _, _ in ranks])
        for _, metrics, _ in ranks:
            metrics.episodes_total += 30
    assert decided == [[False, False]] * 4


def test_every_rank_stops_for_the_same_reason_when_one_is_signalled_as_another_reaches_its_budget() -> None:
    """A rank whose budget is reached at the agreement where another rank is signalled must not end its
    clients' run (TRAINING_DONE) while the others are interrupted: it stops as "group" too."""
    from types import SimpleNamespace

    from tether.server.config import ServerConfig
    from tether.server.distributed.lockstep_loop import LockstepLearnerLoop

    config = ServerConfig(max_env_steps=1000)
    wishes = {"stop": 1.0, "done": 1.0, "paused": 0.0, "report": 0.0, "results": 0.0}
    reason = LockstepLearnerLoop._stop_reason  # (what each rank decides from the agreed sums and its own wish)
    assert reason(SimpleNamespace(_wish="max_env_steps", config=config), wishes, 1000, False) == "group"
    assert reason(SimpleNamespace(_wish=None, config=config), wishes, 1000, False) == "group"
    assert reason(SimpleNamespace(_wish="signal", config=config), wishes, 1000, False) == "signal"
    assert reason(SimpleNamespace(_wish="max_env_steps", config=config), {**wishes, "stop": 0.0}, 1000,
                  False) == "max_env_steps"


def test_a_metrics_window_too_short_for_the_stop_rule_is_refused() -> None:
    from tether.server.config import ServerConfig

    with pytest.raises(ValueError, match="metrics_window"):
        ServerConfig(stop_at_return=100.0, metrics_window=4)
    assert ServerConfig(metrics_window=4).metrics_window == 4  # (without the rule, any window of 1 or more)
