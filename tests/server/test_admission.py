"""Admission (§13.2): the trainer stores only the steps an update will train within
max_staleness, judged per step when a record names each step's version
(``weights_seq_no_runs``); it refuses the rest and counts them."""

from __future__ import annotations

import asyncio

import numpy as np

from tether.protocol import EpisodeChunk
from tether.protocol.multi_agent import AgentChunk, MultiAgentRecord
from tether.server.config import ServerConfig
from tether.server.module_setup import build_layout
from tether.server.trainer import Trainer


def record(first_id: int, steps: int, step_versions: list[int] | None = None) -> list[MultiAgentRecord]:
    obs = np.zeros((steps + 1, 4), np.float32)
    obs[:, 0] = first_id + np.arange(steps + 1)
    chunk = EpisodeChunk(obs, np.arange(steps) % 2, np.ones(steps, np.float32), np.full(steps, -0.69, np.float32),
                         None, False, False, f"e{first_id}",
                         step_versions=None if step_versions is None else np.array(step_versions, np.int64))
    return [MultiAgentRecord(chunk.episode_id, False, False, [AgentChunk("default_agent", "default_policy", 0, chunk)])]


def trainer_at(tmp_path, version: int, **kw) -> Trainer:
    config = ServerConfig(tensorboard=False, logdir=str(tmp_path), quiet=True, train_batch_size=100, num_epochs=1,
                          minibatch_size=50, verify_action_logp=False, checkpoint_every=0, **kw)
    trainer = Trainer(config, build_layout(config))
    trainer.pause()  # no update runs: what is pooled stays to be inspected
    trainer.modules["default_policy"].weights_seq_no = version
    return trainer


def pooled_ids(trainer: Trainer) -> list[int]:
    return [int(i) for p in trainer.pool.items() for i in p.chunk.obs[:-1, 0]]


def test_one_old_held_back_step_is_refused_alone_not_its_chunk(tmp_path) -> None:
    """Module at v5, max_staleness 1. The message claims v3 (its oldest step); by the claim all ten steps
    are two versions old. The runs say only the first step is: nine are stored, one refused."""
    async def run() -> tuple[int, int, list[int], list[int]]:
        by_claim = trainer_at(tmp_path / "claim", 5)
        refused_by_claim = await by_claim.submit("c", record(0, 10), {"default_policy": 3}, False)
        per_step = trainer_at(tmp_path / "steps", 5)
        refused = await per_step.submit("c", record(0, 10, [3] + [4] * 9), {"default_policy": 3}, False)
        out = refused_by_claim, refused, pooled_ids(by_claim), pooled_ids(per_step)
        assert per_step.metrics.samples_refused_stale == 1 and per_step.metrics.samples_dropped_stale == 0
        for t in (by_claim, per_step):
            await t.close(checkpoint=False)
        return out

    refused_by_claim, refused, by_claim_ids, per_step_ids = asyncio.run(run())
    assert refused_by_claim == 10 and by_claim_ids == []
    assert refused == 1 and per_step_ids == list(range(1, 10))  # starts at the second step's observation


def test_the_pool_takes_what_the_next_updates_train_in_time_and_refuses_the_rest(tmp_path) -> None:
    """Empty pool, updates of 100, max_staleness 1, fresh data: the next update trains 100 steps at
    staleness 0 and the one after 100 at staleness 1; steps beyond would be 2 versions old."""
    async def run() -> tuple[list[int], list[int]]:
        trainer = trainer_at(tmp_path, 0)
        refused = [await trainer.submit("c", record(i * 1000, 90), {"default_policy": 0}, False) for i in range(3)]
        sizes = [p.chunk.env_steps for p in trainer.pool.items()]
        await trainer.close(checkpoint=False)
        return refused, sizes

    refused, sizes = asyncio.run(run())
    assert refused == [0, 0, 70] and sizes == [90, 90, 20]


def test_with_several_ranks_every_earlier_update_counts_as_training_the_module() -> None:
    """A lone server knows which updates train a module (its pool is the whole batch); a rank knows only
    its own share of each: another rank's share of the update before may hold the module's steps, so a
    fresh step of module b behind a whole update of module a is one version staler by the time it is
    trained. With max_staleness 0 a lone server stores it and a rank refuses it."""
    from tether.server.sample_pool import Admission, Pooled, SamplePool

    pool = SamplePool(100, 300)
    obs = np.zeros((101, 4), np.float32)
    pool.add(Pooled("a", EpisodeChunk(obs, np.zeros(100, np.int64), np.zeros(100, np.float32),
                                      np.zeros(100, np.float32), None, False, False), 0))
    fresh = np.zeros(10, np.int64)  # (ten steps acted with the version served now)
    assert Admission(pool, set()).fresh_parts("b", fresh, 0) == [(0, 10)]
    assert Admission(pool, set(), shared_updates=True).fresh_parts("b", fresh, 0) == []
    # Its own module's next update is foreseen alike (every update of a's steps trains a).
    assert Admission(pool, set(), shared_updates=True).fresh_parts("a", fresh, 1) == [(0, 10)]
