"""A client whose data makes an update non-finite loses its own data, not its
neighbours': the learner leaves it out (by a screen of the value targets, or by
trial updates that are rolled back), the trainer publishes the update on the
rest, strikes the client and, after three strikes, refuses its episodes with
DATA_REFUSED; its returns never reach the metrics."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest
import torch

from tether.protocol import Discrete, EpisodeChunk
from tether.protocol.errors import ErrorCode, MessageError
from tether.protocol.multi_agent import AgentChunk, MultiAgentRecord
from tether.protocol.spaces import box
from tether.server.config import ServerConfig
from tether.server.ingest.batch_dedup import BatchId
from tether.server.learner import PPOHyperparams, PPOLearner, build_batch, update_isolating
from tether.server.learner.isolation import trial_budget
from tether.server.module_setup import build_layout
from tether.server.trainer import Trainer

LOGP = float(np.log(0.5))


def chunks(n: int, seed: int, steps: int = 4, reward: float | None = None, logp: float = LOGP,
           obs_dim: int = 3) -> list[EpisodeChunk]:
    """Terminated episodes of random observations and actions; rewards random unless given."""
    rng = np.random.default_rng(seed)
    return [EpisodeChunk(obs=rng.normal(size=(steps + 1, obs_dim)).astype(np.float32),
                         actions=rng.integers(2, size=steps),
                         rewards=(np.full(steps, reward, np.float32) if reward is not None
                                  else rng.normal(size=steps).astype(np.float32)),
                         action_logp=np.full(steps, logp, np.float32), action_dist_inputs=None,
                         is_terminated=True, is_truncated=False) for _ in range(n)]


def learner(seed: int = 0) -> PPOLearner:
    return PPOLearner(box(-5, 5, (3,)), Discrete(2), PPOHyperparams(lr=1e-3, minibatch_size=64, num_epochs=2),
                      seed=seed)


def interleave(*groups: tuple[str, list[EpisodeChunk]]) -> list[tuple[str, EpisodeChunk]]:
    """Sources' chunks interleaved, as messages of several clients arrive in the pool."""
    out, longest = [], max(len(c) for _, c in groups)
    for i in range(longest):
        out += [(source, c[i]) for source, c in groups if i < len(c)]
    return out


def weights(l: PPOLearner) -> list[torch.Tensor]:
    return [t.detach().clone() for t in l.model.state_dict().values()]


def test_a_source_whose_value_targets_overflow_is_left_out_without_a_trial() -> None:
    honest = chunks(40, seed=1)
    items = interleave(("honest", honest), ("evil", chunks(10, seed=2, reward=3e38)),
                       ("evil-1e20", chunks(10, seed=3, reward=1e20)))
    l = learner()
    out = update_isolating(l, items)
    assert out.stats is not None and out.kept == ["honest"] and set(out.guilty) == {"evil", "evil-1e20"}
    assert out.trials == 1  # the screen needs no trial update
    # The same as training on the honest data alone.
    alone = learner()
    alone.update(build_batch(honest))
    assert all(torch.equal(a, b) for a, b in zip(weights(l), weights(alone)))


def test_trial_updates_find_a_source_the_screen_cannot_see() -> None:
    # Behaviour logp of -1000 (a server without the logp check takes it): the importance
    # ratios overflow, though every value target is fine.
    groups = [(f"c{i}", chunks(6, seed=10 + i)) for i in range(7)]
    groups.insert(5, ("evil", chunks(6, seed=99, logp=-1000.0)))
    l = learner()
    items = interleave(*groups)
    out = update_isolating(l, items)
    assert out.stats is not None and set(out.guilty) == {"evil"}
    assert out.kept == [s for s, _ in groups if s != "evil"]
    assert 1 < out.trials <= trial_budget(8) == 11
    assert all(torch.isfinite(p).all() for p in l.model.parameters())
    # The trials were rolled back: the weights are those of one update on the others' data.
    alone = learner()
    alone.update(build_batch([c for s, c in items if s != "evil"]))
    assert all(torch.equal(a, b) for a, b in zip(weights(l), weights(alone)))


