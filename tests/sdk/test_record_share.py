"""Holding clients back (§13.2): the client records each new training episode with the
probability the server's last record_share gives, plays held-back episodes without
sending them, counts them, and still sends a batch every env_steps_per_sample steps
played (empty if need be), whose answer brings the share again."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tether.sdk import MultiAgentClient, TetherClient

from .scripted_server import ScriptedConnection, ScriptedServer, constant_model, single_agent_config, state

DISCRETE2 = {"type": "Discrete", "n": 2}
BOX3 = {"type": "Box", "shape": [3], "low": -10.0, "high": 10.0}
STEPS = 10  # env_steps_per_sample
JSON_NULL = object()  # a member sent as null (None leaves it out)


def share_server(shares: Callable[[int], Any], multi_agent: bool = False,
                 every: Callable[[int], Any] = lambda n: None) -> ScriptedServer:
    """Answers the n-th batch (n = 0, 1, ...) with record_share shares(n) and steps_per_batch every(n)
    (no member when it returns None); n = -1 is the handshake's SET_STATE."""
    model = constant_model(3, [0.0, 0.0])

    def answer(n: int) -> dict:
        if multi_agent:
            out: dict[str, Any] = {"type": "SET_STATE", "models": {}}
        else:
            out = {"type": "SET_STATE", "weights_seq_no": 0}
        return {**out, **members(n)}

    def members(n: int) -> dict:
        out = {}
        if shares(n) is not None:
            out["record_share"] = shares(n)
        if every(n) is not None:
            out["steps_per_batch"] = None if every(n) is JSON_NULL else every(n)
        return out

    def handler(conn: ScriptedConnection) -> None:
        if multi_agent:
            names = {"onnx_input_names": ["obs"], "onnx_output_names": ["action_dist_inputs"]}
            config = {"type": "SET_CONFIG", "env_steps_per_sample": STEPS, "force_on_policy": True,
                      "modules": {"solo": {"observation_space": BOX3, "action_space": DISCRETE2, **names}},
                      "policy_mapping": [{"pattern": "*", "module": "solo"}]}
            first = {"type": "SET_STATE", "models": {"solo": {"weights_seq_no": 0,
                                                               "onnx_file": state(0, model)["onnx_file"]}}}
        else:
            config, first = single_agent_config(3, DISCRETE2, env_steps_per_sample=STEPS), state(0, model)
        first = {**first, **members(-1)}
        conn.handshake(config, first)
        n = 0
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "EPISODES_AND_GET_STATE":
                conn.send(answer(n))
                n += 1

    return ScriptedServer(handler)


def play_single(client: TetherClient, episodes: int, length: int = 5) -> int:
    played = 0
    for _ in range(episodes):
        eid = client.start_episode()
        for t in range(length):
            client.get_action(eid, np.full(3, t, np.float32))
            client.log_returns(eid, 1.0)
            played += 1
        client.end_episode(eid, np.zeros(3, np.float32))
    return played


def sent_steps(server: ScriptedServer) -> int:
    total = 0
    for b in server.messages("EPISODES_AND_GET_STATE"):
        for r in b["episodes"]:
            total += sum(len(e["actions"]) for e in r["agents"].values()) if "agents" in r else len(r["actions"])
    return total


def test_a_quarter_of_the_episodes_are_recorded_and_the_rest_counted() -> None:
    with share_server(lambda n: 0.25) as server:
        client = TetherClient("127.0.0.1", server.port, seed=1, wait_for_weights=True)
        played = play_single(client, 400)
        client.flush()
        held = client.episodes_held_back
        client.close()
        sent = sent_steps(server)
    recorded = 400 - held
    assert 60 <= recorded <= 140, recorded
    assert sent == 5 * recorded and played == 2000


def test_invalid_shares_are_ignored_and_an_absent_one_means_every_episode() -> None:
    # The handshake sets 0.5; the first eight answers carry invalid values (kept at 0.5); later ones
    # carry no member (1: record every episode).
    invalid = ["0.5", True, 0, 1.5, float("nan"), -0.25, None, [0.5]]

    def shares(n: int) -> Any:
        if n < 0:
            return 0.5
        return invalid[n] if n < len(invalid) and invalid[n] is not None else (0.5 if n < len(invalid) else None)

    with share_server(shares) as server:
        client = TetherClient("127.0.0.1", server.port, seed=2, wait_for_weights=True)
        play_single(client, 15, length=2)  # 30 steps played: about 3 batches answered with invalid values
        assert 1 <= len(server.messages("EPISODES_AND_GET_STATE")) < len(invalid)
        assert client.record_share == 0.5 and client.episodes_held_back > 0
        play_single(client, 60, length=2)  # past the eighth answer: the share is 1 again
        assert client.record_share == 1.0
        before = client.episodes_held_back
        play_single(client, 40, length=2)
        client.flush()
        client.close()
    assert client.episodes_held_back == before, "with the share back at 1 every episode is recorded"


