"""server/curriculum.py: the [curriculum] table's checks, lessons that advance on their measure, a
person's changes and their refusals, records checked against the set they name, SET_STATE's
env_params rule (§19.2) and the checkpoint's state."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tether.protocol.env_params import RecordEnvParams
from tether.protocol.errors import MessageError
from tether.server.config import ServerConfig
from tether.server.curriculum import Curriculum, CurriculumConfig, CurriculumError
from tether.server.metrics import FinishedEpisode
from tether.server.module_setup import build_layout
from tether.server.state_messages import env_params_for
from tether.server.trainer import Trainer

TABLE: dict[str, Any] = {
    "parameters": {"distance": 2, "wind": {"sampler": "uniform", "low": 0, "high": 1}},
    "bounds": {"distance": [1, 10]},
    "lessons": [{"name": "near", "threshold": 0.5, "min_episodes": 3},
                {"name": "middle", "values": {"distance": 4}, "threshold": 0.5, "min_episodes": 3},
                {"name": "far", "values": {"distance": 8}}],
}


def curriculum(**changes: Any) -> Curriculum:
    return Curriculum(CurriculumConfig.from_json({**TABLE, **changes}, ["walker", "other"]), first_seq=1)


def play(c: Curriculum, *returns: float, seq: int | None = None, measure: float | None = None,
         module: str = "walker", suspect: bool = False) -> bool:
    """Episodes of one agent of ``module`` with these returns, played with set ``seq`` (the current)."""
    advanced = False
    for i, ret in enumerate(returns):
        held = c.set_for(seq) if seq is not None else c.current
        values = {n: (v if not isinstance(v, dict) else v["low"]) for n, v in held.values.items()}
        episode = FinishedEpisode(total_return=ret, length=3, agents={"a": (module, ret)}, episode_id=f"e{i}",
                                  env_params=RecordEnvParams(held.seq, values, measure))
        advanced |= c.note([episode], suspect)
    return advanced


@pytest.mark.parametrize("change, message", [
    ({"colour": 1}, "unknown keys"),
    ({"measure": "wins"}, "measure"),
    ({"module": "nope"}, "not a module"),
    ({"parameters": {}}, "1 to 64"),
    ({"parameters": {"d": "far"}}, "must be a number"),
    ({"parameters": {"d": {"sampler": "uniform", "low": 2, "high": 1}}}, "above high"),
    ({"bounds": {"speed": [0, 1]}}, "not a parameter"),
    ({"bounds": {"distance": [3, 10]}}, "outside its bounds"),
    ({"lessons": [{"values": {"distance": 11}, "threshold": 1}, {}]}, "outside its bounds"),
    ({"lessons": [{"values": {"speed": 1}, "threshold": 1}, {}]}, "not a parameter"),
    ({"lessons": [{"min_episodes": 3}, {}]}, "threshold"),
    ({"lessons": [{"threshold": 1, "min_episodes": 0}, {}]}, "min_episodes"),
    ({"lessons": [{"threshold": 1}, {"threshold": 2}]}, "last lesson"),
    ({"parameters": {"distance": {"sampler": "gaussian", "mean": 2, "std": 1}}}, "gaussian can give any value"),
    ({"measure_range": [1, 0]}, "measure_range"),
])
def test_a_bad_table_is_refused_naming_what(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        curriculum(**change)


def test_a_lesson_advances_when_its_measure_holds_over_min_episodes() -> None:
    c = curriculum()
    assert (c.current.seq, c.current.lesson, c.current.values["distance"]) == (1, 0, 2.0)
    assert not play(c, 1.0, 1.0)  # two episodes: fewer than min_episodes
    assert not play(c, -1.0)  # three, mean 1/3 < 0.5
    assert not play(c, 1.0, 1.0)  # the last three: (-1, 1, 1), still 1/3
    assert play(c, 1.0)  # (1, 1, 1)
    assert (c.lesson, c.current.seq, c.current.values["distance"]) == (1, 2, 4.0)
    assert c.lesson_episodes == 0 and c.measure_mean is None
    # Episodes played with the old lesson's set no longer count.
    assert not play(c, 1.0, 1.0, 1.0, seq=1)
    assert c.lesson_episodes == 0
    assert play(c, 1.0, 1.0, 1.0)
    assert c.current.values == {"distance": 8.0, "wind": {"sampler": "uniform", "low": 0.0, "high": 1.0}}
    assert not play(c, 1.0, 1.0, 1.0)  # the last lesson never advances
    assert [cause for cause, _ in c.changes] == ["start", "lesson", "lesson"]


def test_the_window_is_the_last_min_episodes() -> None:
    c = curriculum()
    play(c, -1.0, -1.0, -1.0, 1.0, 1.0)
    assert c.lesson == 0 and c.measure_mean == pytest.approx(1 / 3)
    assert play(c, 1.0)


def test_a_huge_measure_is_clipped_to_the_range_and_a_suspect_clients_episodes_do_not_count() -> None:
    c = curriculum(measure="reported")
    assert play(c, 0.0, 0.0, measure=1e300) is False and play(c, 0.0, measure=-1.0)  # mean of 1e300s
    c = curriculum(measure="reported", measure_range=[-1, 1])
    assert not play(c, 0.0, 0.0, measure=1e300)  # clipped to 1 each
    assert not play(c, 0.0, measure=-1.0)  # (1 + 1 - 1) / 3 < 0.5
    assert not play(c, 0.0, 0.0, 0.0, measure=1.0, suspect=True) and c.lesson_episodes == 3
    assert play(c, 0.0, 0.0, 0.0, measure=1.0)


def test_every_agents_return_counts_those_that_left_early_too() -> None:
    c = curriculum()
    held = c.current
    values = {"distance": 2.0, "wind": 0.0}
    # Two agents: one left earlier with 0, the one at the end has 1: the episode's mean per agent is 0.5.
    episode = FinishedEpisode(total_return=1.0, length=3, agents={"b": ("walker", 1.0)}, agent_count=2,
                              episode_id="e", env_params=RecordEnvParams(held.seq, values))
    c.note([episode])
    assert c.measure_mean == 0.5


def test_a_runs_first_seq_is_drawn_and_a_resumed_run_publishes_the_next() -> None:
    config = CurriculumConfig.from_json(TABLE)
    a, b = Curriculum(config), Curriculum(config)
    assert a.current.seq != b.current.seq and 1 <= a.current.seq <= 2**30
    resumed = Curriculum(config)
    resumed.load_state(a.state())
    assert resumed.current.seq == a.current.seq + 1 and resumed.current.values == a.current.values
    # A value the new configuration's bounds refuse gives way to the configuration's own.
    a.set_param("distance", 9)
    narrower = Curriculum(CurriculumConfig.from_json({**TABLE, "bounds": {"distance": [1, 8]}}))
    narrower.load_state(a.state())
    assert narrower.current.values["distance"] == 2.0
    # A configuration without lessons resumes at lesson 0, with the values in force it still has.
    flat = Curriculum(CurriculumConfig.from_json({"parameters": {"distance": 3, "gap": 1}}))
    a.set_lesson(2)
    flat.load_state(a.state())
    assert flat.lesson == 0 and flat.current.lesson == 0 and flat.current.values == {"distance": 8.0, "gap": 1.0}


def test_the_measure_can_be_reported_or_one_modules_return() -> None:
    c = curriculum(measure="reported")
    assert not play(c, 1.0, 1.0, 1.0)  # no measure reported: nothing counts
    assert play(c, -5.0, -5.0, -5.0, measure=0.9)
    c = curriculum(module="walker")
    assert not play(c, 1.0, 1.0, 1.0, module="other")
    assert play(c, 1.0, 1.0, 1.0)


def test_a_person_changes_a_parameter_or_the_lesson_and_bad_changes_are_refused() -> None:
    c = curriculum()
    assert c.set_param("distance", 5) == 5.0 and c.current.values["distance"] == 5.0 and c.current.seq == 2
    c.set_param("wind", {"sampler": "gaussian", "mean": 0.5, "std": 0.1})
    for name, value, message in (("speed", 1, "no parameter"), ("distance", "far", "must be a number"),
                                 ("distance", True, "must be a number"), ("distance", 11, "outside its bounds"),
                                 ("distance", {"sampler": "uniform", "low": 0, "high": 3}, "outside its bounds"),
                                 ("wind", {"sampler": "beta"}, "sampler"), ("distance", float("nan"), "finite")):
        with pytest.raises(CurriculumError, match=message):
            c.set_param(name, value)
    assert c.current.seq == 3  # nothing refused made a set
    for lesson in (3, -1, "1", 1.0, True):
        with pytest.raises(CurriculumError, match="no lesson"):
            c.set_lesson(lesson)
    c.set_lesson(2)
    # A lesson's values replace a person's change.
    assert (c.lesson, c.current.seq, c.current.values["distance"]) == (2, 4, 8.0)
    assert [cause for cause, _ in c.changes] == ["start", "set_param", "set_param", "set_lesson"]


def test_records_are_checked_against_the_set_they_name() -> None:
    c = curriculum()
    c.check_record(RecordEnvParams(1, {"distance": 2.0, "wind": 0.5}), "episodes[0]")
    c.check_record(RecordEnvParams(99, {"anything": 1.0}), "episodes[0]")  # a set not kept: not checked
    c.check_record(None, "episodes[0]")
    with pytest.raises(MessageError, match=r"episodes\[0\].*'wind' = 1.5"):
        c.check_record(RecordEnvParams(1, {"distance": 2.0, "wind": 1.5}), "episodes[0]")
    with pytest.raises(MessageError, match="must have the values"):
        c.check_record(RecordEnvParams(1, {"distance": 2.0}), "episodes[0]")
    for _ in range(20):
        c.set_param("distance", 3)
    c.check_record(RecordEnvParams(1, {"distance": 7.0}), "episodes[0]")  # set 1 is no longer kept


def test_set_state_carries_the_set_only_to_a_client_that_asks_for_another() -> None:
    c = curriculum()
    assert env_params_for(None, 0) is None
    assert env_params_for(c, None) is None and env_params_for(c, True) is None and env_params_for(c, 1.0) is None
    assert env_params_for(c, 1) is None  # it holds the current set
    assert env_params_for(c, 0) == {"seq": 1, "lesson": 0, "values": c.current.values}
    assert env_params_for(c, 7)["seq"] == 1  # a set of another run: sent the current one


def test_a_resumed_curriculum_keeps_its_lesson_set_and_measure() -> None:
    c = curriculum()
    play(c, 1.0, 1.0, 1.0)
    c.set_param("distance", 6)
    play(c, 1.0, 1.0)
    resumed = curriculum()
    resumed.load_state(c.state())
    assert (resumed.lesson, resumed.current.seq, resumed.current.values) == (1, c.current.seq + 1, c.current.values)
    assert resumed.measure_mean == c.measure_mean and resumed.lesson_episodes == 2
    assert play(resumed, 1.0)
    short = curriculum(lessons=[{"threshold": 1, "min_episodes": 1}, {}])
    with pytest.raises(ValueError, match="lesson"):
        c.set_lesson(2)
        short.load_state(c.state())


def test_tensorboard_scalars_and_summary() -> None:
    c = curriculum()
    play(c, 1.0)
    scalars = c.scalars()
    assert scalars["curriculum/lesson"] == 0.0 and scalars["curriculum/param/distance"] == 2.0
    assert scalars["curriculum/param/wind"] == 0.5 and scalars["curriculum/measure"] == 1.0
    assert (scalars["curriculum/param_low/wind"], scalars["curriculum/param_high/wind"]) == (0.0, 1.0)
    c.set_param("wind", {"sampler": "uniform", "low": 0.4, "high": 0.6})  # the same centre, another spread
    assert c.scalars()["curriculum/param_low/wind"] == 0.4
    summary = c.summary()
    assert summary["lesson_name"] == "near" and summary["threshold"] == 0.5 and summary["episodes"] == 1
    assert summary["changes"][0]["cause"] == "start" and summary["changes"][0]["set_seq"] == 1


# -- in a server -------------------------------------------------------------------------------------

BOX = {"type": "Box", "shape": [2], "low": -1, "high": 1}


def server_config(tmp_path, **kw: Any) -> ServerConfig:
    return ServerConfig(observation_space=BOX, action_space={"type": "Discrete", "n": 2}, curriculum=TABLE,
                        logdir=str(tmp_path / "run"), seed=0, train_batch_size=64, env_steps_per_sample=16, **kw)


def record(env_params: dict | None, steps: int = 2, done: bool = True) -> dict:
    out: dict[str, Any] = {"obs": [[0.0, 0.0]] * (steps + 1), "actions": [0] * steps, "rewards": [1.0] * steps,
                           "action_logp": [-0.69] * steps, "is_terminated": done, "is_truncated": False,
                           "episode_id": "e1"}
    if env_params is not None:
        out["env_params"] = env_params
    return out


def test_a_server_refuses_a_record_whose_values_its_set_cannot_give_and_counts_the_rest(tmp_path) -> None:
    cfg = server_config(tmp_path)
    trainer = Trainer(cfg, build_layout(cfg))
    try:
        first = trainer.curriculum.current.seq  # (drawn: §19.1)
        good = {"seq": first, "values": {"distance": 2.0, "wind": 0.25}}
        for bad, message in (({**good, "values": {"distance": 3.0, "wind": 0.25}}, "'distance' = 3.0"),
                             ({**good, "values": {"distance": 2.0}}, "must have the values"),
                             ({**good, "measure": "high"}, "measure must be a number"),
                             ({"seq": "1", "values": {}}, "seq must be an integer")):
            with pytest.raises(MessageError) as info:
                trainer.ingest.validate("c", {"episodes": [record(good), record(bad)]})
            assert info.value.code.value == "INVALID_FIELD" and "episodes[1]" in info.value.message
            assert message in info.value.message and "env_params" in info.value.message
        pending = trainer.ingest.validate("c", {"episodes": [record(good)]})
        pending.commit()
        asyncio.run(trainer.submit("c", pending.records, {}, False))
        assert trainer.curriculum.episodes == 1 and trainer.curriculum.measure_mean == 2.0
        # A set the server does not keep (an earlier run's, say) is neither checked nor counted.
        pending = trainer.ingest.validate("c", {"episodes": [record({"seq": first + 50, "values": {"x": 1e305}})]})
        pending.commit()
        asyncio.run(trainer.submit("c", pending.records, {}, False))
        assert trainer.curriculum.episodes == 1
    finally:
        asyncio.run(trainer.close(checkpoint=False))


def test_a_reported_measure_reaches_the_lesson_through_the_server_and_a_bad_one_is_refused(tmp_path) -> None:
    cfg = server_config(tmp_path)
    cfg.curriculum = {**TABLE, "measure": "reported"}
    trainer = Trainer(cfg, build_layout(cfg))
    try:
        seq = trainer.curriculum.current.seq
        for bad in (1e301, float("nan"), float("inf"), True):
            with pytest.raises(MessageError, match="measure"):
                trainer.ingest.validate("c", {"episodes": [record({"seq": seq, "values": {"distance": 2.0, "wind": 0.5},
                                                                   "measure": bad})]})
        for i in range(3):  # (rewards of 1 a step: the return would be 2; the reported 0.75 is what counts)
            pending = trainer.ingest.validate("c", {"episodes": [record(
                {"seq": seq, "values": {"distance": 2.0, "wind": 0.5}, "measure": 0.75})]})
            pending.commit()
            asyncio.run(trainer.submit("c", pending.records, {}, False))
        assert trainer.curriculum.lesson == 1 and trainer.curriculum.changes[-1][1]["measure"] == 0.75
        assert trainer.curriculum.current.seq == seq + 1
    finally:
        asyncio.run(trainer.close(checkpoint=False))


def test_a_resumed_server_keeps_its_lesson_set_and_measure_and_changes_reach_tensorboard(tmp_path) -> None:
    cfg = server_config(tmp_path, tensorboard=True)
    trainer = Trainer(cfg, build_layout(cfg))
    try:
        trainer.curriculum.set_lesson(1)
        trainer.curriculum.set_param("distance", 6)
        trainer.curriculum_changed()
        state = trainer.curriculum.summary()
        path = trainer.save_checkpoint()
    finally:
        asyncio.run(trainer.close(checkpoint=False))
    events = b"".join(p.read_bytes() for p in (tmp_path / "run").glob("events.out.tfevents.*"))
    assert b"curriculum/lesson" in events and b"curriculum/param/distance" in events
    resumed_cfg = server_config(tmp_path / "again", resume=str(path))
    resumed = Trainer(resumed_cfg, build_layout(resumed_cfg))
    try:
        again = resumed.curriculum.summary()
        assert (again["lesson"], again["seq"], again["values"]) == (1, state["seq"] + 1, state["values"])
        assert again["values"]["distance"] == 6.0
        # The resumed set has a new seq: every client is sent it, whatever it held.
        assert env_params_for(resumed.curriculum, state["seq"])["seq"] == state["seq"] + 1
    finally:
        asyncio.run(resumed.close(checkpoint=False))
