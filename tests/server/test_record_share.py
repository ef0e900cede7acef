"""The share of new episodes clients are asked to record (server/record_share.py, §13.2):
it shrinks to what fitted when too much is refused, waits for data recorded under the new
share before shrinking again, grows while the learner waits for data, and starts low
enough for a crowd of new clients."""

from __future__ import annotations

import pytest

from tether.server.record_share import AIM, FLOOR, GROWTH, MAX_SHRINK, SETTLE_S, WINDOW_S, RecordShare


def test_refusals_shrink_it_to_what_fitted_then_it_settles_before_shrinking_again() -> None:
    share = RecordShare(0.0, train_batch_size=2000, env_steps_per_sample=500)
    share.note(600, 400, WINDOW_S)  # 40 % refused
    assert share.value == pytest.approx(AIM * 0.6)
    after_first = share.value
    share.note(100, 900, 2 * WINDOW_S)  # data recorded under the old share: no second shrink yet
    assert share.value == after_first
    share.note(100, 900, WINDOW_S + SETTLE_S + WINDOW_S)
    assert share.value == pytest.approx(after_first * max(MAX_SHRINK, AIM * 0.1))


def test_a_few_refusals_or_a_busy_learner_leave_it_alone_and_a_waiting_learner_grows_it() -> None:
    share = RecordShare(0.0, train_batch_size=2000, env_steps_per_sample=500)
    share.value = 0.5
    share.note(990, 10, WINDOW_S)  # 1 % refused, learner never idle
    assert share.value == 0.5
    share.starving(True, WINDOW_S)
    share.note(10, 0, 2 * WINDOW_S)  # idle the whole window
    assert share.value == pytest.approx(0.5 * GROWTH)
    share.starving(False, 2 * WINDOW_S)
    share.note(10, 0, 3 * WINDOW_S)
    assert share.value == pytest.approx(0.5 * GROWTH)
    for i in range(100):  # never above 1
        share.starving(True, (4 + i) * WINDOW_S)
        share.note(0, 0, (5 + i) * WINDOW_S)
    assert share.value == 1.0


def test_it_starts_low_enough_for_a_crowd_and_never_reaches_zero() -> None:
    share = RecordShare(0.0, train_batch_size=2000, env_steps_per_sample=500)
    assert share.current(1) == 1.0 and share.current(4) == 1.0
    assert share.current(64) == pytest.approx(2000 / (64 * 500))
    assert share.current(32) == pytest.approx(2000 / (64 * 500)), "fewer clients do not raise it by themselves"
    for i in range(200):
        share.note(0, 1000, (1 + i) * (WINDOW_S + SETTLE_S))
    assert share.value == FLOOR


def test_a_reconnect_does_not_cap_it_again_and_a_learner_left_waiting_grows_it_despite_refusals() -> None:
    from tether.server.record_share import IDLE_OVERRIDES

    share = RecordShare(0.0, train_batch_size=2000, env_steps_per_sample=500)
    capped = share.current(64)
    share.value = 0.5  # grown since
    assert share.current(63) == 0.5 and share.current(64) == 0.5, "a client reconnecting is no new crowd"
    assert share.current(65) == pytest.approx(2000 / (65 * 500)) and capped > share.value
    # Refusals (say, of a client that does not hold back) while the learner waited nearly all the time:
    from tether.server.record_share import IDLE_WINDOWS

    share = RecordShare(0.0, train_batch_size=2000, env_steps_per_sample=500)
    share.value = 0.01
    share.starving(True, 0.0)
    for i in range(IDLE_WINDOWS - 1):  # a few idle windows among bursts are no reason yet
        share.note(0, 5000, (i + 1) * WINDOW_S)
    assert share.value < 0.01
    before = share.value
    share.note(0, 5000, IDLE_WINDOWS * WINDOW_S)
    assert IDLE_OVERRIDES < 1 and share.value == pytest.approx(before * GROWTH)


def test_batches_are_smaller_while_clients_are_held_back_and_for_a_while_after() -> None:
    from tether.server.record_share import BATCH_HOLD_S, BATCH_SHARE

    share = RecordShare(0.0, train_batch_size=2000, env_steps_per_sample=500)
    assert share.steps_per_batch(0.0) is None, "nobody held back: env_steps_per_sample"
    share.note(600, 400, WINDOW_S)
    assert share.value < 1 and share.steps_per_batch(WINDOW_S) == 500 * BATCH_SHARE == 100
    # Still below one long after: still small (asking does not start the hold).
    assert share.steps_per_batch(WINDOW_S + 10 * BATCH_HOLD_S) == 100
    # The learner waits for data window after window: the share grows back to one.
    now = WINDOW_S
    while share.value < 1.0:
        share.starving(True, now)
        now += WINDOW_S
        share.note(0, 0, now)
    assert share.steps_per_batch(now + BATCH_HOLD_S - 1) == 100
    assert share.steps_per_batch(now + BATCH_HOLD_S + 1) is None
