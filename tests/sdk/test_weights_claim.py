"""A batch claims the OLDEST weights version any of its steps was computed
with (protocol §7.6, §13.1), held-back steps included: the last step of every
other open episode, and of every agent that did not act this step, was
computed with the model before a swap and goes with the batch after it. A
record whose steps used several versions names each step's (1.3
``weights_seq_no_runs``, §10.1), so the server judges staleness per step; a
plain v1 server is never sent it. The server's count of steps refused as
stale (``steps_refused_stale`` in SET_STATE) adds up in the client."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from tether.sdk import MultiAgentClient, TetherClient

from .scripted_server import ScriptedConnection, ScriptedServer, constant_model, single_agent_config, state

DISCRETE2 = {"type": "Discrete", "n": 2}
BOX3 = {"type": "Box", "shape": [3], "low": -10.0, "high": 10.0}


def logit(version: int) -> float:
    """Model ``version`` has logits (logit(version), 0): its log-probabilities tell it apart."""
    return 0.3 * version


def model(version: int) -> bytes:
    return constant_model(3, [logit(version), 0.0])


def logp(version: int, action: int) -> float:
    logits = [logit(version), 0.0]
    return logits[action] - math.log(sum(math.exp(v) for v in logits))


def version_of(action: int, action_logp: float, served: int) -> int:
    """The served version whose model gives this step its log-probability."""
    matches = [v for v in range(served + 1) if abs(logp(v, action) - action_logp) < 1e-5]
    assert len(matches) == 1, f"step (action {action}, logp {action_logp}) matches versions {matches}"
    return matches[0]


def runs_of(versions: list[int]) -> list[list[int]] | None:
    """What a record names for steps of these versions: runs when they differ, else nothing."""
    if len(set(versions)) < 2:
        return None
    return [[v, len(list(steps))] for v, steps in itertools.groupby(versions)]


def play_two_episodes(client: TetherClient, frames: int, end: bool) -> None:
    """Two episodes in lockstep for ``frames`` frames (observation i in frame i, reward 1), ended
    with ``end``; then flush and close."""
    first, second = client.start_episode(), client.start_episode()
    for i in range(frames):
        for eid in (first, second):
            client.get_action(eid, np.full(3, i, np.float32))
            client.log_returns(eid, 1.0)
    if end:
        client.end_episode(first, np.zeros(3, np.float32))
        client.end_episode(second, np.zeros(3, np.float32))
    client.flush()
    client.close()


def new_model_every_batch(conn: ScriptedConnection, pong_version: str | None = "1.3") -> None:
    """Answers every batch with the next version and its (different) model."""
    conn.handshake(single_agent_config(3, DISCRETE2, env_steps_per_sample=7), state(0, model(0)), pong_version)
    version = 0
    while (message := conn.receive(timeout=None)) is not None:
        if message["type"] == "EPISODES_AND_GET_STATE":
            version += 1
            conn.send(state(version, model(version)))


def test_batches_claim_the_oldest_version_with_two_episodes_overlapping() -> None:
    with ScriptedServer(new_model_every_batch) as server:
        # wait_for_weights: every swap lands right after a cut, before the next action.
        client = TetherClient("127.0.0.1", server.port, seed=0, wait_for_weights=True)
        play_two_episodes(client, 60, end=True)
        batches = server.messages("EPISODES_AND_GET_STATE")
    assert len(batches) >= 10
    mixed = 0
    for served, batch in enumerate(batches):
        versions = {version_of(a, lp, served) for r in batch["episodes"] for a, lp in zip(r["actions"], r["action_logp"])}
        assert batch["weights_seq_no"] == min(versions), f"batch {served + 1} has steps of versions {versions}"
        mixed += len(versions) > 1
        for r in batch["episodes"]:
            steps = [version_of(a, lp, served) for a, lp in zip(r["actions"], r["action_logp"])]
            assert r.get("weights_seq_no_runs") == runs_of(steps), (served, steps, r.get("weights_seq_no_runs"))
    assert mixed >= 5, "held-back steps of the other episode went with the batch after a swap"
    assert sum("weights_seq_no_runs" in r for b in batches for r in b["episodes"]) >= 5


def test_a_plain_v1_server_is_sent_no_runs() -> None:
    with ScriptedServer(lambda conn: new_model_every_batch(conn, pong_version=None)) as server:
        client = TetherClient("127.0.0.1", server.port, seed=0, wait_for_weights=True)
        play_two_episodes(client, 40, end=False)
        batches = server.messages("EPISODES_AND_GET_STATE")
    assert len(batches) >= 5 and min(b["weights_seq_no"] for b in batches[1:]) >= 0
    mixed = sum(len({version_of(a, lp, served) for r in b["episodes"] for a, lp in zip(r["actions"], r["action_logp"])})
                > 1 for served, b in enumerate(batches))
    assert mixed >= 2, "batches with several versions were sent"
    assert not any("weights_seq_no_runs" in r for b in batches for r in b["episodes"])


def test_steps_refused_stale_add_up_and_anything_else_is_ignored() -> None:
    """The server's SET_STATE says how many steps it refused as stale; values that are not integers >= 1
    are ignored, never an error."""
    answers = iter([7, "3", True, 2.5, 0, -4, None, 5])

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(single_agent_config(3, DISCRETE2, env_steps_per_sample=4), state(0, model(0)))
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "EPISODES_AND_GET_STATE":
                answer = {"type": "SET_STATE", "weights_seq_no": 0}
                refused = next(answers, None)
                if refused is not None:
                    answer["steps_refused_stale"] = refused
                conn.send(answer)

    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, seed=0, wait_for_weights=True)
        eid = client.start_episode()
        for i in range(4 * 9):
            client.get_action(eid, np.full(3, i, np.float32))
            client.log_returns(eid, 1.0)
        client.flush()
        assert len(server.messages("EPISODES_AND_GET_STATE")) >= 8
        assert client.steps_refused_stale == 12
        client.close()


def multi_agent_server() -> ScriptedServer:
    names = {"onnx_input_names": ["obs"], "onnx_output_names": ["action_dist_inputs"]}
    config = {"type": "SET_CONFIG", "env_steps_per_sample": 5, "force_on_policy": True,
              "modules": {"solo": {"observation_space": BOX3, "action_space": DISCRETE2, **names}},
              "policy_mapping": [{"pattern": "*", "module": "solo"}]}

    def models(version: int) -> dict[str, Any]:
        return {"solo": {"weights_seq_no": version, "onnx_file": state(version, model(version))["onnx_file"]}}

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(config, {"type": "SET_STATE", "models": models(0)})
        version = 0
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "EPISODES_AND_GET_STATE":
                version += 1
                conn.send({"type": "SET_STATE", "models": models(version)})

    return ScriptedServer(handler)


def test_multi_agent_batches_claim_the_oldest_version_when_an_agent_skips_steps() -> None:
    with multi_agent_server() as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=0, wait_for_weights=True)
        eid = client.start_episode()
        for t in range(60):
            acting = ("fast", "slow") if t % 3 == 0 else ("fast",)  # "slow" acts every third step
            client.get_action(eid, {a: np.full(3, t, np.float32) for a in acting})
            client.log_returns(eid, {a: 1.0 for a in acting})
        client.end_episode(eid)
        client.flush()
        client.close()
        batches = server.messages("EPISODES_AND_GET_STATE")
    assert len(batches) >= 8
    mixed = 0
    for served, batch in enumerate(batches):
        versions = {version_of(a, lp, served) for r in batch["episodes"] for entry in r["agents"].values()
                    for a, lp in zip(entry["actions"], entry["action_logp"])}
        if not versions:
            continue
        assert batch["weights_seq_nos"]["solo"] == min(versions), f"batch {served + 1} has versions {versions}"
        mixed += len(versions) > 1
        for r in batch["episodes"]:
            for entry in r["agents"].values():
                steps = [version_of(a, lp, served) for a, lp in zip(entry["actions"], entry["action_logp"])]
                assert entry.get("weights_seq_no_runs") == runs_of(steps), (served, steps)
    assert mixed >= 3, "the slow agent's held-back steps went with batches after a swap"
    assert any("weights_seq_no_runs" in e for b in batches for r in b["episodes"] for e in r["agents"].values())


@pytest.mark.parametrize("next_version", [9, 0], ids=["newer_server", "restarted_from_scratch"])
def test_a_batch_resent_on_a_new_connection_carries_no_runs(next_version: int) -> None:
    """Versions learned on one connection may be another server run's on the next: a batch with runs
    that is lost with its connection is resent without them, its claim unchanged (§6.5, §10.1), also
    to a server restarted from scratch whose versions are below the claim."""
    def handler(conn: ScriptedConnection) -> None:
        if conn.index == 0:
            # (versions from 4 on: the lost batch's claim is one a server restarted from scratch has not reached)
            conn.handshake(single_agent_config(3, DISCRETE2, env_steps_per_sample=7), state(4, model(4)))
            version = 4
            while (message := conn.receive(timeout=None)) is not None:
                if message["type"] != "EPISODES_AND_GET_STATE":
                    continue
                if any("weights_seq_no_runs" in r for r in message["episodes"]):
                    return  # lost with its connection, unanswered: the client sends it again
                version += 1
                conn.send(state(version, model(version)))
        else:
            conn.handshake(single_agent_config(3, DISCRETE2, env_steps_per_sample=7),
                           state(next_version, model(next_version)))
            while (message := conn.receive(timeout=None)) is not None:
                if message["type"] == "EPISODES_AND_GET_STATE":
                    conn.send(state(next_version, None))

    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, seed=0, wait_for_weights=True, reconnect_timeout_s=10)
        play_two_episodes(client, 40, end=False)
        batches = server.messages("EPISODES_AND_GET_STATE")
    lost = next(b for b in batches if any("weights_seq_no_runs" in r for r in b["episodes"]))
    resent = [b for b in batches if b["batch_seq"] == lost["batch_seq"] and b is not lost]
    assert resent, "the lost batch was sent again"
    assert lost["weights_seq_no"] >= 4  # (a claim the restarted server has not reached)
    assert not any("weights_seq_no_runs" in r for r in resent[0]["episodes"])
    assert resent[0]["weights_seq_no"] == lost["weights_seq_no"] and resent[0]["episodes"] == [
        {k: v for k, v in r.items() if k != "weights_seq_no_runs"} for r in lost["episodes"]]
