"""Publishing an update that fails part way (a log line to a closed stderr, say).

Two real ranks (gloo on loopback, two processes, each a whole Trainer with its lockstep loop) where
it fails on rank 1 alone: that rank cannot follow the others' versions nor their stop-rule
judgements, so it stops with a message naming the failure, and rank 0, left waiting in the next
agreement, stops within the group's timeout. Neither goes on training alone, and neither hangs.
A lone server says so and trains on; nothing waits for good on the update that failed."""

from __future__ import annotations

import asyncio
import os
import pickle
from pathlib import Path

import numpy as np
import torch

from . import gloo_ranks

BOX = {"type": "Box", "shape": [2], "low": -1, "high": 1}
TWO = {"type": "Discrete", "n": 2}
TIMEOUT_S = 8.0


def config(logdir: Path):
    from tether.server.config import ServerConfig

    return ServerConfig(modules={"m": {"observation_space": BOX, "action_space": TWO}},
                        policy_mapping=[{"pattern": "*", "module": "m"}], logdir=str(logdir),
                        tensorboard=False, seed=7, device="cpu", train_batch_size=64, env_steps_per_sample=16,
                        stop_at_return=100.0)


def fill(trainer, rng: np.random.Generator, source: str) -> None:
    """Four chunks of 16 agent steps into the trainer's pool (a batch: train_batch_size is 64)."""
    from tether.protocol.episodes import EpisodeChunk
    from tether.server.sample_pool import Pooled

    for _ in range(4):
        chunk = EpisodeChunk(rng.normal(size=(17, 2)).astype(np.float32), rng.integers(0, 2, 16),
                             rng.normal(size=16).astype(np.float32), np.full(16, -0.69, np.float32), None,
                             True, False)
        trainer.pool.add(Pooled("m", chunk, trainer.modules["m"].weights_seq_no, source=source))


def failing_rank(rank: int, port: int, out: str) -> None:
    from tether.server.distributed.rank_group import RankGroup, RankPlace
    from tether.server.module_setup import build_layout
    from tether.server.trainer import Trainer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    group = RankGroup(RankPlace(rank=rank, world_size=2, local_rank=rank), torch.device("cpu"), TIMEOUT_S)
    cfg = config(Path(out) / f"r{rank}")
    trainer = Trainer(cfg, build_layout(cfg), group=group)
    rng = np.random.default_rng(rank)
    report: dict = {}

    async def run() -> None:
        loop = trainer.learner_loop
        if rank == 1:
            def publish_fails(*args, **kwargs):
                raise OSError("stderr is gone")
            loop._publish = publish_fails
        fill(trainer, rng, f"c{rank}")  # (128 agent steps in the group)
        trainer.start()
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(trainer.stop_requested.wait(), 60)
        report.update(reason=trainer.stop_reason, failure=loop.failure, updates=trainer.metrics.updates,
                      seconds=asyncio.get_running_loop().time() - started)
        (Path(out) / f"rank-{rank}.pkl").write_bytes(pickle.dumps(report))
        await trainer.close(checkpoint=False)  # (returns: nothing waits on the update that failed)

    asyncio.run(run())
    group.close()


def test_a_rank_whose_publishing_fails_stops_and_the_group_with_it(tmp_path: Path) -> None:
    gloo_ranks.run_two_ranks(failing_rank, tmp_path)
    first, second = (pickle.loads((tmp_path / f"rank-{r}.pkl").read_bytes()) for r in (0, 1))
    assert second["reason"] == "rank_failed" and "publishing an update failed" in second["failure"], second
    assert "stderr is gone" in second["failure"] and second["updates"] == 0
    # Rank 0 published that update, then found no rank 1 at the next agreement: it stops too, in bounded time.
    assert first["reason"] == "rank_failed" and first["updates"] == 1, first
    assert first["seconds"] < TIMEOUT_S * 4, first


def test_a_lone_server_whose_publishing_fails_frees_its_waiters_and_trains_on(tmp_path: Path, capfd) -> None:
    from tether.server.module_setup import build_layout
    from tether.protocol.onnx_codec import encode_onnx
    from tether.server.trainer import Trainer

    cfg = config(tmp_path)
    trainer = Trainer(cfg, build_layout(cfg))
    rng = np.random.default_rng(0)

    async def run() -> None:
        loop = trainer.learner_loop
        publish, calls = loop._publish, []

        def fails_once(*args):
            calls.append(1)
            if len(calls) == 1:
                raise OSError("stderr is gone")
            return publish(*args)

        loop._publish = fails_once
        fill(trainer, rng, "c")
        loop.maybe_start()
        await asyncio.wait_for(loop.published(), 30)  # (a client waiting for the next version is let go)
        await asyncio.wait_for(loop.between_updates(), 30)
        assert trainer.metrics.updates == 0
        # The update trained: its weights are served (a checkpoint of the version served holds them).
        runtime = next(iter(trainer.modules.values()))
        assert runtime.weights_seq_no == 1
        assert runtime.onnx_field == encode_onnx(runtime.learner.export_onnx())
        fill(trainer, rng, "c")
        loop.maybe_start()
        await asyncio.wait_for(loop.published(), 30)
        await asyncio.wait_for(trainer.close(checkpoint=False), 30)
        assert len(calls) == 2 and trainer.metrics.updates == 1 and runtime.weights_seq_no == 2

    asyncio.run(run())
    assert "publishing an update failed: OSError('stderr is gone')" in capfd.readouterr().err