def test_two_bad_sources_among_many() -> None:
    groups = [(f"c{i}", chunks(4, seed=20 + i)) for i in range(6)]
    groups[1] = ("evil-a", chunks(4, seed=31, logp=-1000.0))
    groups[4] = ("evil-b", chunks(4, seed=32, logp=-1000.0))
    out = update_isolating(learner(), interleave(*groups))
    assert out.stats is not None and set(out.guilty) == {"evil-a", "evil-b"}
    assert out.trials <= trial_budget(6)


def test_no_one_is_blamed_when_nothing_trains() -> None:
    # One client only: its update fails, but nothing shows the fault is its data and not the learner.
    l = learner()
    before = weights(l)
    out = update_isolating(l, [("only", c) for c in chunks(10, seed=5, logp=-1000.0)])
    assert out.stats is None and out.guilty == {} and out.kept == []
    assert all(torch.equal(a, b) for a, b in zip(before, weights(l)))


# -- the trainer -----------------------------------------------------------------------------------


def record(steps: int, reward: float, seed: int) -> MultiAgentRecord:
    rng = np.random.default_rng(seed)
    chunk = EpisodeChunk(obs=rng.normal(scale=0.05, size=(steps + 1, 4)).astype(np.float32),
                         actions=rng.integers(2, size=steps), rewards=np.full(steps, reward, np.float32),
                         action_logp=np.full(steps, LOGP, np.float32), action_dist_inputs=None,
                         is_terminated=True, is_truncated=False, episode_id=f"e{seed}")
    return MultiAgentRecord(f"e{seed}", True, False, [AgentChunk("default_agent", "default_policy", 0, chunk)])


async def poisoned_rounds(tmp_path) -> dict:
    config = ServerConfig(port=0, train_batch_size=200, minibatch_size=64, num_epochs=2, tensorboard=False,
                          quiet=True, logdir=str(tmp_path), seed=0)
    trainer = Trainer(config, build_layout(config))
    honest, evil = "honest-conn", ("client_session", "evil")
    sources = {honest: "#1 honest", evil: "#2 evil"}
    seq = {"default_policy": 0}
    sent = {"honest": 0, "evil": 0}
    refused_at = None
    for round_ in range(5):
        seq = {"default_policy": trainer.weights_seq_no}
        try:
            await trainer.submit(evil, [record(10, 3e38, 1000 + round_)], seq, False, source=sources[evil])
            sent["evil"] += 10
        except MessageError as exc:
            assert exc.code is ErrorCode.DATA_REFUSED, exc
            refused_at = refused_at if refused_at is not None else round_
        for i in range(10):  # 200 honest steps: this round's update starts
            await trainer.submit(honest, [record(20, 1.0, 100 * round_ + i)], seq, False, source=sources[honest])
            sent["honest"] += 20
        if trainer.learner_loop.running is not None:
            await trainer.learner_loop.running
    # A new connection of the same client_session is refused too.
    with pytest.raises(MessageError) as info:
        await trainer.submit(evil, [record(10, 1.0, 7)], seq, False, source="#3 evil again")
    m = trainer.metrics
    out = {"sent": sent, "refused_at": refused_at, "code": info.value.code, "updates": m.updates,
           "discarded": m.updates_discarded, "trained": m.agent_steps_trained, "isolated": m.agent_steps_isolated,
           "updates_isolated": m.updates_isolated, "returns": list(m.returns), "excluded": m.episodes_excluded,
           "clients_refused": m.clients_refused, "pool": trainer.pool_steps}
    await trainer.close(checkpoint=False)
    return out


