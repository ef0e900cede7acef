"""A reconnect whose SET_CONFIG describes a module with other spaces (or other
value_obs_agents), or no longer describes it (§6.5): every SDK drops that
module's steps recorded under the old config and not cut yet (they would cost
their whole batch at the server), resets its model when its spaces changed or
it is gone (NotReadyError until a new one arrives), keeps the other modules'
models and steps, and goes on with the episodes: an agent's next chunk starts
from its next observation, with the same start_step. The single-agent client
does the same for its spaces. The scenarios are those of the C++ SDK's
sdk_cpp/tests/test_multi_agent_reconnect.cpp and of the C# SDK's
sdk_csharp/Tests/ReconnectNewSpacesTests.cs."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import numpy as np
import pytest

from tether.sdk import MultiAgentClient, NotReadyError, TetherClient
from tether.protocol.episodes import decode_episode
from tether.protocol.multi_agent import ModuleSpec, decode_multi_agent_record
from tether.protocol.spaces import space_from_json

from .scripted_server import ScriptedConnection, ScriptedServer, constant_model, play_steps, single_agent_config, state

DISCRETE2 = {"type": "Discrete", "n": 2}
NAMES = {"onnx_input_names": ["obs"], "onnx_output_names": ["action_dist_inputs"]}


def box(width: int) -> dict[str, Any]:
    return {"type": "Box", "shape": [width], "low": -10.0, "high": 10.0}


def module_json(width: int, action: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"observation_space": box(width), "action_space": action or DISCRETE2, **NAMES, "trainable": True}


def config(n_width: int) -> dict[str, Any]:
    """Modules m (agents a_*, 2 values) and n (agents b_*, ``n_width`` values)."""
    return {"type": "SET_CONFIG", "env_steps_per_sample": 10, "force_on_policy": True, "protocol_version": "1.3",
            "heartbeat_interval_s": 0, "modules": {"m": module_json(2), "n": module_json(n_width)},
            "policy_mapping": [{"pattern": "a_*", "module": "m"}, {"pattern": "b_*", "module": "n"}]}


def models(cfg: dict[str, Any], ids: tuple[str, ...], seq: int = 0) -> dict[str, Any]:
    """SET_STATE with a model of each module in ``ids``, of the width ``cfg`` gives it (action 1 nearly always)."""
    out = {}
    for module_id in ids:
        spec = ModuleSpec.from_json(module_id, cfg["modules"][module_id])
        k = spec.action_space.flat_dim * 2  # (Discrete(2): 2 logits; MultiDiscrete([2, 2]): 4)
        out[module_id] = {"weights_seq_no": seq,
                          "onnx_file": state(seq, constant_model(spec.obs_dim, [-5.0, 5.0] * (k // 2)))["onnx_file"]}
    return {"type": "SET_STATE", "models": out}


def reconnecting_server(first: dict[str, Any], second: dict[str, Any],
                        later_models: Callable[[int], dict[str, Any]] | None = None) -> ScriptedServer:
    """The first connection (``first``, every model) loses the first batch with it, unanswered; the
    next ones (``second``) send no model in their handshake, and answer the n-th batch they get with
    ``later_models(n)`` (no model without it)."""

    def handler(conn: ScriptedConnection) -> None:
        if conn.index == 0:
            conn.handshake(first, models(first, tuple(first["modules"])))
        else:
            conn.handshake(second, {"type": "SET_STATE", "models": {}})
        answered = 0
        while (message := conn.receive(timeout=None)) is not None:
            kind = message["type"]
            if kind == "EPISODES_AND_GET_STATE":
                if conn.index == 0:
                    return  # lost with its connection: the client sends it again on the next one
                answered += 1
                conn.send(later_models(answered) if later_models else {"type": "SET_STATE", "models": {}})
            elif kind == "GET_STATE":
                conn.send({"type": "SET_STATE", "models": {}})
            elif kind == "PING":
                conn.send({"type": "PONG"})

    return ScriptedServer(handler)


def connect(server: ScriptedServer, wait_for_weights: bool = True) -> MultiAgentClient:
    return MultiAgentClient("127.0.0.1", server.port, seed=5, reconnect_timeout_s=5, response_timeout_s=5,
                            update_timeout_s=5, wait_for_weights=wait_for_weights, when_queue_full="wait")


def unique_batches(server: ScriptedServer) -> list[dict[str, Any]]:
    """Each batch once (a resend after the reconnect carries the same batch_seq and records)."""
    seen: set[int] = set()
    out = []
    for batch in server.messages("EPISODES_AND_GET_STATE"):
        if batch["batch_seq"] not in seen:
            seen.add(batch["batch_seq"])
            out.append(batch)
    return out


def check_fits(batches: list[dict[str, Any]], cfg: dict[str, Any]) -> None:
    """Every record cut after the reconnect (batch 1 was cut before it) fits the second config."""
    specs = {m: ModuleSpec.from_json(m, spec) for m, spec in cfg["modules"].items()}
    checked = 0
    for batch in batches:
        if batch["batch_seq"] == 1:
            continue
        for i, record in enumerate(batch["episodes"]):
            decode_multi_agent_record(record, i, specs, True)  # raises what the server would refuse
            checked += 1
    assert checked > 0


def steps_of(batches: list[dict[str, Any]], agent: str) -> int:
    return sum(len(r["agents"][agent]["actions"]) for b in batches for r in b["episodes"] if agent in r["agents"])


def frame(t: int, *agents: str, width: int = 2) -> dict[str, np.ndarray]:
    out = {}
    for agent in agents:
        row = np.zeros(width if agent.startswith("b_") else 2, np.float32)
        row[0], row[1] = t, 0.0 if agent.startswith("a_") else 1.0
        out[agent] = row
    return out


def test_modules_keep_their_models_until_the_new_connection_sends_others() -> None:
    with reconnecting_server(config(2), config(2)) as server:
        client = connect(server)
        eid = client.start_episode()
        for t in range(25):
            assert client.get_action(eid, frame(t, "a_0")) == {"a_0": 1}
        assert client.reconnects >= 1
        assert client.weights_seq_nos == {"m": 0, "n": 0}
        client.get_action(eid, frame(25, "b_0"))  # n too
        client.close()


def test_a_module_whose_spaces_changed_waits_for_a_new_model() -> None:
    with reconnecting_server(config(2), config(3)) as server:  # n now observes 3 values
        client = connect(server)
        eid = client.start_episode()
        for t in range(25):
            client.get_action(eid, frame(t, "a_0"))  # m is unchanged: it acts on
        assert client.reconnects >= 1
        assert client.weights_seq_nos == {"m": 0} and set(client.policies) == {"m"}
        with pytest.raises(NotReadyError, match="'n'"):
            client.get_action(eid, frame(25, "b_0", width=3))
        client.close()


def test_steps_of_a_module_whose_spaces_changed_are_dropped_and_its_agents_go_on_with_the_new_model() -> None:
    """b_0's held-back step (recorded with 2 values) is dropped at the reconnect; a_0 loses nothing;
    once n's new model comes, b_0 acts on 3 values in the same episode, start_step still 0."""
    second = config(3)
    with reconnecting_server(config(2), second, lambda n: models(second, ("n",)) if n >= 3 else
                             {"type": "SET_STATE", "models": {}}) as server:
        client = connect(server)
        eid = client.start_episode("changed")
        a_steps = b_steps = 0
        refused: list[int] = []
        for t in range(60):
            acting = ("a_0", "b_0") if not refused or "n" in client.policies else ("a_0",)
            try:
                client.get_action(eid, frame(t, *acting, width=2 if not refused else 3))
            except NotReadyError:  # the only error: n has no model until the new one comes
                assert not refused and client.reconnects >= 1
                refused.append(t)
                # Nothing of the frame was recorded; a_0's held-back step waits, b_0's old ones are gone.
                assert client._pending_steps == 1
                continue
            a_steps += 1
            b_steps += "b_0" in acting
            client.log_returns(eid, {a: 1.0 for a in acting})
        # (batch 1 is due once 10 steps are sendable: at the 7th frame, which then met the new config)
        assert refused == [6], "the frame that cut batch 1 met the new connection's config"
        assert len(server.connections) == 2
        assert "n" in client.policies, "the new model of n came"
        client.end_episode(eid)
        client.flush()
        client.close()
        batches = unique_batches(server)
    check_fits(batches, second)
    assert steps_of(batches, "a_0") == a_steps
    # b_0 recorded 6 steps before the reconnect: 5 went with batch 1, the held-back one was dropped.
    assert steps_of(batches[:1], "b_0") == 5
    assert steps_of(batches[1:], "b_0") == b_steps - 6 > 0
    for batch in batches:
        for record in batch["episodes"]:
            assert record["episode_id"] == "changed"
            for agent, entry in record["agents"].items():
                assert entry["start_step"] == 0, (agent, entry)
                if agent == "b_0" and batch["batch_seq"] > 1:
                    assert all(len(row) == 3 for row in entry["obs"])
                    assert all(row[1] == 1.0 and row[0] >= 7 for row in entry["obs"]), "b_0 starts again after the drop"