def test_with_everything_held_back_empty_batches_keep_the_cadence() -> None:
    """A share of 1e-9 until the 5th answer: batches go out every 10 steps played, with no records; the
    answer without record_share makes the next episodes recorded again."""
    with share_server(lambda n: 1e-9 if n < 5 else None) as server:
        client = TetherClient("127.0.0.1", server.port, seed=3, wait_for_weights=True)
        play_single(client, 10, length=5)  # 50 steps played, all held back: 5 empty batches
        batches = server.messages("EPISODES_AND_GET_STATE")
        assert len(batches) >= 4 and all(b["episodes"] == [] for b in batches[:4])
        assert client.episodes_held_back == 10
        play_single(client, 10, length=5)
        client.flush()
        client.close()
        # Until the answer to the sixth batch (after 60 steps played) the share is still 1e-9.
        assert client.episodes_held_back <= 13
        assert sent_steps(server) == 5 * (20 - client.episodes_held_back) >= 35


def test_steps_per_batch_sets_the_cadence_until_an_answer_without_it() -> None:
    """Everything held back: the handshake asks for 4 steps per batch, so batches go every 4 steps
    played; answers with invalid values (kept at 4), one above env_steps_per_sample (counts as 10),
    then answers without the member (env_steps_per_sample, 10, again)."""
    values = [4, True, 0, 2.5, "3", -1, JSON_NULL, 50, None]  # (the member is left out for None)

    def every(n: int) -> Any:
        return values[n + 1] if n + 1 < len(values) else None

    with share_server(lambda n: 1e-9, every=every) as server:
        client = TetherClient("127.0.0.1", server.port, seed=5, wait_for_weights=True)
        assert client.steps_per_batch == 4
        sends_at: list[int] = []
        played = 0
        eid = client.start_episode()
        for t in range(80):
            before = len(server.messages("EPISODES_AND_GET_STATE"))
            client.get_action(eid, np.full(3, t % 7, np.float32))
            played += 1
            if len(server.messages("EPISODES_AND_GET_STATE")) > before:
                sends_at.append(played - 1)  # the cut comes before the step that makes it due is acted
        client.close()
    gaps = [b - a for a, b in zip([0, *sends_at], sends_at)]
    # Seven batches of 4 (the handshake's 4, then six answers with invalid values, null among them),
    # then 10 from the answer with 50 (clamped) on, and 10 with no member.
    assert gaps[:7] == [4] * 7, gaps
    assert gaps[7:] and set(gaps[7:]) == {10}, gaps
    assert client.episodes_held_back == 1


def test_multi_agent_holds_back_whole_episodes() -> None:
    with share_server(lambda n: 0.25, multi_agent=True) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=4, wait_for_weights=True)
        for _ in range(300):
            eid = client.start_episode()
            for t in range(3):
                client.get_action(eid, {"a": np.full(3, t, np.float32), "b": np.full(3, -t, np.float32)})
                client.log_returns(eid, {"a": 1.0, "b": 1.0})
            client.end_episode(eid)
        client.flush()
        held = client.episodes_held_back
        client.close()
        batches = server.messages("EPISODES_AND_GET_STATE")
    recorded = 300 - held
    assert 40 <= recorded <= 110, recorded
    # Whole episodes: every record has both agents' 3 steps.
    records = [r for b in batches for r in b["episodes"] if r["agents"]]
    assert sum(len(e["actions"]) for r in records for e in r["agents"].values()) == 6 * recorded


def test_multi_agent_batches_follow_steps_per_batch_in_agent_steps_played() -> None:
    """Two agents, everything held back, steps_per_batch 4 until the third answer, then none
    (env_steps_per_sample, 10): a batch every 2 frames, then every 5."""
    with share_server(lambda n: 1e-9, multi_agent=True, every=lambda n: 4 if n < 2 else None) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=6, wait_for_weights=True)
        assert client.steps_per_batch == 4
        sends_at: list[int] = []
        eid = client.start_episode()
        for frame in range(30):
            before = len(server.messages("EPISODES_AND_GET_STATE"))
            client.get_action(eid, {"a": np.full(3, frame % 5, np.float32), "b": np.zeros(3, np.float32)})
            if len(server.messages("EPISODES_AND_GET_STATE")) > before:
                sends_at.append(frame)
        assert client.steps_per_batch == STEPS
        client.close()
    gaps = [b - a for a, b in zip([0, *sends_at], sends_at)]
    assert gaps[:3] == [2, 2, 2] and set(gaps[3:]) == {5}, gaps


def test_multi_agent_cuts_before_taking_the_frames_observations() -> None:
    """docs/parity.md, one behaviour in every SDK: the cadence is checked before a frame's observations
    are taken, so the actors about to act still hold back their latest step. Two agents, 10 agent
    steps per batch (every episode recorded): after five frames 10 steps are pending but two are held
    back, so the sixth frame cuts nothing; the seventh cuts 10 steps (frames 0-4 of both agents)."""
    with share_server(lambda n: None, multi_agent=True) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=7, wait_for_weights=True)
        eid = client.start_episode()
        sent_at: list[int] = []
        for frame in range(8):
            before = len(server.messages("EPISODES_AND_GET_STATE"))
            client.get_action(eid, {"a": np.full(3, frame, np.float32), "b": np.full(3, -frame, np.float32)})
            if len(server.messages("EPISODES_AND_GET_STATE")) > before:
                sent_at.append(frame)
        batches = server.messages("EPISODES_AND_GET_STATE")
        client.close()
    assert sent_at[:1] == [6], sent_at
    entries = batches[0]["episodes"][0]["agents"]
    assert {a: len(e["actions"]) for a, e in entries.items()} == {"a": 5, "b": 5}
    assert entries["a"]["obs"][-1] == [5.0, 5.0, 5.0], "frame 6's observation is not in the cut"
