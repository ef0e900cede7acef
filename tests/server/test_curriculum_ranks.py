"""A curriculum on several ranks (server/curriculum.py): rank 0's decides, counting the measures the
other ranks hand it; the others serve its set under its seq."""

from __future__ import annotations

from tether.server.curriculum import Curriculum, CurriculumConfig

TABLE = {"measure": "return", "parameters": {"x": 1.0},
         "lessons": [{"threshold": 10.0, "min_episodes": 3}, {"values": {"x": 2.0}}]}


def curriculum() -> Curriculum:
    return Curriculum(CurriculumConfig.from_json(TABLE))


def test_rank_0_counts_other_ranks_measures_of_its_lesson_and_advances_on_them() -> None:
    leader = curriculum()
    assert not leader.note_forwarded([(0, 12.0), (1, 50.0), (0, float("nan"))])  # (another lesson's, NaN: left out)
    assert leader.counted_from_other_ranks == 1 and leader.lesson == 0
    assert leader.note_forwarded([(0, 11.0), (0, 13.0)]) and leader.lesson == 1 and leader.current.values == {"x": 2.0}


def test_a_follower_serves_rank_0s_set_under_its_seq_and_keeps_the_earlier_sets() -> None:
    leader, follower = curriculum(), curriculum()
    follower.follower = True
    first = follower.seq
    assert follower.adopt(leader.snapshot()) and follower.seq == leader.seq != first
    leader.note_forwarded([(0, 20.0)] * 3)
    assert follower.adopt(leader.snapshot()) and follower.lesson == 1 and follower.current.values == {"x": 2.0}
    assert follower.current.seq == leader.current.seq and follower.set_for(leader.seq - 1) is not None
    assert not follower.adopt(leader.snapshot()), "the same set again changes nothing"
    assert follower.summary()["episodes"] == 3 and follower.take_forwarded() == []


def test_a_restarted_follower_forgets_its_own_sets_and_knows_every_set_rank_0_keeps() -> None:
    leader, follower = curriculum(), curriculum()
    leader.set_param("x", 3.0), leader.set_param("x", 4.0)  # (two sets between two reports)
    follower.follower = True
    follower.seq = leader.seq - 1  # (its own resume set reuses a number rank 0 gave other values)
    follower._sets.append(follower._sets[-1].__class__(leader.seq - 1, 0, {"x": 99.0}))
    follower.adopt(leader.snapshot(), replace=True)
    for seq in (leader.seq - 2, leader.seq - 1, leader.seq):
        assert follower.set_for(seq).values == leader.set_for(seq).values
    assert follower.current.values == {"x": 4.0}
    leader.set_param("x", 5.0), leader.set_param("x", 6.0)
    follower.adopt(leader.snapshot())
    assert follower.set_for(leader.seq - 1).values == {"x": 5.0} and follower.current.values == {"x": 6.0}