def test_the_trainer_trains_the_neighbours_and_refuses_the_poisoner(tmp_path) -> None:
    out = asyncio.run(poisoned_rounds(tmp_path))
    # Every round published an update on the honest steps; none was discarded.
    assert out["updates"] == 5 and out["discarded"] == 0, out
    assert out["trained"] + out["pool"] == out["sent"]["honest"] == 1000 and out["pool"] < 200, out
    assert out["isolated"] == out["sent"]["evil"] == 30 and out["updates_isolated"] == 3, out
    # Three strikes, then DATA_REFUSED: nothing more of it stored.
    assert out["refused_at"] == 3 and out["code"] is ErrorCode.DATA_REFUSED, out
    assert out["clients_refused"] >= 1
    # Only honest returns (20 per episode) in the window; the poisoner's episodes are counted as excluded.
    assert out["returns"] and set(out["returns"]) == {20.0} and out["excluded"] == 3, out


def test_a_non_finite_step_stays_in_its_own_chunk() -> None:
    """GAE restarts at every chunk's end, so a poisoned chunk cannot make its neighbours look poisoned."""
    from tether.server.learner.gae import compute_gae

    rewards = np.array([1.0, 1.0, np.inf, 1.0], np.float32)
    ends = np.array([False, True, False, True])
    with np.errstate(invalid="ignore", over="ignore"):
        adv, _ = compute_gae(rewards, np.zeros(4, np.float32), np.zeros(4, np.float32), ends, ends, 0.99, 0.95)
    assert np.isfinite(adv[:2]).all() and not np.isfinite(adv[2])


def test_strikes_count_within_their_window_and_refusal_covers_the_session() -> None:
    from tether.server.data_guard import DataGuard

    guard = DataGuard(strikes_to_refuse=3, window_updates=10)
    session = ("client_session", "s")
    guard.note(session, "#1 a")
    for _ in range(2):
        guard.tick()
        assert guard.strike(["#1 a"]) == []
    assert guard.is_suspect("other", "#1 a") and guard.is_suspect(session, "#9 new connection")
    for _ in range(10):  # the two strikes leave the window
        guard.tick()
    assert not guard.is_suspect(session, "#9 new connection")
    for i in range(3):
        guard.tick()
        assert guard.strike(["#1 a"]) == ([] if i < 2 else ["#1 a"])
    with pytest.raises(MessageError) as info:
        guard.check(session, "#9 new connection")  # the same client_session on a new connection
    assert info.value.code is ErrorCode.DATA_REFUSED
    guard.check("c", "#2 someone else")  # others are not affected


def test_the_ranks_count_each_others_strikes_against_a_client_session_once_per_update() -> None:
    """Several ranks (docs/scale-out.md): a client that spreads its poisoned data over the ranks is refused
    when the group's strikes reach the limit, as by one server; a strike the same update made on two ranks
    counts once, and strikes against a rank's connection names stay that rank's."""
    from tether.server.data_guard import DataGuard

    ranks = [DataGuard(strikes_to_refuse=3, window_updates=10) for _ in range(2)]
    bad, twice = ("client_session", "bad"), ("client_session", "twice")
    ranks[0].note(bad, "#1 a")
    ranks[1].note(bad, "#4 a")
    for rank in ranks:
        rank.note(twice, "#2 b")

    def agree() -> list[list[tuple]]:
        told = [rank.take_untold() for rank in ranks]
        return [ranks[me].adopt(told[1 - me]) for me in range(2)]

    struck = {1: [(0, "#1 a"), (0, "#2 b"), (1, "#2 b")], 2: [(0, "#1 a")], 3: [(1, "#4 a"), (0, "#2 b")]}
    for update in (1, 2, 3):
        for rank in ranks:
            rank.tick()
        for me, source in struck[update]:
            # Rank 1's one strike is the group's third against bad: it refuses at once, knowing rank 0's two.
            assert ranks[me].strike([source]) == (["#4 a"] if source == "#4 a" else []), (update, me, source)
        assert ranks[0].untold, "strikes against a client_session are told"
        newly = agree()  # rank 0 refuses bad at the agreement that tells it
        assert newly == ([[bad], []] if update == 3 else [[], []]), (update, newly)
    for rank in ranks:
        with pytest.raises(MessageError):
            rank.check(bad, "#9 a reconnect")
        rank.check(twice, "#9 b")  # two updates' strikes, the first made on both ranks: two, not three
        assert rank.is_suspect(twice, "#9 b") and rank.untold == 0
    # A connection's name is a rank's own: its strikes are not told.
    ranks[0].tick()
    ranks[0].strike(["#7 no session"])
    assert ranks[0].untold == 0