def test_a_lone_server_serves_every_module_it_trained_when_publishing_fails_after_the_first(tmp_path: Path) -> None:
    """Two modules: publishing fails after module a is served and before b is (and, a later update, before
    any is, right after a good one). Each trained module ends served as its learner's weights, its version
    kept for the behaviour-logp check, whatever had been published before the failure."""
    from tether.protocol.onnx_codec import encode_onnx
    from tether.protocol.episodes import EpisodeChunk
    from tether.server.config import ServerConfig
    from tether.server.module_setup import build_layout
    from tether.server.sample_pool import Pooled
    from tether.server.trainer import Trainer

    cfg = ServerConfig(modules={"a": {"observation_space": BOX, "action_space": TWO},
                                "b": {"observation_space": BOX, "action_space": TWO}},
                       policy_mapping=[{"pattern": "a*", "module": "a"}, {"pattern": "*", "module": "b"}],
                       logdir=str(tmp_path), tensorboard=False, seed=7, device="cpu", train_batch_size=64,
                       env_steps_per_sample=16)
    trainer = Trainer(cfg, build_layout(cfg))
    rng = np.random.default_rng(0)

    def fill_both() -> None:
        for module_id in ("a", "b", "a", "b"):
            chunk = EpisodeChunk(rng.normal(size=(17, 2)).astype(np.float32), rng.integers(0, 2, 16),
                                 rng.normal(size=16).astype(np.float32), np.full(16, -0.69, np.float32), None,
                                 True, False)
            trainer.pool.add(Pooled(module_id, chunk, trainer.modules[module_id].weights_seq_no, source="c"))

    def served_as_trained(version: int) -> None:
        for module_id, runtime in trainer.modules.items():
            assert runtime.weights_seq_no == version, module_id
            assert runtime.onnx_field == encode_onnx(runtime.learner.export_onnx()), module_id
            assert version in trainer.histories[module_id].versions, module_id

    async def run() -> None:
        loop = trainer.learner_loop
        runtime_b = trainer.modules["b"]
        publish_b = runtime_b.publish
        calls: list[int] = []

        def b_fails_once(onnx_field: str) -> None:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("a bug after module a was served")
            publish_b(onnx_field)

        runtime_b.publish = b_fails_once
        fill_both()
        loop.maybe_start()
        await asyncio.wait_for(loop.published(), 30)
        await asyncio.wait_for(loop.between_updates(), 30)
        served_as_trained(1)
        fill_both()
        loop.maybe_start()
        await asyncio.wait_for(loop.published(), 30)
        await asyncio.wait_for(loop.between_updates(), 30)
        served_as_trained(2)
        assert trainer.metrics.updates == 1  # (the failed one's counts are lost, not its weights)
        # A failure before anything of the next update is published, right after a good one.
        tick = loop.guard.tick
        loop.guard.tick = lambda: (_ for _ in ()).throw(RuntimeError("a bug before publishing"))
        fill_both()
        loop.maybe_start()
        await asyncio.wait_for(loop.published(), 30)
        await asyncio.wait_for(loop.between_updates(), 30)
        loop.guard.tick = tick
        served_as_trained(3)
        assert trainer.metrics.weights_seq_no == 3
        await asyncio.wait_for(trainer.close(checkpoint=False), 30)

    asyncio.run(run())


def test_a_log_line_to_a_closed_stream_is_lost_and_nothing_else() -> None:
    import io

    from tether.server.say import say

    closed = io.StringIO()
    closed.close()
    say("[tether] a line", closed)  # (a closed stream: ValueError, ignored)
    open_stream = io.StringIO()
    say("[tether] a line", open_stream)
    assert open_stream.getvalue() == "[tether] a line\n"