def test_a_finished_agent_of_a_module_whose_spaces_changed_is_dropped() -> None:
    """b_0 leaves just after a cut; the reconnect that changes n's spaces comes while its steps wait
    for the next cut (finished, not cut)."""
    release = threading.Event()
    second = config(3)

    def handler(conn: ScriptedConnection) -> None:
        if conn.index == 0:
            conn.handshake(config(2), models(config(2), ("m", "n")))
        else:
            conn.handshake(second, {"type": "SET_STATE", "models": {}})
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "EPISODES_AND_GET_STATE":
                if conn.index == 0:
                    release.wait(10)  # the connection is lost once b_0 has left
                    return
                conn.send({"type": "SET_STATE", "models": {}})

    with ScriptedServer(handler) as server:
        client = connect(server, wait_for_weights=False)
        eid = client.start_episode("fin")
        for t in range(7):
            client.get_action(eid, frame(t, "a_0", "b_0"))
        client.retire_agent(eid, "b_0", np.array([7.0, 1.0], np.float32))  # 2 steps not cut
        release.set()
        deadline = time.monotonic() + 5
        while client.reconnects == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.reconnects >= 1
        time.sleep(0.2)
        for t in range(7, 30):
            client.get_action(eid, frame(t, "a_0"))
        client.end_episode(eid)
        client.flush()
        client.close()
        batches = unique_batches(server)
    check_fits(batches, second)
    assert steps_of(batches, "a_0") == 30
    assert all("b_0" not in r["agents"] for b in batches[1:] for r in b["episodes"])