def test_a_refused_client_session_stays_refused_after_a_resume(tmp_path) -> None:
    """The checkpoint keeps the client_sessions refused (not connections, nor strikes short of a refusal):
    a resumed run refuses the session at once, on any connection."""
    async def run() -> None:
        config = ServerConfig(tensorboard=False, logdir=str(tmp_path), quiet=True, checkpoint_every=0)
        first = Trainer(config, build_layout(config))
        session, other = ("client_session", "bad"), ("client_session", "struck-once")
        first.guard.note(session, "#1 a")
        first.guard.note(other, "#2 b")
        for i in range(3):
            first.guard.tick()
            first.guard.strike(["#1 a"] + (["#2 b"] if i == 0 else []))
        first.save_checkpoint()
        await first.close(checkpoint=False)
        resumed_config = ServerConfig(tensorboard=False, logdir=str(tmp_path), quiet=True, checkpoint_every=0,
                                      resume=str(tmp_path / "checkpoint.pt"))
        resumed = Trainer(resumed_config, build_layout(resumed_config))
        with pytest.raises(MessageError) as info:
            resumed.guard.check(session, "#7 a new connection")
        assert info.value.code is ErrorCode.DATA_REFUSED
        resumed.guard.check(other, "#8 c")  # (one strike: not refused, and not kept)
        resumed.guard.check("c", "#1 a")  # (a connection's name means nothing after a restart)
        assert not resumed.guard.is_suspect(other, "#8 c") and resumed.metrics.clients_refused == 1
        assert resumed.guard.untold == 1  # (several ranks tell the others again: the checkpoint may precede that)
        await resumed.close(checkpoint=False)

    asyncio.run(run())


def test_restored_pool_items_keep_their_client_session_so_a_refusal_still_drops_them(tmp_path) -> None:
    """Pooled data keeps its batch's client_session in the checkpoint and the journal. A resumed run drops at
    once the restored data of a session its checkpoint refuses (another rank may have stored it before it
    learnt of the refusal), drops a session's restored data when it is refused later (another rank's word),
    and names restored data apart from its own connections (numbered from 1 again)."""
    def record(seed: int) -> list[MultiAgentRecord]:
        return [MultiAgentRecord(f"e{seed}", True, False, [AgentChunk("default_agent", "default_policy", 0, c)])
                for c in chunks(2, seed)]

    async def run() -> dict:
        config = ServerConfig(tensorboard=False, logdir=str(tmp_path), quiet=True, checkpoint_every=0,
                              train_batch_size=10_000, verify_action_logp=False,
                              observation_space={"type": "Box", "shape": [3], "low": -5, "high": 5},
                              action_space={"type": "Discrete", "n": 2})
        first = Trainer(config, build_layout(config))
        good, bad = ("client_session", "good"), ("client_session", "bad")
        await first.submit(good, record(1), {}, False, source="#1 g", batch=BatchId("good", 1))
        await first.submit(bad, record(2), {}, False, source="#2 b", batch=BatchId("bad", 1))
        for _ in range(3):  # refused, its pooled data not dropped yet (as when another rank tells it)
            first.guard.tick()
            first.guard.strike(["#2 b"])
        first.save_checkpoint()  # (the pool of both, and the refusal)
        await first.submit(good, record(3), {}, False, source="#1 g", batch=BatchId("good", 2))  # (journal only)
        await first.close(checkpoint=False)  # (a crash: no checkpoint at the end)
        resumed_config = replace(config, resume=str(tmp_path / "checkpoint.pt"))
        resumed = Trainer(resumed_config, build_layout(resumed_config))
        out = {"sessions": sorted(p.client_session for p in resumed.pool.items()),
               "sources": {p.source for p in resumed.pool.items()},
               "isolated": resumed.metrics.agent_steps_isolated}
        resumed.guard.adopt({"refused": [(good, 3)]})  # (another rank's word, as LockstepLearnerLoop adopts it)
        out["after_refusal"] = resumed.guard.drop_refused(resumed.pool)  # (as LockstepLearnerLoop drops them)
        resumed.guard.check(("client_session", "new"), "#1 g")  # this run's connection #1 is not the old one
        await resumed.close(checkpoint=False)
        return out

    out = asyncio.run(run())
    assert out["sessions"] == ["good"] * 4, out  # two of the checkpoint's pool, two replayed from the journal
    assert out["isolated"] == 8 and out["after_refusal"] == 16, out
    assert out["sources"] == {"replayed #1 g"}, out