def on_policy_rank(rank: int, port: int, out: str) -> None:
    """One rank of a force_on_policy group: each rank stores half the group's batch; rank 0's client waits
    for the update its batch completes (as EPISODES_AND_GET_STATE does) and notes the version it gets."""
    import dataclasses

    from tether.protocol.episodes import EpisodeChunk
    from tether.protocol.multi_agent import AgentChunk, MultiAgentRecord
    from tether.server.distributed.rank_group import RankGroup, RankPlace
    from tether.server.module_setup import build_layout
    from tether.server.trainer import Trainer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    group = RankGroup(RankPlace(rank=rank, world_size=2, local_rank=rank), torch.device("cpu"), TIMEOUT_S)
    cfg = dataclasses.replace(config(Path(out) / f"r{rank}"), force_on_policy=True, max_staleness=0,
                              stop_at_return=None)
    trainer = Trainer(cfg, build_layout(cfg), group=group)
    rng = np.random.default_rng(rank)
    report: dict = {}

    async def run() -> None:
        trainer.start()
        chunk = EpisodeChunk(rng.normal(size=(33, 2)).astype(np.float32), rng.integers(0, 2, 32),
                             rng.normal(size=32).astype(np.float32), np.full(32, -0.69, np.float32), None, True, False,
                             f"e{rank}")
        record = MultiAgentRecord(chunk.episode_id, True, False, [AgentChunk("default_agent", "m", 0, chunk)])
        module = trainer.modules["m"]
        if rank == 1:
            await trainer.submit("c1", [record], {"m": 0}, False, env_steps=32)
        else:
            await asyncio.sleep(0.5)  # (rank 1's half is in its pool: rank 0's completes the group's batch)
            await asyncio.wait_for(trainer.submit("c0", [record], {"m": 0}, True, env_steps=32), 30)
            report["version_answered"] = module.weights_seq_no
            trainer.request_stop("signal")
        await asyncio.wait_for(trainer.stop_requested.wait(), 30)
        report["version_at_end"] = module.weights_seq_no
        (Path(out) / f"rank-{rank}.pkl").write_bytes(pickle.dumps(report))
        await trainer.close(checkpoint=False)

    asyncio.run(run())
    group.close()


def test_an_on_policy_client_of_a_group_waits_for_the_update_its_batch_completes(tmp_path: Path) -> None:
    """force_on_policy with several ranks: the update starts at the ranks' next agreement, not when the
    batch is stored; the client that completed the group's batch is answered with the weights it trained."""
    gloo_ranks.run_two_ranks(on_policy_rank, tmp_path)
    first, second = (pickle.loads((tmp_path / f"rank-{r}.pkl").read_bytes()) for r in (0, 1))
    assert first["version_answered"] == 1, first
    assert first["version_at_end"] == second["version_at_end"] == 1, (first, second)


def two_module_rank(rank: int, port: int, out: str) -> None:
    """Rank 0 pools a whole batch of module a and then steps of module b, rank 1 a few steps of a: the
    group's update trains a alone, so admission must not count b as updating (its fresh data would be
    refused as one version too stale)."""
    import dataclasses

    from tether.protocol.episodes import EpisodeChunk
    from tether.server.distributed.rank_group import RankGroup, RankPlace
    from tether.server.module_setup import build_layout
    from tether.server.sample_pool import Pooled
    from tether.server.trainer import Trainer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    group = RankGroup(RankPlace(rank=rank, world_size=2, local_rank=rank), torch.device("cpu"), TIMEOUT_S)
    cfg = dataclasses.replace(config(Path(out) / f"r{rank}"), stop_at_return=None,
                              modules={m: {"observation_space": BOX, "action_space": TWO} for m in ("a", "b")},
                              policy_mapping=[{"pattern": "b*", "module": "b"}, {"pattern": "*", "module": "a"}])
    trainer = Trainer(cfg, build_layout(cfg), group=group)
    rng = np.random.default_rng(rank)
    report: dict = {}

    def pool(module_id: str, chunks: int) -> None:
        for _ in range(chunks):
            chunk = EpisodeChunk(rng.normal(size=(17, 2)).astype(np.float32), rng.integers(0, 2, 16),
                                 rng.normal(size=16).astype(np.float32), np.full(16, -0.69, np.float32), None,
                                 True, False)
            trainer.pool.add(Pooled(module_id, chunk, 0, source=f"c{rank}"))

    async def run() -> None:
        loop = trainer.learner_loop
        train = loop.train

        def noting(by_module):
            results = train(by_module)
            report["taken"] = sorted(m for m, items in by_module.items() if items)
            report["updating"] = sorted(loop.training_modules)  # (what admission reads until it publishes)
            return results

        loop.train = noting
        if rank == 0:
            pool("a", 4)  # (train_batch_size: 64 agent steps)
            pool("b", 2)
        else:
            pool("a", 1)
        trainer.start()
        deadline = asyncio.get_running_loop().time() + 60
        while trainer.metrics.updates < 1 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        report["versions"] = {m: rt.weights_seq_no for m, rt in trainer.modules.items()}
        report["pooled"] = trainer.pool.steps
        await gloo_ranks.stop_together(trainer, rank, out, report)

    asyncio.run(run())
    group.close()


def test_admission_counts_as_updating_only_the_modules_the_group_takes(tmp_path: Path) -> None:
    gloo_ranks.run_two_ranks(two_module_rank, tmp_path)
    first, second = gloo_ranks.reports(tmp_path)
    assert first["taken"] == ["a"] and first["pooled"] == 32, first  # (b's steps wait for a later update)
    for report in (first, second):
        assert report["versions"] == {"a": 1, "b": 0}, report
        assert report["updating"] == ["a"], report
