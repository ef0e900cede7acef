"""Schedules of the learning rate and the entropy coefficient (server/learner/schedule.py): "linear"
decays the configured value toward 0 at max_env_steps, from the env steps received before the data
each update trains on (on several ranks the group's sums, so that every rank steps alike); the
configured value stays the base that the console changes and checkpoints keep."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from tether.protocol import EpisodeChunk
from tether.protocol.multi_agent import AgentChunk, MultiAgentRecord
from tether.protocol.spaces import space_from_json
from tether.server.config import ServerConfig
from tether.server.learner import PPOHyperparams, PPOLearner
from tether.server.module_setup import build_layout
from tether.server.trainer import Trainer

from . import gloo_ranks

BOX = {"type": "Box", "shape": [4], "low": -1, "high": 1}
TWO = {"type": "Discrete", "n": 2}
TIMEOUT_S = 8.0


def chunk(steps: int, seed: int) -> EpisodeChunk:
    rng = np.random.default_rng(seed)
    return EpisodeChunk(rng.normal(scale=0.5, size=(steps + 1, 4)).astype(np.float32), rng.integers(2, size=steps),
                        rng.normal(size=steps).astype(np.float32), np.full(steps, -0.69, np.float32), None, True, False,
                        f"e{seed}")


def weights_digest(learner: PPOLearner) -> str:
    digest = hashlib.sha256()
    for name, value in sorted(learner.model.state_dict().items()):
        digest.update(name.encode() + value.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def test_schedules_are_named_and_a_linear_one_needs_a_budget() -> None:
    modules = {"a": {"observation_space": BOX, "action_space": TWO},
               "b": {"observation_space": BOX, "action_space": TWO, "lr_schedule": "linear"}}
    mapping = [{"pattern": "*", "module": "a"}]
    with pytest.raises(ValueError, match="module 'b': lr_schedule = 'linear' decays to 0 at max_env_steps, which is not set"):
        build_layout(ServerConfig(modules=modules, policy_mapping=mapping))
    with pytest.raises(ValueError, match="^ent_coef_schedule must be one of constant, linear, not 'cosine'"):
        build_layout(ServerConfig(ent_coef_schedule="cosine", max_env_steps=1000))
    with pytest.raises(ValueError, match="max_env_steps must be >= 1"):
        ServerConfig(max_env_steps=0, lr_schedule="linear")
    with pytest.raises(ValueError, match="lr_schedule 'cosine'"):
        PPOLearner(space_from_json(BOX), space_from_json(TWO), PPOHyperparams(lr_schedule="cosine"))
    layout = build_layout(ServerConfig(modules=modules, policy_mapping=mapping, max_env_steps=1000))
    assert layout.hyperparams["a"].lr_schedule == "constant" and layout.hyperparams["b"].lr_schedule == "linear"


def test_a_learner_trains_with_its_values_after_their_schedules() -> None:
    spaces = space_from_json(BOX), space_from_json(TWO)
    batch_of = lambda learner: learner.batch_of([chunk(256, 1)])  # noqa: E731
    hp = PPOHyperparams(lr=1e-3, ent_coef=0.1, lr_schedule="linear", ent_coef_schedule="linear", minibatch_size=64,
                        num_epochs=1)
    learner = PPOLearner(*spaces, hp, seed=0)
    learner.set_run_left(0.25)
    stats = learner.update(batch_of(learner))
    assert stats["lr"] == pytest.approx(2.5e-4) and stats["ent_coef"] == pytest.approx(0.025), stats
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(2.5e-4)  # (full minibatches: the whole value)
    # At the end of the run the learning rate is 0: an update moves no weight.
    learner.set_run_left(0.0)
    before = weights_digest(learner)
    assert learner.update(batch_of(learner))["lr"] == 0.0 and weights_digest(learner) == before
    # Constant schedules ignore how much of the run is left.
    constant = PPOLearner(*spaces, PPOHyperparams(lr=1e-3, ent_coef=0.1), seed=0)
    constant.set_run_left(0.25)
    assert constant.lr_now() == 1e-3 and constant.ent_coef_now() == 0.1
    assert "lr" not in constant.update(batch_of(constant))


@pytest.mark.parametrize("scheduled", ["lr", "ent_coef"])
def test_a_decayed_value_trains_exactly_as_that_value_held_constant(scheduled: str) -> None:
    # Half the run left: a linear lr of 2e-3 (or entropy coefficient of 0.2) makes the very weights a
    # constant 1e-3 (0.1) makes, from the same seed and data; the other value is the same in both.
    spaces = space_from_json(BOX), space_from_json(TWO)
    common = dict(minibatch_size=64, num_epochs=2, lr=1e-3, ent_coef=0.1)
    decayed = PPOLearner(*spaces, PPOHyperparams(**{**common, scheduled: common[scheduled] * 2,
                                                    f"{scheduled}_schedule": "linear"}), seed=3)
    held = PPOLearner(*spaces, PPOHyperparams(**common), seed=3)
    other = PPOLearner(*spaces, PPOHyperparams(**{**common, scheduled: common[scheduled] * 2}), seed=3)
    decayed.set_run_left(0.5)
    for learner in (decayed, held, other):
        learner.update(learner.batch_of([chunk(256, 4)]))
    assert weights_digest(decayed) == weights_digest(held)
    assert weights_digest(other) != weights_digest(held)  # (the value does move the weights)


def test_the_pool_counts_agent_steps_and_the_budget_env_steps() -> None:
    from tether.server.learner.schedule import env_steps_before, run_left

    # Two agents act in each env step: 64 pooled agent steps are 32 env steps of the 100 received.
    assert env_steps_before(100, 200, 64) == 68.0
    # Turns (one agent of two acts) or snapshots whose steps are not pooled: one env step per agent step.
    assert env_steps_before(100, 100, 64) == 36.0
    assert env_steps_before(0, 0, 0) == 0.0 and run_left(68.0, 100) == pytest.approx(0.32)
    assert run_left(150, 100) == 0.0 and run_left(10, None) == 1.0


def test_bases_pinned_for_an_update_hold_whatever_the_console_sets_meanwhile() -> None:
    # (several ranks: rank 0 hands every rank its bases as an update starts; a set_lr on rank 0 while the
    # update runs must not reach rank 0's part of it alone)
    learner = PPOLearner(space_from_json(BOX), space_from_json(TWO),
                         PPOHyperparams(lr=1e-3, ent_coef=0.1, lr_schedule="linear"), seed=0)
    learner.set_run_left(0.5)
    learner.pinned_bases = (1e-3, 0.1)
    learner.set_lr(4e-3)
    learner.set_ent_coef(0.3)
    assert learner.lr_now() == pytest.approx(0.5e-3) and learner.ent_coef_now() == 0.1
    learner.pinned_bases = None
    assert learner.lr_now() == pytest.approx(2e-3) and learner.ent_coef_now() == 0.3


def record(steps: int, seed: int) -> MultiAgentRecord:
    return MultiAgentRecord(f"ep{seed}", True, False, [AgentChunk("x", "m", 0, chunk(steps, seed))])


def schedule_config(logdir: Path) -> ServerConfig:
    return ServerConfig(modules={"m": {"observation_space": BOX, "action_space": TWO}},
                        policy_mapping=[{"pattern": "*", "module": "m"}], logdir=str(logdir), tensorboard=False,
                        seed=7, device="cpu", train_batch_size=64, minibatch_size=32, num_epochs=1,
                        env_steps_per_sample=16, checkpoint_every=0, verify_action_logp=False, quiet=True,
                        lr=1e-3, lr_schedule="linear", ent_coef=0.02, ent_coef_schedule="linear", max_env_steps=256)


def test_a_lone_server_decays_from_the_env_steps_received_and_the_console_sets_the_base(tmp_path: Path) -> None:
    async def run() -> dict:
        trainer = Trainer(schedule_config(tmp_path), build_layout(schedule_config(tmp_path)))
        learner = trainer.modules["m"].learner
        await trainer.submit("c", [record(64, 1)], {"m": 0}, False, env_steps=64, source="#1 c")
        await trainer.learner_loop.between_updates()
        first = dict(trainer.metrics.module_updates["m"])
        trainer.set_learning_rate("m", 2e-3)  # (the console's set_lr: the base, decayed as the run goes)
        await trainer.submit("c", [record(64, 2)], {"m": 1}, False, env_steps=64, source="#1 c")
        await trainer.learner_loop.between_updates()
        second = dict(trainer.metrics.module_updates["m"])
        out = {"first": first, "second": second, "base": learner.hp.lr, "now": learner.lr_now(),
               "versions": trainer.modules["m"].weights_seq_no}
        # The last update trains on the data that reaches the budget: at a batch's share of the run, not 0.
        for seed in (3, 4):
            await trainer.submit("c", [record(64, seed)], {"m": trainer.modules["m"].weights_seq_no}, False,
                                 env_steps=64, source="#1 c")
            await trainer.learner_loop.between_updates()
        out["last"] = dict(trainer.metrics.module_updates["m"])
        await trainer.close(checkpoint=False)
        return out

    out = asyncio.run(run())
    assert out["versions"] == 2, out
    # None of the 256 env steps were received before the first update's data: the whole run left; 64 before
    # the second's (3/4 left), whose base the console set to 2e-3.
    assert out["first"]["lr"] == pytest.approx(1e-3) and out["first"]["ent_coef"] == pytest.approx(0.02), out
    assert out["second"]["lr"] == pytest.approx(0.75 * 2e-3) and out["base"] == 2e-3, out
    assert out["now"] == pytest.approx(1.5e-3), out
    assert out["last"]["lr"] == pytest.approx(0.25 * 2e-3) and out["last"]["ent_coef"] == pytest.approx(0.005), out


def scheduling_rank(rank: int, port: int, out: str) -> None:
    """Rank 0 receives 48 env steps and rank 1 16, then 16 and 48: the second update trains with the
    group's share of the run left before its data (1 - 64/256) on both, and leaves both with the same
    weights."""
    from tether.server.distributed.rank_group import RankGroup, RankPlace

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    group = RankGroup(RankPlace(rank=rank, world_size=2, local_rank=rank), torch.device("cpu"), TIMEOUT_S)
    cfg = schedule_config(Path(out) / f"r{rank}")
    trainer = Trainer(cfg, build_layout(cfg), group=group)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        trainer.start()
        for version, steps in ((1, 48 if rank == 0 else 16), (2, 16 if rank == 0 else 48)):
            await trainer.submit("c", [record(steps, 10 * version + rank)], {"m": version - 1}, False,
                                 env_steps=steps, source=f"#1 r{rank}")
            deadline = loop.time() + 30
            while trainer.modules["m"].weights_seq_no < version and loop.time() < deadline:
                await asyncio.sleep(0.02)
        learner = trainer.modules["m"].learner
        report = {"version": trainer.modules["m"].weights_seq_no, "left": learner.run_left,
                  "stats": dict(trainer.metrics.module_updates.get("m", {})), "digest": weights_digest(learner)}
        await gloo_ranks.stop_together(trainer, rank, out, report)

    asyncio.run(run())
    group.close()


def test_ranks_with_uneven_data_train_with_the_groups_schedule_and_stay_identical(tmp_path: Path) -> None:
    gloo_ranks.run_two_ranks(scheduling_rank, tmp_path)
    first, second = gloo_ranks.reports(tmp_path)
    for report in (first, second):
        assert report["version"] == 2 and report["left"] == 0.75, report
        assert report["stats"]["lr"] == pytest.approx(0.75e-3), report
    assert first["digest"] == second["digest"], "the ranks' weights differ"