def test_a_refusal_and_a_strike_find_pooled_data_by_its_session_once_its_connection_is_forgotten() -> None:
    """The guard remembers a bounded number of connections; pooled data keeps its client_session, so a
    refusal still finds data of a connection it forgot (or a restart renamed), and a strike against such
    data counts against its session."""
    from tether.server.data_guard import DataGuard

    guard = DataGuard(max_names=2)
    guard.note(("client_session", "s"), "#1 a")
    for i in range(2, 6):  # (newer connections push "#1 a" out)
        guard.note(("client_session", f"other{i}"), f"#{i} b")
    guard.adopt({"refused": [(("client_session", "s"), 3)]})
    assert not guard.is_refused("#1 a") and guard.is_refused("#1 a", "s")
    assert not guard.is_refused("replayed #1 a", None) and guard.is_refused("replayed #1 a", "s")
    for _ in range(3):
        guard.tick()
        guard.strike(["replayed #7 c"], {"replayed #7 c": "t"})
    with pytest.raises(MessageError):  # refused by its session, on any connection
        guard.check(("client_session", "t"), "#9 a new connection")


def test_a_source_first_in_the_pool_and_non_finite_on_its_own_is_blamed_not_its_neighbours() -> None:
    """Rewards just under the screen's limit (their value targets pass it; two of them in one
    minibatch overflow the value loss), in the first message of the pool: the halving ends on
    that source with nothing known to be clean; the others train without it, so it is blamed
    and they are trained on (before: nothing trained, no one blamed, every time it went first)."""
    evil = [("evil", c) for c in chunks(20, seed=100, steps=1, reward=1.5e19)]
    honest = interleave(("h1", chunks(40, seed=1)), ("h2", chunks(40, seed=2)), ("h3", chunks(40, seed=3)))
    out = update_isolating(learner(), evil + honest)
    assert out.stats is not None and sorted(out.kept) == ["h1", "h2", "h3"] and list(out.guilty) == ["evil"]
    assert out.trials <= trial_budget(4)


def test_a_neighbour_of_near_overflowing_steps_is_never_blamed() -> None:
    """Two steps whose value targets pass the screen (1.5e19) overflow the value loss only when
    they share a minibatch; which steps do changes with each trial's batch. The bisection can
    then end on an honest client whose data merely joined the set. Blame needs the client's own
    data to train non-finitely: honest clients are never blamed (before: an honest client was
    blamed in 9 of 60 such mixes; 30 mixes all pass that by chance with odds under 1%)."""
    blamed = []
    for seed in range(30):
        rng = np.random.default_rng(seed)
        groups = {"evil": chunks(30, seed=1000 + seed) + chunks(2, seed=2000 + seed, steps=1, reward=1.5e19)}
        for h in range(5):
            groups[f"h{h}"] = chunks(30, seed=10 * h + seed)
        order = list(groups)
        rng.shuffle(order)
        l = PPOLearner(box(-5, 5, (3,)), Discrete(2), PPOHyperparams(minibatch_size=32, num_epochs=4), seed=seed)
        out = update_isolating(l, [(s, c) for s in order for c in groups[s]])
        assert out.trials <= trial_budget(6)
        blamed += [(seed, s) for s in out.guilty if s != "evil"]
    assert blamed == []
