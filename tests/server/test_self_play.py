"""Self-play's parts without a network: its options, the matches it draws on top of the policy
mapping, the ratings a game's team returns give, snapshots in the layout and in checkpoints."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from tether.protocol.errors import MessageError
from tether.server.config import ServerConfig
from tether.server.module_setup import build_layout
from tether.server.self_play import (
    MAX_OPEN_MATCHES_PER_OWNER, SelfPlay, SelfPlayConfig, SelfPlayConfigError, elo_expected, elo_update, snapshot_module_id,
)
from tether.server.state_messages import config_message
from tether.server.trainer import Trainer

BOX = {"type": "Box", "shape": [2], "low": -1, "high": 1}
TWO = {"type": "Discrete", "n": 2}


def two_seats(**options) -> SelfPlay:
    return SelfPlay(SelfPlayConfig.from_json({"teams": ["p1", "p2"], "window": 3, **options}), ["player"], seed=0)


def config(tmp_path, self_play: dict, modules: dict | None = None, rules: list | None = None, **kw) -> ServerConfig:
    return ServerConfig(
        modules=modules or {"player": {"observation_space": BOX, "action_space": TWO}},
        policy_mapping=rules or [{"pattern": "p*", "module": "player"}], self_play=self_play,
        logdir=str(tmp_path / "run"), tensorboard=False, seed=0, train_batch_size=64, env_steps_per_sample=16, **kw)


# -- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("table, names", [
    ({"teams": ["p1"]}, "teams"),
    ({"teams": "p*"}, "teams"),
    ({"teams": ["p1", "p1"]}, "twice"),
    ({"teams": ["p1", "p2"], "window": 0}, "window"),
    ({"teams": ["p1", "p2"], "window": 257}, "window"),
    ({"teams": ["p1", "p2"], "snapshot_every": 1.5}, "snapshot_every"),
    ({"teams": ["p1", "p2"], "latest_share": 1.0}, "latest_share"),
    ({"teams": ["p1", "p2"], "latest_share": float("nan")}, "latest_share"),
    ({"teams": ["p1", "p2"], "sampling": "greedy"}, "sampling"),
    ({"teams": ["p1", "p2"], "elo_k": 0}, "elo_k"),
    ({"teams": ["p1", "p2"], "outcome": "winner"}, "outcome"),
    ({"teams": ["p1", "p2"], "opponents": 3}, "unknown option"),
    (["p1", "p2"], "table"),
])
def test_bad_options_are_refused_by_name(table, names) -> None:
    with pytest.raises(SelfPlayConfigError, match=names):
        SelfPlayConfig.from_json(table)


def test_the_layout_adds_frozen_snapshot_modules_and_the_server_maps(tmp_path) -> None:
    layout = build_layout(config(tmp_path, {"teams": ["p1", "p2"], "window": 2}))
    assert list(layout.specs) == ["player", "player@0", "player@1"]
    snapshot = layout.specs["player@1"]
    assert not snapshot.trainable and snapshot.snapshot_of == "player"
    assert snapshot.observation_space == layout.specs["player"].observation_space
    assert layout.trainable == ["player"]
    trainer = Trainer(config(tmp_path, {"teams": ["p1", "p2"], "window": 2}), layout)
    try:
        message = config_message(trainer)
        # Clients cannot draw the opponents: they ask (MAP_AGENTS, §9.5), and see the snapshots as modules.
        assert message["policy_mapping"] is None
        assert message["modules"]["player@0"]["snapshot_of"] == "player"
        assert message["modules"]["player@0"]["trainable"] is False
        assert message["policies_to_train"] == ["player"]
        json.dumps(message)
    finally:
        asyncio.run(trainer.close(checkpoint=False))


def test_by_default_only_modules_of_team_agents_keep_snapshots(tmp_path) -> None:
    modules = {"scout": {"observation_space": BOX, "action_space": TWO},
               "lifter": {"observation_space": BOX, "action_space": TWO}}
    rules = [{"pattern": "scout_*", "module": "scout"}, {"agent_id": "pair", "module": "lifter"}]
    layout = build_layout(config(tmp_path, {"teams": ["scout_0", "scout_1"], "window": 2}, modules=modules,
                                 rules=rules))
    assert layout.self_play.modules == ("scout",) and "lifter@0" not in layout.specs


@pytest.mark.parametrize("self_play, rules, modules, names", [
    ({"teams": ["p1", "p2"], "modules": ["ghost"]}, None, None, "ghost"),
    ({"teams": ["p1", "p2"], "modules": ["frozen"]}, [{"pattern": "p*", "module": "frozen"}],
     {"frozen": {"observation_space": BOX, "action_space": TWO, "trainable": False}}, "not trained"),
    ({"teams": ["p1", "p2"]}, None, {"player": {"observation_space": BOX, "action_space": TWO},
                                      "player@0": {"observation_space": BOX, "action_space": TWO}}, "clashes"),
])
def test_layouts_self_play_cannot_run_are_refused(tmp_path, self_play, rules, modules, names) -> None:
    with pytest.raises(ValueError, match=names):
        build_layout(config(tmp_path, self_play, modules=modules, rules=rules))


def test_self_play_needs_rules_not_a_mapping_function(tmp_path) -> None:
    with pytest.raises(ValueError, match="policy_mapping rules"):
        build_layout(config(tmp_path, {"teams": ["p1", "p2"]}), mapping_fn=lambda agent, episode: "player")


# -- matches ---------------------------------------------------------------------------------------


def test_one_seat_learns_and_the_other_plays_one_opponent_per_episode() -> None:
    play = two_seats(latest_share=0.0)
    play.take("player", 0)
    play.take("player", 5)
    seen_learning = set()
    for episode in range(200):
        modules = {seat: play.module_for("conn", f"e{episode}", seat, "player") for seat in ("p1", "p2")}
        learners = [seat for seat, m in modules.items() if m == "player"]
        assert len(learners) == 1, modules  # (latest_share 0: the other seat always plays a snapshot)
        seen_learning.add(learners[0])
        other = modules["p2" if learners[0] == "p1" else "p1"]
        assert other in ("player@0", "player@1")
        # Asked again within the episode: the same answer.
        assert play.module_for("conn", f"e{episode}", "p1", "player") == modules["p1"]
        assert play.module_for("conn", f"e{episode}", "p2", "player") == modules["p2"]
    assert seen_learning == {"p1", "p2"}
    # Agents of no team, and modules without snapshots, map as the rules say.
    assert play.module_for("conn", "e0", "referee", "player") == "player"
    assert play.module_for("conn", "e0", "p1", "other") == "other"


def test_latest_share_of_games_are_against_the_latest_policy() -> None:
    play = two_seats(latest_share=0.3)
    play.take("player", 0)
    latest = 0
    for episode in range(2000):
        modules = {play.module_for("c", str(episode), seat, "player") for seat in ("p1", "p2")}
        latest += modules == {"player"}
    assert 0.25 < latest / 2000 < 0.35, latest


def test_before_any_snapshot_the_latest_policy_plays_both_seats() -> None:
    play = two_seats(latest_share=0.0)
    assert {play.module_for("c", "e", seat, "player") for seat in ("p1", "p2")} == {"player"}


def test_an_asymmetric_game_puts_each_team_on_its_own_modules_snapshots() -> None:
    play = SelfPlay(SelfPlayConfig.from_json({"teams": ["adversary_*", "agent_*"], "latest_share": 0.0}),
                    ["chaser", "runner"], seed=1)
    play.take("chaser", 0)
    play.take("runner", 0)
    sides = set()
    for episode in range(100):
        chasers = {play.module_for("c", str(episode), f"adversary_{i}", "chaser") for i in range(3)}
        runner = play.module_for("c", str(episode), "agent_0", "runner")
        assert len(chasers) == 1  # one opponent per team and episode
        sides.add((chasers.pop(), runner))
    assert sides == {("chaser", "runner@0"), ("chaser@0", "runner")}


def test_prioritized_sampling_draws_the_snapshots_that_beat_the_learner_most() -> None:
    play = two_seats(latest_share=0.0, sampling="prioritized")
    play.take("player", 0)
    play.take("player", 5)
    strong, weak = play.snapshots["player"][1], play.snapshots["player"][0]
    strong.games, strong.score_against_learner = 50, 40.0
    weak.games, weak.score_against_learner = 50, 5.0
    drawn = {"player@0": 0, "player@1": 0}
    for episode in range(2000):
        for seat in ("p1", "p2"):
            module = play.module_for("c", str(episode), seat, "player")
            if module != "player":
                drawn[module] += 1
    # Weights (40.5/51)^2 against (5.5/51)^2: about 98% of the games against the strong one.
    assert drawn["player@1"] > 20 * drawn["player@0"] > 0, drawn


def test_open_matches_are_bounded_per_owner_and_forgotten_with_it() -> None:
    play = two_seats()
    play.take("player", 0)
    play.module_for("c2", "x", "p1", "player")
    for episode in range(MAX_OPEN_MATCHES_PER_OWNER + 10):
        play.module_for("c1", str(episode), "p1", "player")
    # One owner's episodes that never end drop its own oldest, never another owner's.
    assert play.open_matches() == MAX_OPEN_MATCHES_PER_OWNER + 1
    play.forget("c1")
    assert play.open_matches() == 1


# -- ratings ---------------------------------------------------------------------------------------


def test_elo_formula() -> None:
    assert elo_expected(1200, 1200) == 0.5
    assert math.isclose(elo_expected(1400, 1200), 1 / (1 + 10 ** (-0.5)))
    won = elo_update(1200, 1200, 1.0, 16)
    assert won == (1208.0, 1192.0)
    drawn = elo_update(1400, 1200, 0.5, 32)
    assert math.isclose(drawn[0], 1400 + 32 * (0.5 - elo_expected(1400, 1200)))
    assert math.isclose(sum(drawn), 2600)  # zero-sum


def learner_and_opponent(play: SelfPlay, episode: str) -> tuple[str, str]:
    modules = {seat: play.module_for("c", episode, seat, "player") for seat in ("p1", "p2")}
    learner = next(seat for seat, m in modules.items() if m == "player")
    return learner, ("p2" if learner == "p1" else "p1")


def test_team_returns_decide_the_game_and_rate_learner_and_snapshot() -> None:
    play = two_seats(latest_share=0.0)
    slot = play.take("player", 0)
    learner, opponent = learner_and_opponent(play, "e1")
    # The learner's seat leaves first (its own flag), the episode ends with the other seat.
    play.episode_part("c", "e1", {learner: ("player", 1.0)}, ended=False)
    assert play.ratings["player"] == 1200.0
    play.episode_part("c", "e1", {opponent: (slot, -1.0)}, ended=True)
    assert play.ratings["player"] == 1208.0 and play.snapshots["player"][0].rating == 1192.0
    assert play.snapshots["player"][0].games == 1 and play.snapshots["player"][0].score_against_learner == 0.0
    assert play.games_rated == 1 and play.open_matches() == 0
    # A draw moves the ratings toward each other; a loss counts for the snapshot.
    learner, opponent = learner_and_opponent(play, "e2")
    play.episode_part("c", "e2", {learner: ("player", 0.0), opponent: (slot, 0.0)}, ended=True)
    assert 1200 < play.ratings["player"] < 1208.0
    learner, opponent = learner_and_opponent(play, "e3")
    play.episode_part("c", "e3", {learner: ("player", -1.0), opponent: (slot, 1.0)}, ended=True)
    assert play.snapshots["player"][0].score_against_learner == 1.5 and play.snapshots["player"][0].games == 3


def test_games_against_the_latest_policy_and_unknown_episodes_are_not_rated() -> None:
    play = two_seats(latest_share=0.0)
    play.episode_part("c", "nobody-asked", {"p1": ("player", 1.0), "p2": ("player", -1.0)}, ended=True)
    # No snapshot yet: both seats are the latest policy.
    assert {play.module_for("c", "e", seat, "player") for seat in ("p1", "p2")} == {"player"}
    play.episode_part("c", "e", {"p1": ("player", 1.0), "p2": ("player", -1.0)}, ended=True)
    assert play.ratings["player"] == 1200.0 and play.games_rated == 0 and play.games_latest == 1


def test_a_non_finite_return_rates_nothing() -> None:
    play = two_seats(latest_share=0.0)
    slot = play.take("player", 0)
    learner, opponent = learner_and_opponent(play, "e")
    play.episode_part("c", "e", {learner: ("player", math.inf), opponent: (slot, 0.0)}, ended=True)
    assert play.ratings["player"] == 1200.0 and play.games_rated == 0


def test_snapshots_fill_a_ring_and_keep_the_rating_they_were_taken_with() -> None:
    play = two_seats()
    assert [play.updated("player") for _ in range(20)].count(True) == 2  # snapshot_every 10
    for version in range(4):
        play.ratings["player"] = 1200.0 + version
        assert play.take("player", version) == snapshot_module_id("player", version % 3)
    assert [s.version for s in play.snapshots["player"]] == [3, 1, 2]
    assert [s.rating for s in play.snapshots["player"]] == [1203.0, 1201.0, 1202.0]
    assert not play.updated("not-a-self-play-module")


def test_state_round_trips_and_a_smaller_window_is_refused() -> None:
    play = two_seats(latest_share=0.0)
    slot = play.take("player", 0)
    learner, opponent = learner_and_opponent(play, "e")
    play.episode_part("c", "e", {learner: ("player", 1.0), opponent: (slot, -1.0)}, ended=True)
    again = two_seats()
    again.load_state(json.loads(json.dumps(play.state())))  # (plain values: a checkpoint loads them safely)
    assert again.summary() == play.summary()
    assert again.next_slot_id("player") == "player@1"
    with pytest.raises(ValueError, match="window"):
        SelfPlay(SelfPlayConfig.from_json({"teams": ["p1", "p2"], "window": 2}), ["player"]).load_state(
            {**play.state(), "snapshots": {"player": [None, None, None]}})


def test_a_resumed_run_keeps_its_snapshots_weights_and_ratings(tmp_path) -> None:
    cfg = config(tmp_path, {"teams": ["p1", "p2"], "window": 2})
    trainer = Trainer(cfg, build_layout(cfg))
    try:
        assert trainer.self_play.holds("player@0") and not trainer.self_play.holds("player@1")
        assert trainer.modules["player@0"].weights_seq_no == 1  # the untrained policy, served
        trainer.self_play.ratings["player"] = 1333.0
        for p in trainer.modules["player"].learner.model.parameters():
            p.data.add_(0.5)  # (as an update would)
        trainer.modules["player@1"].publish(trainer.modules["player@1"].copy_policy(trainer.modules["player"]))
        trainer.self_play.take("player", 7)
        trainer.self_play.take("player", 8)  # (the ring: slot 0 again)
        path = trainer.save_checkpoint()
    finally:
        asyncio.run(trainer.close(checkpoint=False))
    resumed_cfg = config(tmp_path / "again", {"teams": ["p1", "p2"], "window": 2}, resume=str(path))
    resumed = Trainer(resumed_cfg, build_layout(resumed_cfg))
    try:
        assert resumed.self_play.summary() == {
            **resumed.self_play.summary(), "modules": {"player": {
                "rating": 1333.0, "updates": 0, "snapshots": [
                    {"slot": 0, "version": 8, "rating": 1333.0, "games": 0, "score_against_learner": 0.0},
                    {"slot": 1, "version": 7, "rating": 1333.0, "games": 0, "score_against_learner": 0.0}]}}}
        saved = dict(resumed.modules["player@1"].learner.model.state_dict())
        trained = dict(resumed.modules["player"].learner.model.state_dict())
        assert all((saved[k] == trained[k]).all() for k in trained)
        assert resumed.modules["player@1"].weights_seq_no == 1
    finally:
        asyncio.run(resumed.close(checkpoint=False))


def entry(module: str) -> dict:
    return {"module": module, "start_step": 0, "obs": [[0.0, 0.0]] * 3, "actions": [0, 1], "rewards": [0.0, 1.0],
            "action_logp": [-0.7, -0.7], "is_terminated": False, "is_truncated": False}


def test_a_seat_in_a_record_must_be_on_the_module_the_server_drew_for_it(tmp_path) -> None:
    """The records' path gives the answers MAP_AGENTS gave on the connection; a client that reports
    a seat on another module (the learner's seat as a snapshot) is refused, MODULE_MISMATCH."""
    cfg = config(tmp_path, {"teams": ["p1", "p2"], "window": 2, "latest_share": 0.0})
    trainer = Trainer(cfg, build_layout(cfg))
    try:
        answer = trainer.ingest.assign("conn", {"episode_id": "e", "agent_ids": ["p1", "p2"]})
        assert sorted(answer.values()) == ["player", "player@0"]
        learner = next(a for a, m in answer.items() if m == "player")
        opponent = next(a for a in answer if a != learner)
        wrong = {"episodes": [{"episode_id": "e", "is_terminated": False, "is_truncated": False,
                               "agents": {learner: entry("player@0"), opponent: entry("player@0")}}]}
        with pytest.raises(MessageError) as info:
            trainer.ingest.validate("owner", wrong, via="conn")
        assert info.value.code.value == "MODULE_MISMATCH" and learner in info.value.message
        right = {"episodes": [{"episode_id": "e", "is_terminated": False, "is_truncated": False,
                               "agents": {learner: entry("player"), opponent: entry("player@0")}}]}
        assert len(trainer.ingest.validate("owner", right, via="conn").records) == 1
    finally:
        asyncio.run(trainer.close(checkpoint=False))


def test_the_sign_rule_reads_the_learning_teams_own_return() -> None:
    """Asymmetric sides rewarded on different scales (chasers +10 per catch, a runner penalised):
    with outcome "sign" the learner's own return decides, not the comparison with the other side's."""
    for rule, expected in (("higher_return", 1.0), ("sign", 0.0)):
        play = two_seats(latest_share=0.0, outcome=rule, draw_margin=0.5)
        slot = play.take("player", 0)
        learner, opponent = learner_and_opponent(play, "e")
        play.episode_part("c", "e", {learner: ("player", -3.0), opponent: (slot, -20.0)}, ended=True)
        assert play.snapshots["player"][0].score_against_learner == 1.0 - expected, rule
    play = two_seats(latest_share=0.0, outcome="sign", draw_margin=0.5)
    slot = play.take("player", 0)
    learner, opponent = learner_and_opponent(play, "e")
    play.episode_part("c", "e", {learner: ("player", 0.4), opponent: (slot, 9.0)}, ended=True)
    assert play.snapshots["player"][0].score_against_learner == 0.5  # within the margin: a draw


def test_a_game_is_rated_only_against_the_snapshot_drawn_for_it() -> None:
    play = SelfPlay(SelfPlayConfig.from_json({"teams": ["p1", "p2"], "window": 1, "latest_share": 0.0}), ["player"])
    slot = play.take("player", 0)
    learner, opponent = learner_and_opponent(play, "e")
    play.take("player", 50)  # the window of one: slot 0 now holds a newer snapshot
    play.episode_part("c", "e", {learner: ("player", 1.0), opponent: (slot, -1.0)}, ended=True)
    assert play.snapshots["player"][0].games == 0 and play.ratings["player"] == 1200.0 and play.games_rated == 0


def test_three_teams_rate_the_learner_against_each_snapshot_it_met() -> None:
    play = SelfPlay(SelfPlayConfig.from_json({"teams": ["a", "b", "c"], "latest_share": 0.0}), ["player"], seed=3)
    slot = play.take("player", 0)
    for episode in range(30):
        modules = {seat: play.module_for("c", str(episode), seat, "player") for seat in "abc"}
        learner = next(seat for seat, m in modules.items() if m == "player")
        assert sorted(modules.values()) == ["player", slot, slot]
        returns = {seat: (m, 1.0 if seat == learner else 0.0) for seat, m in modules.items()}
        play.episode_part("c", str(episode), returns, ended=True)
    assert play.snapshots["player"][0].games == 60 and play.snapshots["player"][0].score_against_learner == 0.0


def records(episode: str, modules: dict[str, str], done: bool = False) -> dict:
    return {"episodes": [{"episode_id": episode, "is_terminated": done, "is_truncated": False,
                          "agents": {agent: entry(module) for agent, module in modules.items()}}]}


def test_an_episode_continued_on_another_connection_keeps_its_match_and_is_rated(tmp_path) -> None:
    """MAP_AGENTS is answered on a connection; the episode's records carry the client_session (the
    owner). After a reconnect the continuation comes on another connection: the same modules are
    accepted, none drawn again, and the game is rated when it ends."""
    cfg = config(tmp_path, {"teams": ["p1", "p2"], "window": 2, "latest_share": 0.0})
    trainer = Trainer(cfg, build_layout(cfg))
    try:
        ingest, owner = trainer.ingest, ("client_session", "s-1")
        for episode in range(20):  # (the draw would differ about half the time)
            e = f"e{episode}"
            answer = ingest.assign("conn1", {"episode_id": e, "agent_ids": ["p1", "p2"]})
            ingest.validate(owner, records(e, answer), via="conn1").commit()
            ingest.forget("conn1")  # the connection closes; the session lives on
            pending = ingest.validate(owner, records(e, answer, done=True), via="conn2")
            pending.commit()
            trainer.self_play.episode_part(owner, e, {a: (m, 1.0 if m == "player" else -1.0)
                                                      for a, m in answer.items()}, ended=True)
        assert trainer.self_play.games_rated == 20 and trainer.self_play.open_matches() == 0
        assert ingest.open_state_size() == 0  # nothing kept for ended episodes, owner's or connection's
    finally:
        asyncio.run(trainer.close(checkpoint=False))


def test_records_of_an_episode_nothing_was_drawn_for_stand_if_self_play_could_have_drawn_them(tmp_path) -> None:
    """A continuation after a server restart: no draw is known. A seat on a held snapshot of its
    module is accepted (and the game rated from then on); an empty slot is refused, as is a seat
    of no team on a snapshot."""
    cfg = config(tmp_path, {"teams": ["p1", "p2"], "window": 2, "latest_share": 0.0},
                 rules=[{"pattern": "*", "module": "player"}])
    trainer = Trainer(cfg, build_layout(cfg))
    try:
        ingest = trainer.ingest
        ingest.validate("sess", records("e", {"p1": "player", "p2": "player@0"}), via="conn").commit()
        assert trainer.self_play.open_matches() == 1
        for bad in ({"p1": "player", "p2": "player@1"}, {"referee": "player@0"}):
            with pytest.raises(MessageError) as info:
                ingest.validate("sess", records("f", bad), via="conn")
            assert info.value.code.value == "MODULE_MISMATCH"
        assert trainer.self_play.open_matches() == 1  # refused messages leave no match behind
        trainer.self_play.episode_part("sess", "e", {"p1": ("player", 1.0), "p2": ("player@0", -1.0)}, ended=True)
        assert trainer.self_play.games_rated == 1
    finally:
        asyncio.run(trainer.close(checkpoint=False))


def test_resuming_a_run_without_self_play_snapshots_the_resumed_policy_and_other_teams_are_refused(tmp_path) -> None:
    plain = ServerConfig(modules={"player": {"observation_space": BOX, "action_space": TWO}},
                         policy_mapping=[{"pattern": "p*", "module": "player"}], logdir=str(tmp_path / "plain"),
                         tensorboard=False, seed=0)
    trainer = Trainer(plain, build_layout(plain))
    for p in trainer.modules["player"].learner.model.parameters():
        p.data.add_(0.25)
    path = trainer.save_checkpoint()
    asyncio.run(trainer.close(checkpoint=False))
    cfg = config(tmp_path / "sp", {"teams": ["p1", "p2"], "window": 2}, resume=str(path))
    resumed = Trainer(cfg, build_layout(cfg))
    try:
        snapshot = resumed.modules["player@0"].learner.model.state_dict()
        policy = resumed.modules["player"].learner.model.state_dict()
        assert all((snapshot[k] == policy[k]).all() for k in policy)  # not the untrained network
        own = resumed.save_checkpoint()
    finally:
        asyncio.run(resumed.close(checkpoint=False))
    other = config(tmp_path / "other", {"teams": ["p1", "p2", "p3"], "window": 2}, resume=str(own))
    with pytest.raises(ValueError, match="teams"):
        Trainer(other, build_layout(other))
