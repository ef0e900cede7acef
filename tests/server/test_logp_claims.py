"""What a batch claims about the model that produced it cannot smuggle poison
past the behaviour-logp check: a claim of a version that is not served yet is
not checked, so it is not trained on even if that version is published while
the batch waits for room; a raw Box sample no served model can have drawn is
refused even when its reported logp is exact."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from tether.protocol import FrameDecoder, decode_message, encode_frame
from tether.protocol.errors import ErrorCode, MessageError
from tether.protocol.multi_agent import DEFAULT_AGENT_ID, AgentChunk, MultiAgentRecord
from tether.protocol.episodes import EpisodeChunk
from tether.protocol.spaces import Discrete, box
from tether.server.config import ServerConfig
from tether.server.learner import PPOHyperparams, PPOLearner
from tether.server.ingest.logp_check import PolicyHistory, _logp, check_behaviour_logp
from tether.server.module_setup import build_layout
from tether.server.transport.tcp import TetherServer
from tether.server.trainer import Trainer

BATCH = 64


def episode(eid: str, n: int, model, logp: float | None = None) -> dict:
    rng = np.random.default_rng(sum(map(ord, eid)))
    obs = (rng.normal(size=(n + 1, 4)) * 0.05).astype(np.float32)
    actions = rng.integers(0, 2, n)
    lp = _logp(model, obs[:-1], actions) if logp is None else np.full(n, logp)
    return {"episode_id": eid, "obs": obs.tolist(), "actions": actions.tolist(), "rewards": [1.0] * n,
            "action_logp": lp.tolist(), "is_terminated": True, "is_truncated": False}


async def request(conn, message: dict, answer: bool = True) -> dict | None:
    reader, writer = conn
    writer.write(encode_frame(message))
    await writer.drain()
    if not answer:
        return None
    decoder = FrameDecoder()
    while True:
        for body in decoder.feed(await reader.read(1 << 20)):
            return decode_message(body)[1]


async def future_claim_run(tmp_path) -> dict:
    config = ServerConfig(port=0, train_batch_size=BATCH, tensorboard=False, quiet=True, logdir=str(tmp_path),
                          checkpoint_every=0, force_on_policy=False, env_steps_per_sample=16,
                          max_staleness=2)  # so that all of b's data is stored and fills the pool
    trainer = Trainer(config, build_layout(config, None))
    update = trainer.learner_loop.train

    def slow_update(by_module):  # an update long enough for the pool to fill meanwhile
        time.sleep(1.0)
        return update(by_module)

    trainer.learner_loop.train = slow_update  # type: ignore[method-assign]
    server = TetherServer(trainer)
    await server.start()
    model0 = trainer.histories[trainer.default_module].model(0)
    a, b, p = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(3)]
    for conn in (a, b, p):
        await request(conn, {"type": "PING", "protocol_version": "1.3"})
    await request(a, {"type": "EPISODES", "episodes": [episode("a1", BATCH, model0)], "weights_seq_no": 0}, False)
    await asyncio.sleep(0.3)  # the update v0 -> v1 runs
    await request(b, {"type": "EPISODES", "episodes": [episode("b1", 2 * BATCH, model0)], "weights_seq_no": 0}, False)
    await asyncio.sleep(0.2)  # the pool is full: the next sender waits for room
    poison = {"type": "EPISODES_AND_GET_STATE", "episodes": [episode("p1", 8, model0, -1000.0)], "weights_seq_no": 1}
    answer = await asyncio.wait_for(request(p, poison), 20)
    await asyncio.sleep(0.5)
    pooled_min = min((float(x.chunk.action_logp.min()) for x in trainer.pool._items), default=0.0)
    out = {"answer": answer["type"], "pooled_logp_min": pooled_min, "version": trainer.weights_seq_no,
           "stale": trainer.metrics.samples_dropped_stale + trainer.metrics.samples_refused_stale}
    await server.stop()
    await trainer.close(checkpoint=False)
    return out


def test_a_claim_of_a_version_not_served_yet_is_never_trained_on(tmp_path) -> None:
    out = asyncio.run(future_claim_run(tmp_path))
    assert out["version"] >= 1, "the update published v1 while the claim waited"
    assert out["pooled_logp_min"] > -100, f"the unchecked poison reached the pool: {out}"
    assert out["stale"] >= 8, out


def box_record(actions: np.ndarray, obs: np.ndarray, logp: np.ndarray) -> MultiAgentRecord:
    chunk = EpisodeChunk(obs=obs, actions=actions, rewards=np.zeros(len(actions), np.float32), action_logp=logp,
                         action_dist_inputs=None, is_terminated=True, is_truncated=False)
    return MultiAgentRecord("e", True, False, [AgentChunk(DEFAULT_AGENT_ID, "m", 0, chunk)])


@pytest.mark.parametrize("far", [1e3, 1e6, 1e18])
def test_a_box_sample_no_model_can_draw_is_refused_even_with_its_exact_logp(far: float) -> None:
    learner = PPOLearner(box(-5, 5, (3,)), box(-2, 2, (1,)), PPOHyperparams(), seed=0)
    history = PolicyHistory(2)
    history.add(0, learner.export_onnx(), learner.action_space)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(11, 3)).astype(np.float32)
    actions = rng.normal(size=(10, 1)).astype(np.float32)
    check_behaviour_logp([box_record(actions, obs, _logp(learner.model, obs[:-1], actions).astype(np.float32))],
                         {"m": 0}, {"m": history})  # ordinary samples pass
    actions[3] = far
    exact = _logp(learner.model, obs[:-1], actions).astype(np.float32)
    with pytest.raises(MessageError) as info:
        check_behaviour_logp([box_record(actions, obs, exact)], {"m": 0}, {"m": history})
    assert info.value.code is ErrorCode.ACTION_LOGP_MISMATCH and "actions[3]" in info.value.message


def test_discrete_modules_are_not_subject_to_the_box_rule() -> None:
    learner = PPOLearner(box(-5, 5, (3,)), Discrete(2), PPOHyperparams(), seed=0)
    history = PolicyHistory(1)
    history.add(0, learner.export_onnx(), learner.action_space)
    obs = np.zeros((4, 3), np.float32)
    actions = np.array([0, 1, 1])
    check_behaviour_logp([box_record(actions, obs, _logp(learner.model, obs[:-1], actions).astype(np.float32))],
                         {"m": 0}, {"m": history})


async def send_one_record(tmp_path, name: str, logp: float | None, runs: list | None,
                          claimed: int) -> tuple[dict, list, int]:
    """One 8-step record (v0's log-probabilities, or ``logp`` for every step) with these
    ``weights_seq_no_runs``, sent to a fresh server in a message claiming version ``claimed``.
    Returns the answer, the pooled items and the count of steps refused as stale."""
    config = ServerConfig(port=0, train_batch_size=BATCH, tensorboard=False, quiet=True, logdir=str(tmp_path),
                          checkpoint_every=0, force_on_policy=False, env_steps_per_sample=16)
    trainer = Trainer(config, build_layout(config, None))
    server = TetherServer(trainer)
    await server.start()
    model0 = trainer.histories[trainer.default_module].model(0)
    conn = await asyncio.open_connection("127.0.0.1", server.port)
    await request(conn, {"type": "PING", "protocol_version": "1.3"})
    record = episode(name, 8, model0, logp)
    if runs is not None:
        record["weights_seq_no_runs"] = runs
    answer = await request(conn, {"type": "EPISODES_AND_GET_STATE", "episodes": [record], "weights_seq_no": claimed})
    pooled = list(trainer.pool._items)
    await server.stop()
    await trainer.close(checkpoint=False)
    return answer, pooled, trainer.metrics.samples_refused_stale


async def runs_claim_run(tmp_path, runs: list | None) -> tuple[list, list[float], int]:
    # A logp no served model can produce, in a message claiming a version never served.
    answer, pooled, refused = await send_one_record(tmp_path, "p1", -1000.0, runs, claimed=7)
    return [answer["type"], answer.get("code")], [float(x.chunk.action_logp.min()) for x in pooled], refused


@pytest.mark.parametrize("runs", [[[0, 8]], [[0, 4], [7, 4]]], ids=["kept_version", "kept_and_unserved"])
def test_per_step_versions_cannot_smuggle_steps_past_an_unchecked_claim(tmp_path, runs) -> None:
    """The message claims version 7 (never served: the check would skip the module) while its runs
    name version 0: the steps are stored by their own versions, so they are checked by them."""
    answer, pooled, _ = asyncio.run(runs_claim_run(tmp_path, runs))
    assert answer == ["ERROR", "ACTION_LOGP_MISMATCH"] and pooled == [], (answer, pooled)


def test_steps_of_a_version_not_served_are_refused_not_trained(tmp_path) -> None:
    """Honest logps of v0, but the runs name v7 (never served) for the last four steps: those are
    refused, the first four stored."""

    _, pooled, refused = asyncio.run(send_one_record(tmp_path, "h1", None, [[0, 4], [7, 4]], claimed=0))
    sizes = [x.chunk.env_steps for x in pooled]
    assert sizes == [4] and refused == 4