def test_steps_of_a_module_the_server_no_longer_describes_are_not_sent() -> None:
    second = config(2)
    del second["modules"]["n"]
    second["policy_mapping"] = [{"pattern": "a_*", "module": "m"}]
    with reconnecting_server(config(2), second) as server:
        client = connect(server)
        eid = client.start_episode("gone")
        refused = False
        a_steps = 0
        for t in range(30):
            try:
                client.get_action(eid, frame(t, "a_0", *(() if refused else ("b_0",))))
            except NotReadyError:  # module n has no model any more (nothing of the frame is recorded)
                assert not refused
                refused = True
                continue
            a_steps += 1
        assert refused
        assert "n" not in client.modules and "n" not in client.policies and "n" not in client.weights_seq_nos
        client.end_episode(eid, {"a_0": np.array([-1.0, 0.0], np.float32)})  # b_0 ends with its latest
        client.flush()
        client.close()
        batches = unique_batches(server)
    check_fits(batches, second)
    assert steps_of(batches, "a_0") == a_steps
    assert all("b_0" not in r["agents"] for b in batches[1:] for r in b["episodes"])


def act_until_refused(client: MultiAgentClient, eid: str, leaving: tuple[str, ...]) -> bool:
    """30 frames of a_0 and the ``leaving`` agents; once a frame is refused (their module's spaces
    changed on a reconnect), the leaving agents stop acting. Returns whether one was refused."""
    refused = False
    for t in range(30):
        try:
            client.get_action(eid, frame(t, "a_0", *(() if refused else leaving)))
        except NotReadyError:
            refused = True
    return refused


def test_an_episode_ends_after_a_modules_spaces_changed() -> None:
    """b_0 stopped acting with only an observation of the old size: end_episode without final
    observations still ends the episode (b_0 has nothing left to send)."""
    with reconnecting_server(config(2), config(3)) as server:
        client = connect(server)
        eid = client.start_episode("ends")
        assert act_until_refused(client, eid, ("b_0",))
        client.end_episode(eid)
        client.flush()
        client.close()
        check_fits(unique_batches(server), config(3))


def test_an_episode_with_a_group_ends_after_its_modules_spaces_changed() -> None:
    def group_config(member_width: int) -> dict[str, Any]:
        c = config(2)
        c["modules"]["n"] = module_json(2 * member_width, {"type": "MultiDiscrete", "nvec": [2, 2]})
        c["groups"] = {"g": {"members": ["b_0", "b_1"], "reward": "sum"}}
        c["policy_mapping"] = [{"pattern": "a_*", "module": "m"}, {"agent_id": "g", "module": "n"}]
        return c

    with reconnecting_server(group_config(2), group_config(3)) as server:
        client = connect(server)
        eid = client.start_episode("ends")
        assert act_until_refused(client, eid, ("b_0", "b_1"))
        client.end_episode(eid)
        client.flush()
        client.close()
        batches = unique_batches(server)
    check_fits(batches, group_config(3))
    assert all("g" not in r["agents"] for b in batches[1:] for r in b["episodes"])


@pytest.mark.parametrize("first_critic", [["a_0", "a_1"], ["a_0"]])
def test_critic_rows_after_a_reconnect_that_changes_the_critics_agents(first_critic: list[str]) -> None:
    """The critic's agents change on reconnect (the spaces do not): value_obs rows recorded for the
    old list are dropped, not sent laid out for the new one, and an agent that becomes a critic's
    agent is seen by it. Every critic row sent after the reconnect is a_1's observation of its frame."""
    def critic_config(critic: list[str]) -> dict[str, Any]:
        c = config(2)
        c["modules"]["m"]["value_obs_agents"] = critic
        return c

    with reconnecting_server(critic_config(first_critic), critic_config(["a_1"])) as server:
        client = connect(server)
        eid = client.start_episode("critic")
        for t in range(30):
            client.get_action(eid, {"a_0": np.array([t, 0.0], np.float32), "a_1": np.array([t, 1.0], np.float32)})
        assert client.reconnects >= 1
        assert client.weights_seq_nos["m"] == 0, "m's spaces did not change: it keeps its model"
        client.end_episode(eid)
        client.flush()
        client.close()
        batches = unique_batches(server)
    check_fits(batches, critic_config(["a_1"]))
    checked = 0
    for batch in batches[1:]:
        for record in batch["episodes"]:
            for entry in record["agents"].values():
                assert len(entry["value_obs"]) == len(entry["obs"])
                for obs, value_obs in zip(entry["obs"], entry["value_obs"]):
                    assert value_obs == [obs[0], 1.0]
                    checked += 1
    assert checked > 0


# -- the single-agent client ----------------------------------------------------

@pytest.mark.parametrize("model_in_handshake", [False, True])
def test_single_agent_steps_recorded_with_other_spaces_are_dropped_and_the_episode_goes_on(
        model_in_handshake: bool) -> None:
    """The second connection's server observes 4 values, not 3: the steps not cut yet (an open
    episode's, and all of an episode that ended meanwhile) are dropped, the old model is let go
    (NotReadyError until the new one), and the open episode's next chunk holds 4-value rows. An
    observation of the old size is refused (ValueError), recording nothing. The C# SDK's
    ReconnectNewSpacesTests plays the same (its handshake sends the model)."""
    release = threading.Event()
    first, second = single_agent_config(3, DISCRETE2, protocol_version="1.3"), single_agent_config(4, DISCRETE2)

    def handler(conn: ScriptedConnection) -> None:
        if conn.index == 0:
            conn.handshake(first, state(0, constant_model(3, [-5.0, 5.0])))
        else:
            conn.handshake(second, state(0, constant_model(4, [-5.0, 5.0]) if model_in_handshake else None))
        while (message := conn.receive(timeout=None)) is not None:
            kind = message["type"]
            if kind == "EPISODES_AND_GET_STATE":
                if conn.index == 0:
                    release.wait(10)  # the connection is lost once b has ended
                    return
                conn.send(state(0, None))
            elif kind == "GET_STATE":
                conn.send(state(1, constant_model(4, [-5.0, 5.0])))

    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, seed=5, reconnect_timeout_s=5, response_timeout_s=5,
                              update_timeout_s=5, wait_for_weights=False)
        a = client.start_episode("a")
        play_steps(client, a, range(12))  # the 11th cuts batch 1 (steps 0-9), lost with the connection
        b = client.start_episode("b")
        for t in range(3):
            client.get_action(b, np.full(3, t, np.float32))
        client.end_episode(b, np.zeros(3, np.float32))  # ended, its 3 steps not cut
        release.set()
        deadline = time.monotonic() + 5
        while client.reconnects == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        if model_in_handshake:
            with pytest.raises(ValueError, match="has 3 values"):
                client.get_action(a, np.full(3, 12, np.float32))
            assert client.policy is not None
        else:
            with pytest.raises(NotReadyError):
                client.get_action(a, np.full(4, 12, np.float32))
            assert client.policy is None
            client.refresh_weights()
        assert client._pending_steps == 0
        assert client.observation_space is not None and client.observation_space.flat_dim == 4
        play_steps(client, a, range(12, 30), width=4)
        assert client.end_episode(a, np.full(4, -1, np.float32)) == 30.0
        client.flush()
        client.close()
        batches = unique_batches(server)
    assert [r["episode_id"] for r in batches[0]["episodes"]] == ["a"] and len(batches[0]["episodes"][0]["actions"]) == 10
    obs_space, act_space = space_from_json(second["observation_space"]), space_from_json(DISCRETE2)
    later = [r for batch in batches[1:] for r in batch["episodes"]]
    for i, record in enumerate(later):
        assert record["episode_id"] == "a", "b's steps were dropped"
        decode_episode(record, i, obs_space, act_space, True)
    assert sum(len(r["actions"]) for r in later) == 18  # steps 12-29; 10 and 11 (3 values) were dropped
    assert later[0]["obs"][0][0] == 12.0 and later[-1]["is_terminated"]
